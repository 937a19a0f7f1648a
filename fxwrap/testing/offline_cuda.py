"""Whole programs as the ``cuda`` target renders them, without a GPU.

``offline_programs(fn, *inputs)`` compiles ``fn`` for a target named ``cuda-offline`` whose
tensors are CPU tensors and whose emitter is the Triton emitter with the GPU's planner (no
interpreter, no autotuning: the first config of each kernel, as the GPU's heuristics give it)
and no kernel loading: nothing is compiled by Triton and nothing runs.  The programs (forward
or inference) are returned; their ``DefineKernel`` lines carry each kernel's source and launch
config::

    (program,) = offline_programs(lambda x, y: F.silu(x) * y, a, b)
    [line.kernel.source for line in program.lines if type(line).__name__ == "DefineKernel"]

What differs from the GPU: ATen ops that dispatch by device (SDPA: the CPU flash kernel, not
CUDA's) and everything a GPU times (autotuned block sizes, the template choice in
``mode="max-autotune"``).  Kernels whose plan has one config (pointwise kernels) render as on
the GPU.
"""
from __future__ import annotations

import torch

from fxwrap.api import Backend
from fxwrap.programs.program import Program
from fxwrap.targets.base import DirectCallWrapper, Target
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from fxwrap.targets.host.device import CpuDevice


class _Compiled(Exception):
    """Raised from ``on_program`` once the first program is built: nothing runs."""


class OfflineTritonEmitter(TritonEmitter):
    """The Triton emitter with GPU plans whose kernels are never loaded: ``load(source)`` gives a
    launcher that refuses to run (``offline_programs`` stops before any call).  No compile
    workers: nothing is compiled."""

    compile_workers = 0

    def load(self, source):
        def not_runnable(*args):
            raise RuntimeError(f"kernel {source.launch.symbol} was rendered offline (target "
                               "cuda-offline): compile for target 'cuda' on a GPU to run it")
        return not_runnable


def offline_target() -> Target:
    """A ``Target`` whose kernels are rendered as ``cuda`` renders them (see the module doc)."""
    return Target("cuda-offline", "cpu", CpuDevice(), OfflineTritonEmitter, DirectCallWrapper,
                  options={"interpret": False, "autotune": False})


def offline_programs(fn, *inputs, options: dict | None = None, dynamic: bool | None = None) -> list[Program]:
    """The first program ``torch.compile(fn, dynamic=dynamic)`` builds for ``inputs`` on
    ``offline_target()`` (a list of one), compiled but never run; ``options``: more ``Backend``
    options."""
    programs: list[Program] = []

    def keep(program: Program) -> None:
        programs.append(program)
        raise _Compiled

    compiled = torch.compile(fn, backend=Backend(offline_target(), {**(options or {}), "on_program": keep}),
                             fullgraph=True, dynamic=dynamic)
    try:
        compiled(*inputs)
    except Exception as error:  # noqa: BLE001 - dynamo wraps the backend's exception
        if not programs:
            raise
        if not isinstance(error, _Compiled) and not isinstance(error.__cause__, _Compiled) \
                and "_Compiled" not in repr(error):
            raise
    finally:
        torch._dynamo.reset()
    return programs
