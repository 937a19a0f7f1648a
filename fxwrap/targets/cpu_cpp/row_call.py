"""A CPU template rendered as one call of a row-product library function whose epilogue is
a C++ lambda: the few-row GEMM (``fx_rowdot``) and the int8 weight-only GEMM
(``fx_int8mm``) share it.  ``render_row_call(template, kernel, emitter, "fx_rowdot",
helpers)`` gives::

    extern "C" void fxwrap_template_0(const float* __restrict__ in_ptr0, ..., float* __restrict__ out_ptr0)
    {
      fx_rowdot(in_ptr0, <a's row stride>, in_ptr1, <b's row stride>, <m>, <n>, <k>,
                [&](const int64_t x0, const int64_t x1, const float acc) {
        ...the epilogue of acc, stored at (x0, x1)...
      });
    }
"""
from __future__ import annotations

from fxwrap.core.errors import EmitError
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cstyle import LocalNames, Scope


def render_row_call(template_name: str, kernel, emitter, function: str, helpers: str) -> KernelSource:
    """``kernel``'s source: ``function(a, a_row_stride, b, b_row_stride, m, n, k, epilogue)``
    after ``helpers`` (the library); ``a`` and ``b`` are the template call's first operands,
    which must be the kernel's first inputs, ``b`` an ``[N, K]`` weight seen as ``(K, N)``
    (its stride over ``n`` steps from one weight row to the next)."""
    call = kernel.template
    if call is None:
        raise EmitError(f"kernel {kernel.name} has no template call (template {template_name})")
    a, b = call.operands[:2]
    if [buf.name for buf in kernel.inputs[:2]] != [a.name, b.name]:
        raise EmitError(f"template {template_name}: kernel {kernel.name} does not take {a.name}, {b.name} first")
    idx = emitter.render_index
    names = LocalNames()
    fn = Scope(emitter, names, None, kernel=kernel)
    acc = names.fresh("acc")
    epilogue = emitter.template_epilogue(kernel, fn, acc)
    m, n, k = (idx(call.size(d)) for d in ("m", "n", "k"))
    x0, x1 = (v.name for v in call.index)
    it = emitter.index_type
    body = [*fn.lines,
            f"{function}(in_ptr0, {idx(a.stride[0])}, in_ptr1, {idx(b.stride[1])}, {m}, {n}, {k},",
            f"{' ' * len(function)} [&](const {it} {x0}, const {it} {x1}, const float {acc}) {{",
            *("  " + line for line in epilogue),
            "});"]
    return emitter.template_source(kernel, body, helpers=helpers)
