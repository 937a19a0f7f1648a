"""What the ``cuda`` target runs: the direct-call copy of the program's GraphModule
(``fxwrap.runtime.direct``) whose first call gives the running thread a CUDA context, and in
which a view that only compiled Triton kernels read, and whose first element is its base's,
is not made (the launcher passes each tensor's data pointer, the same for both)::

    program.graph_module                                 what runs
    -                                                    ensure_thread_context = ...ensure_thread_context()
    buf7 = torch.as_strided(buf5, [2048, 1024], [1024, 1], 0)   -
    fxwrap_pointwise_3(buf7, arg2, buf8)                 fxwrap_pointwise_3(buf5, arg2, buf8)

A decode step makes ~10 such views a layer; each costs a tensor on the host (about 2 us).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fxwrap.runtime.direct import direct_graph_module
from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.launch import TritonLaunch
from fxwrap.targets.base import DirectCallWrapper
from fxwrap.targets.cuda_triton.cuda_driver import ensure_thread_context

torch.fx.node.has_side_effect(ensure_thread_context)


def reads_device_pointers(kernel: Kernel) -> bool:
    """``kernel``'s launcher reads only its tensors' data pointers: a Triton kernel this target
    compiled (``launcher.DriverLauncher``, or Triton's own launch, which reads the pointer and the
    dtype a view shares with its base), not an interpreted one nor a user's kernel."""
    launch = kernel.launch
    return kernel.target == "cuda" and isinstance(launch, TritonLaunch) and not launch.interpret


class CudaWrapper(DirectCallWrapper):
    """``DirectCallWrapper`` plus ``ensure_thread_context()`` before the first node (see
    ``cuda_driver.ensure_thread_context``: autograd's device threads start without a
    current CUDA context), and no views that only compiled kernels read (module docstring);
    ``free`` markers stay (a collective's buffers live to its wait)."""

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return direct_graph_module(gm, prologue=ensure_thread_context, pointer_kernel=reads_device_pointers,
                                   keep_free=True)
