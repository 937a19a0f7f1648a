"""What a lowering rule's context may ask of the program builder: the ``RuleBuilder`` protocol.

A rule sees a ``core.lowering.LoweringContext``; the context's helpers that need more
than lazy values (``stored``, ``realized``, ``realized_output``, ``emit``,
``write_barrier``, ``store_into``) call the builder through these methods only, so the
kernel builder (``wrapper_ir.build_kernels.KernelBuilder``) may change behind them::

    ctx.stored(x)          -> builder.in_memory(ctx.node, x)     buf3
    ctx.realized(loops)    -> builder.realize(ctx.node, loops)   buf4 (a kernel job stores it)
    ctx.emit(line)         -> builder.emit(line)                 the line, before the node's kernels
    ctx.write_barrier()    -> builder.write_barrier(ctx.node)    earlier values read later realized first
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from fxwrap.ir.lines import Buffer, Line


class RuleBuilder(Protocol):
    """The program builder as a lowering rule reaches it (see the module docstring)."""

    def in_memory(self, node: torch.fx.Node, value: Any) -> Buffer | None:
        """The buffer holding ``value`` when it is the value of an argument node of
        ``node`` (realized now if it is lazy); None when it is not."""

    def new_buffer(self, fake: torch.Tensor) -> Buffer:
        """A new buffer of ``fake``'s size, strides, dtype and device (allocated by the program)."""

    def realize(self, node: torch.fx.Node, loops: Any) -> Buffer:
        """``node``'s lazy value ``loops`` stored by a kernel job of its own, in the node's
        traced layout."""

    def pointwise_job(self, buffer: Buffer, loops: Any, origins: Sequence[str]) -> None:
        """A kernel job writing ``loops`` into ``buffer`` through its strides; ``origins``:
        the ATen node names whose values it stores."""

    def emit(self, line: Line) -> None:
        """Put ``line`` in the program before the kernel work of the node being lowered."""

    def write_barrier(self, node: torch.fx.Node) -> None:
        """``node`` writes an existing buffer: realize every earlier value used after it."""
