"""Collective lines of the Wrapper IR: a communication issued, and the wait for it.

``torch.distributed._functional_collectives.all_reduce(x * 2, "sum", group)`` traces to
an ``_c10d_functional`` op and a ``wait_tensor``; the lines are::

    buf0 = empty_strided((8, 8), (8, 1), dtype=torch.float32, device='cpu')
    fxwrap_pointwise_0(arg0, buf0)
    # all_reduce (model.py:7 in f)
    buf1 = _c10d_functional.all_reduce.default(buf0, 'sum', '0')  # collective
    buf3 = empty_strided((8, 8), (8, 1), dtype=torch.float32, device='cpu')
    aten.mm.out(arg1, arg1, out=buf3)                    # independent: overlaps the collective
    # wait_tensor (model.py:7 in f)
    buf2 = _c10d_functional.wait_tensor.default(buf1)  # wait for buf1 (in flight: buf0)
    free(buf0)
    ...

``CallCollective`` issues the communication: its result (``buf1``) is a buffer of the
program, but its contents are defined only by the ``WaitCollective`` line, which
defines ``buf2``, the same storage (``alias_of``), ready.  The wait reads the result and
every buffer the collective reads (``in_flight``: the communication may read them until
it is waited for), so the memory planner keeps them all alive and unreused up to the
wait, and a kernel writing one of them cannot move above it.  The wait writes the
result (its contents change there), so no kernel reading it moves above the wait.

``core/overlap.py`` moves each collective up to its inputs and each wait down to its
first reader, so that the lines between run while the communication is under way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.runtime.provenance import Origin
from fxwrap.ir.lines import Buffer, CallExtern, Line


def _c10d_ops(*names: str) -> frozenset:
    namespace = getattr(torch.ops, "_c10d_functional", None)
    found = set()
    for name in names:
        packet = getattr(namespace, name, None) if namespace is not None else None
        if packet is not None:
            found.update(getattr(packet, o) for o in packet.overloads())
    return frozenset(found)


#: The ``_c10d_functional`` ops that issue a communication whose results a
#: ``wait_tensor`` later makes ready (functional, in-place, coalesced and out= forms).
COLLECTIVE_OPS = _c10d_ops(
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_",
    "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_out",
    "all_to_all_single", "broadcast", "broadcast_")
def _c10d_op(name: str, overload: str = "default"):
    packet = getattr(getattr(torch.ops, "_c10d_functional", None), name, None)
    return getattr(packet, overload, None) if packet is not None else None


#: functional collective -> its in-place form, run on a buffer the program allocates
IN_PLACE_COLLECTIVES = {op: in_place for op, in_place in (
    (_c10d_op("all_reduce"), _c10d_op("all_reduce_")),
    (_c10d_op("broadcast"), _c10d_op("broadcast_"))) if op is not None and in_place is not None}
#: functional collective -> its out= form, writing a buffer the program allocates
OUT_COLLECTIVES = {op: out for op, out in (
    (_c10d_op("all_gather_into_tensor"), _c10d_op("all_gather_into_tensor_out")),)
    if op is not None and out is not None}
#: ``wait_tensor``: the collective that made its argument has finished.
WAIT_OPS = _c10d_ops("wait_tensor")


def is_collective(op) -> bool:
    """``_c10d_functional.all_reduce.default`` and the other ops of ``COLLECTIVE_OPS``."""
    return op in COLLECTIVE_OPS


def is_wait(op) -> bool:
    """``_c10d_functional.wait_tensor.default``."""
    return op in WAIT_OPS


@dataclass(frozen=True)
class CallCollective(CallExtern):
    """``buf1 = _c10d_functional.all_reduce.default(buf0, 'sum', '0')  # collective``.

    An extern call that issues a communication and returns at once; its result is not
    ready until its ``WaitCollective``.  A fusion barrier: a later kernel does not join
    the kernel computing its inputs (which would issue it later, with less to overlap).
    """

    fusion_barrier = True
    #: issues a communication (``core/overlap.py`` raises it and keeps the issue order)
    issues_collective = True

    @property
    def label(self):
        return f"collective {self.op}"

    def host_readback(self):
        # not a read back, but the same answer for CUDA graphs: fxwrap records no
        # communication into one (the process group's own streams and work objects)
        return f"{self.label} communicates with other processes (not recorded into a CUDA graph)"

    def to_source(self, printer: LinePrinter):
        return super().to_source(printer) + "  # collective"


@dataclass(frozen=True)
class WaitCollective(Line):
    """``buf2 = _c10d_functional.wait_tensor.default(buf1)  # wait for buf1 (in flight: buf0)``.

    ``buf``, defined here, is ``tensor``'s storage once the collective that made
    ``tensor`` has finished; ``in_flight``: the buffers that collective reads, alive
    and unchanged until here.
    """

    buf: Buffer
    tensor: Buffer
    in_flight: tuple[Buffer, ...] = ()
    origins: tuple[Origin, ...] = field(default=(), compare=False)

    fusion_barrier = False
    #: waits for a communication (``core/overlap.py`` sinks it to its first reader)
    waits_collective = True

    @property
    def op(self):
        return torch.ops._c10d_functional.wait_tensor.default

    @property
    def label(self):
        return f"wait for {self.tensor.name}"

    def reads(self):
        return [self.tensor, *self.in_flight]

    def writes(self):
        return [self.tensor]

    def defines(self):
        return [self.buf]

    def alias_of(self, producers):
        return self.tensor

    def with_origins(self, origins):
        if self.origins:
            return self
        return WaitCollective(self.buf, self.tensor, self.in_flight, tuple(origins))

    def to_source(self, printer: LinePrinter):
        flight = f" (in flight: {', '.join(b.name for b in self.in_flight)})" if self.in_flight else ""
        call = f"{self.buf.name} = {printer.op_name(self.op)}({self.tensor.name})"
        return printer.provenance(self.origins, f"{call}  # wait for {self.tensor.name}{flight}")

    def to_fx(self, converter: LineConverter):
        node = converter.add(self.op, (converter.node(self.tensor),), name=self.buf.name, buf=self.buf)
        converter.provenance(node, self.origins)
        converter.bind(self.buf, node)
