"""Precompiled functions on the GPU (the Triton target, fxwrap/programs/precompile.py): a process with
an empty cache directory loads a saved function (its cubins inside) and runs it with no
dynamo trace, no AOTAutograd and no lowering, with eager's numbers (the child:
tests/cpu/precompile_child.py)."""
from pathlib import Path

import pytest
import torch

from fxwrap.programs.precompile import has_aot_precompile
from shared_helpers import run_child

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(not has_aot_precompile(), reason=f"torch {torch.__version__}: torch.compile's "
                                 "result has no .aot_compile (torch's AOT precompile)")]

CHILD = Path(__file__).resolve().parents[1] / "cpu" / "precompile_child.py"


def child(cache_dir, *args) -> dict:
    return run_child(CHILD, cache_dir, *args, "--device", "cuda")


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_loaded_function_runs_with_no_trace_and_no_lowering(tmp_path, mode):
    path = tmp_path / "model.fxaot"
    made = child(tmp_path / "a", "save", path, mode, "--batch-norm")
    assert made["lowered"] and made["captured"] >= 1 and made["err"] < 1e-4, made
    loaded = child(tmp_path / "b", "load", path, mode, "--batch-norm")
    assert loaded["captured"] == 0 and loaded["aot"] == 0 and loaded["lowered"] == [], loaded
    assert loaded["stats"] == {} and loaded["loaded"] == 1, loaded
    assert loaded["err"] < 1e-4, loaded
