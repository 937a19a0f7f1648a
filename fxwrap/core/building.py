"""What a lowering rule's context may ask of the program builder: the ``RuleBuilder`` protocol.

A rule sees a ``core.lowering.LoweringContext``; the context's helpers that need more
than lazy values (``stored``, ``realized``, ``realized_output``, ``emit``,
``write_barrier``, ``store_into``) call the builder through these methods only, so the
lowerer (``wrapper_ir.realization.Realizer``, for ``wrapper_ir.lowerer.Lowerer``) may change behind them::

    ctx.stored(x)          -> builder.in_memory(ctx.node, x)     buf3
    ctx.realized(loops)    -> builder.realize(ctx.node, loops)   buf4 (a kernel job stores it)
    ctx.emit(line)         -> builder.emit(line)                 the line, before the node's kernels
    ctx.write_barrier()    -> builder.write_barrier(ctx.node)    earlier values read later realized first

and the indexed writes' (``core/rules/indexed_writes.py``)::

    ctx.indexed_stores(None, bf16)  -> builder.indexed_stores(None, bf16)   does the emitter render it
    ctx.in_place_refusal()          -> builder.in_place_refusal(ctx.node)   None: write into self
    ctx.indexed_write_target()      -> builder.indexed_write_target(node)   (buf0, True)
    ctx.indexed_job(ranges, store)  -> builder.indexed_job(ranges, store, [node.name])
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

    def indexed_stores(self, mode: str | None, dtype: torch.dtype) -> bool:
        """Whether the target's emitter renders an indexed store of ``mode`` (None: a plain
        write, ``"add"``) into a ``dtype`` buffer."""

    def in_place_refusal(self, node: torch.fx.Node) -> str | None:
        """Why indexed write ``node`` may not store into its ``self``'s storage; None when it may."""

    def indexed_write_target(self, node: torch.fx.Node) -> tuple[Buffer, bool]:
        """The buffer indexed write ``node`` stores into, and whether it is ``self``'s own storage."""

    def indexed_job(self, ranges: Sequence[Any], store: Any, origins: Sequence[str]) -> None:
        """A kernel job of one indexed ``store`` over ``ranges`` (a kernel of its own)."""

    def reads_storage(self, loops: Any, buffer: Buffer) -> bool:
        """Whether lazy ``loops`` loads ``buffer``'s storage (``buffer`` or a view of it)."""

    def same_storage(self, a: Buffer, b: Buffer) -> bool:
        """Whether buffers ``a`` and ``b`` are views of one storage."""

    def value_of(self, node: torch.fx.Node) -> Any:
        """What ``node`` computed so far: a ``Buffer`` in memory or a lazy ``Loops``."""
