"""What the ``cuda`` target runs: the direct-call copy of the program's GraphModule
(``fxwrap.runtime.direct``) whose first call gives the running thread a CUDA context::

    def forward(self, arg0, arg1):
        ensure_thread_context = fxwrap_targets_cuda_triton_cuda_driver_ensure_thread_context()
        buf0 = torch.empty_strided([64, 64], [64, 1], dtype = torch.float32, device = device(type='cuda', index=0))
        mm_out = torch.mm(arg0, arg1, out = buf0)
        ...
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fxwrap.runtime.direct import direct_graph_module
from fxwrap.targets.base import DirectCallWrapper
from fxwrap.targets.cuda_triton.cuda_driver import ensure_thread_context

torch.fx.node.has_side_effect(ensure_thread_context)


class CudaWrapper(DirectCallWrapper):
    """``DirectCallWrapper`` plus ``ensure_thread_context()`` before the first node (see
    ``cuda_driver.ensure_thread_context``: autograd's device threads start without a
    current CUDA context)."""

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return direct_graph_module(gm, prologue=ensure_thread_context)
