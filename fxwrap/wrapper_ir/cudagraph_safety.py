"""Whether a program may be captured into a CUDA graph, decided from its Wrapper IR.

``graph_safety(program)`` returns None when every replay of one recording would
compute what running the lines computes, else the reason it would not::

    DefineSymbol(s0, ...)            -> "a size depends on data (read back to the CPU)"
    CallExtern(aten.copy_.default, (arg0_1, buf1))   -> "... writes into a program input"

The runtime's ``CudaGraphRunner`` takes the reason and falls back to plain runs.
"""
from __future__ import annotations

from fxwrap.wrapper_ir.lines import Buffer, CallExtern, CallKernel, DefineSymbol, SizeInput, buffers_in

_METADATA_READS = ("sym_size", "sym_stride", "sym_storage_offset", "sym_numel")


def _written_buffers(line) -> set[str]:
    """Names of the buffers an extern call writes (schema arguments marked ``(a!)``)."""
    kwargs = dict(line.kwargs)
    names: set[str] = set()
    for i, arg in enumerate(line.op._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = line.args[i] if i < len(line.args) else kwargs.get(arg.name)
            names |= {b.name for b in buffers_in([value])}
    return names


def graph_safety(program) -> str | None:
    """Why ``program`` must not be captured into a CUDA graph, or None when it may be."""
    if any(isinstance(i, SizeInput) for i in program.inputs):
        return "dynamic sizes (size symbols are program inputs)"
    inputs = [i for i in program.inputs if isinstance(i, Buffer)]
    if any(i.device.type != "cuda" for i in inputs):
        return "an input is not on a CUDA device"
    input_names = {i.name for i in inputs}
    for line in program.lines:
        if isinstance(line, DefineSymbol):
            return "a size depends on data (read back to the CPU)"
        if isinstance(line, CallExtern):
            returns = [str(r.type) for r in line.op._schema.returns]
            if returns and "Tensor" not in "".join(returns) and \
                    not line.op._schema.name.split("::")[-1].startswith(_METADATA_READS):
                return f"{line.op} reads a value back to the CPU"
            if _written_buffers(line) & input_names:
                return f"{line.op} writes into a program input"
        if isinstance(line, CallKernel):
            for arg, value in zip(line.kernel.signature, line.args):
                if getattr(arg, "role", "input") in ("output", "inout") and \
                        isinstance(value, Buffer) and value.name in input_names:
                    return f"kernel {line.kernel.name} writes into a program input"
    return None
