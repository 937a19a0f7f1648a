"""The thread/process stress of ``tests/cpu/test_thread_stress.py`` on a GPU: two processes of
eight threads, one cache folder, lower / torch.compile / load / run / backward, each against
eager.  A CUDA backward runs on the autograd engine's device thread, where the launcher once
segfaulted (issue 37).  ``FXWRAP_STRESS_RUNS=5`` repeats it (5 in a row asked on the GPU)."""
from __future__ import annotations

import os

import pytest
import torch

from fxwrap.testing.stress import run_processes

RUNS = int(os.environ.get("FXWRAP_STRESS_RUNS", "1"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the cpu version runs in tests/cpu)")
@pytest.mark.parametrize("run", range(RUNS))
def test_two_processes_of_eight_threads_share_one_cache_on_cuda(tmp_path, run):
    failures = run_processes("cuda", str(tmp_path / "cache"))
    assert not failures, "\n\n".join(failures)
