"""The graph-capture partition line of the Wrapper IR.

Under graph capture (``mode="reduce-overhead"`` on a device that declares it), the pass
``wrapper_ir.partitions.partition_for_capture`` opens each run of lines that is recorded
and replayed, and each that runs plainly, with a ``PartitionBoundary``::

    def forward(arg0, arg1):
        partition(0, capture=True)
        buf0 = empty_strided((), (), dtype=torch.float32, device='cuda:0')
        fxwrap_reduction_0(arg0, buf0)
        partition(1, capture=False)  # aten._local_scalar_dense.default reads a value back to the CPU
        u0 = aten._local_scalar_dense.default(buf0)
        partition(2, capture=True)
        buf1 = empty_strided((8,), (1,), dtype=torch.float32, device='cuda:0')
        fxwrap_pointwise_1(arg1, buf1, u0)
        return (buf1,)

Its FX form is a call of ``fxwrap.runtime.graph_replay.partition(index, capture, reason)``
(a no-op; kept by dead-code elimination), where ``graph_replay.capture_runner`` splits the
GraphModule.
"""
from __future__ import annotations

from dataclasses import dataclass

from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.ir.lines import Line
from fxwrap.runtime.graph_replay import partition


@dataclass(frozen=True)
class PartitionBoundary(Line):
    """``partition(1, capture=False)  # <reason>``: the lines up to the next boundary are
    partition ``index``; recorded and replayed when ``capture``, else run plainly because
    of ``reason`` (the first line that could not be recorded)."""

    index: int
    capture: bool
    reason: str = ""

    def capture_refusal(self, device_type):
        return None

    def to_source(self, printer: LinePrinter):
        note = f"  # {self.reason}" if self.reason else ""
        return f"partition({self.index}, capture={self.capture}){note}"

    def to_fx(self, converter: LineConverter):
        converter.add(partition, (self.index, self.capture, self.reason), name=f"partition_{self.index}")
