"""What the ``cpu`` target runs: the direct-call copy of the program's GraphModule
(``fxwrap.runtime.direct``) with the host work a C++ kernel does not need left out.

A C++ kernel's launcher (``fxwrap.targets.host.loader``) hands the kernel each tensor's
``data_ptr()`` and nothing else, so a view only such kernels read, whose first element is
its base's, need not exist; ``free`` markers and checked allocations go too, and the
temporaries take ranges of one storage the program keeps (``fxwrap.runtime.arena``)::

    program.graph_module                                 what runs
    buf3 = torch.as_strided(arg6, [128, 128], [1, 128])  -
    buf4 = torch.empty_strided([1, 128], ...)            buf4 = empty_strided_cpu([1, 128], [128, 1], torch.float32)
    fxwrap_template_2(buf5, buf3, buf4)                  fxwrap_template_2(buf5, arg6, buf4)
    free = fxwrap_runtime_memory_free(buf4)              -
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fxwrap.runtime.arena import arena_graph_module
from fxwrap.runtime.direct import direct_graph_module
from fxwrap.runtime.kernel import Kernel
from fxwrap.targets.base import DirectCallWrapper

#: ``CppEmitter.language``, spelled here: a loaded program gets this wrapper and imports no emitter
CPP = "c++"


def reads_data_pointers(kernel: Kernel) -> bool:
    """``kernel``'s launcher reads only its tensors' data pointers: a C++ kernel of this target."""
    return kernel.target == "cpu" and kernel.launch.language == CPP


class CpuWrapper(DirectCallWrapper):
    """``DirectCallWrapper`` with ``pointer_kernel=reads_data_pointers`` (module docstring),
    its temporaries in an arena kept across calls (``fxwrap.runtime.arena``)."""

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return arena_graph_module(self.compile_graph_per_call(gm))

    def compile_graph_per_call(self, gm: torch.fx.GraphModule) -> Callable:
        return direct_graph_module(gm, pointer_kernel=reads_data_pointers)
