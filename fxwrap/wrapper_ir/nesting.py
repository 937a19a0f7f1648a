"""What the code of control-flow ops and user-written Triton kernels asks of the lowerer: the
``NestedLowering`` protocol (``build_control_flow``, ``build_user_kernels``).

``torch.cond(pred, true_fn, false_fn, (x, y))`` is lowered through it as::

    lowerer.value(pred)                               buf0 (the predicate, in memory)
    lowerer.subgraph("true_graph_0")                  the branch's GraphModule
    lowerer.compile_nested(gm, "true_graph_0", ...)   its BuiltProgram (lowered and rendered)
    lowerer.foreign_buffer(fake)                      buf3 (a result: storage the op makes)
    lowerer.emit(Conditional(...)); lowerer.define(node, (buf3,))
"""
from __future__ import annotations

from typing import Any, Protocol

import sympy
import torch

from fxwrap.ir.lines import Buffer, Line
from fxwrap.runtime.provenance import Origin


class NestedLowering(Protocol):
    """The lowerer as nested programs and user kernels reach it (see the module docstring)."""

    target_name: str
    settings: Any  # lowered.LoweringSettings: the nested programs' reuse and wrapper passes

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        """A value for every size symbol the program uses so far."""

    def value(self, arg: Any) -> Any:
        """``arg`` as the program holds it (a node's value in memory)."""

    def value_of(self, node: torch.fx.Node) -> Any:
        """What ``node`` computed so far (a ``Buffer`` or a lazy value), or None."""

    def define(self, node: torch.fx.Node, value: Any) -> None:
        """``node``'s value is ``value`` from now on."""

    def emit(self, line: Line) -> None:
        """Put ``line`` in the program."""

    def subgraph(self, name: str) -> Any:
        """The graph module's attribute ``name`` (a control-flow op's subgraph)."""

    def compile_nested(self, gm: torch.fx.GraphModule, name: str, output_layouts: tuple) -> Any:
        """Subgraph ``gm`` lowered and rendered as this program is: its ``BuiltProgram``."""

    def assume_sizes(self, assumptions) -> None:
        """The program's kernels also rely on ``assumptions`` (``core.lowering.SizeAssumption``:
        a nested program's), which the input guard checks."""

    def foreign_buffer(self, fake: torch.Tensor) -> Buffer:
        """A new buffer whose storage an op makes (views of it read its real offset)."""

    def fresh_buffer_like(self, layout: Buffer) -> Buffer:
        """A new buffer of ``layout``'s size, dtype and device, dense."""

    def copy_into(self, dst: Buffer, src: Buffer, origin: Any = None) -> None:
        """``dst`` (new, unallocated) gets ``src``'s values."""

    def bind_layout(self, buf: Buffer) -> None:
        """Read symbols the program needs but has no value for off ``buf``'s layout."""

    def write_barrier(self, node: torch.fx.Node) -> None:
        """``node`` writes an existing buffer: realize every earlier value used after it."""

    def owns_storage(self, buf: Buffer) -> bool:
        """Whether ``buf`` is a whole storage of the program: not a view, not a constant."""

    def position(self, node: torch.fx.Node) -> int:
        """``node``'s place in the graph."""

    def origin_of(self, node: torch.fx.Node) -> Origin:
        """The provenance of ATen node ``node``."""

    def user_kernel_emitter(self) -> Any:
        """The target's ``KernelEmitter`` (it launches user Triton kernels), or None."""
