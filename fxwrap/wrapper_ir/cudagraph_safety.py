"""Whether a program may be captured into a CUDA graph, decided from its Wrapper IR.

``graph_safety(program)`` returns None when every replay of one recording would
compute what running the lines computes, else the reason it would not::

    DefineSymbol(s0, ...)            -> "a size depends on data (read back to the CPU)"
    CallExtern(aten.copy_.default, (arg0_1, buf1))   -> "... writes into a program input"

The runtime's ``CudaGraphRunner`` takes the reason and falls back to plain runs.
"""
from __future__ import annotations

from fxwrap.ir.lines import Buffer, SizeInput

def graph_safety(program) -> str | None:
    """Why ``program`` must not be captured into a CUDA graph, or None when it may be."""
    if any(isinstance(i, SizeInput) for i in program.inputs):
        return "dynamic sizes (size symbols are program inputs)"
    inputs = [i for i in program.inputs if isinstance(i, Buffer)]
    if any(i.device.type != "cuda" for i in inputs):
        return "an input is not on a CUDA device"
    input_names = {i.name for i in inputs}
    for line in program.lines:
        reason = line.host_readback()
        if reason is not None:
            return reason
        if not line.is_device_check and {b.name for b in line.writes()} & input_names:
            return f"{line.label} writes into a program input"
    return None
