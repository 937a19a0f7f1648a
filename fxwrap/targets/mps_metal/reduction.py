"""Metal reductions: one threadgroup per output row.

``x.sum(1)`` over a ``(s0, 67)`` float tensor renders (abridged) as::

    threadgroup float rd0_shm0[32];
    const uint fx_lane = fx_tid % 32;          // lane in the SIMD group
    const uint fx_simd = fx_tid / 32;          // SIMD group in the threadgroup
    const uint fx_nsimd = (fx_tgsize + 31) / 32;
    const long xindex = fx_group;              // the output row
    const long x0 = xindex;
    float rd0_a0 = 0;
    for (long rindex = fx_tid; rindex < 67; rindex += fx_tgsize) {   // a strided slice
      const long r0 = rindex;
      const float tmp0 = in_ptr0[67*x0 + r0];
      fx_sum_upd<float>(rd0_a0, tmp0);
    }
    rd0_a0 = simd_sum(rd0_a0);                 // SIMD-group reduction (32 lanes)
    if (fx_lane == 0) { rd0_shm0[fx_simd] = rd0_a0; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float rd0_f0 = 0;                          // every thread folds the SIMD partials
    for (uint fx_j = 0; fx_j < fx_nsimd; ++fx_j) { fx_sum_upd<float>(rd0_f0, rd0_shm0[fx_j]); }
    if (fx_tid == 0) { out_ptr0[x0] = rd0_f0; }

Reductions that read an earlier one's result (softmax: max, then the sum of
``exp(x - max)``) run as passes, one barrier each; stores indexed by ``r`` vars run
as a last strided pass (the epilogue), stores indexed by ``x`` only once per row by
thread 0.  Partial states combine with the kind's combine function (the parallel
Welford formula for ``welford``; NaN and first-index rules for argmax/argmin), in a
fixed order.  Every thread executes every SIMD-group call (no early return), which
the shim relies on and Metal requires for defined results.
"""
from __future__ import annotations

import sympy

from fxwrap.ir.loops import REDUCTIONS, ScheduledKernel, split_stores
from fxwrap.targets.cstyle import EmitError, LocalNames, ReductionAccumulator, Scope, append_block, reduction_passes


def state_types(acc: ReductionAccumulator) -> list[str]:
    """The Metal types of ``acc``'s states (the C-family accumulator's, in Metal's names)."""
    return [t for t, _ in acc.states]


def declarations(acc: ReductionAccumulator, tag: str) -> list[str]:
    """``acc``'s states named by ``tag``, declared at their initial values: ``float rd0_a0 = 0;``."""
    return [f"{t} {n} = {init};" for (t, init), n in zip(acc.states, acc.names(tag))]


def simd_combine(acc: ReductionAccumulator, width: int) -> list[str]:
    """Combine ``acc``'s state across the lanes of each SIMD group (lane 0 ends with it):
    Metal's ``simd_*`` functions where they are torch's reduction, else shuffles folded with
    the kind's combine (``fx_*_upd`` / ``fx_*_cmb`` exist in both preludes)."""
    a = acc.names("a")
    if acc.kind == "sum" and acc.T in ("float", "int"):
        return [f"{a[0]} = simd_sum({a[0]});"]
    if acc.kind in ("max", "min") and acc.T != "bool":
        # simd_max/simd_min leave NaN unspecified; torch propagates it
        m = f"{acc.base}_m"
        lines = [f"const {acc.T} {m} = simd_{acc.kind}({a[0]});"]
        if acc.T == "float":
            lines.append(f"{a[0]} = simd_any(fx_isnan({a[0]})) ? NAN : {m};")
        else:
            lines.append(f"{a[0]} = {m};")
        return lines
    if acc.kind == "any":
        return [f"{a[0]} = simd_any({a[0]});"]
    if acc.kind == "all":
        return [f"{a[0]} = simd_all({a[0]});"]
    o = acc.names("o")
    body = [f"const {t} {x} = simd_shuffle_down({y}, fx_off);"
            for t, x, y in zip(state_types(acc), o, a)]
    body.append(acc.cmb(a, o))
    lines: list[str] = []
    append_block(lines, f"for (ushort fx_off = {width // 2}; fx_off > 0; fx_off >>= 1)", body)
    return lines


class MetalReduction:
    """Renders the body of one reduction kernel (threadgroup per row)."""

    def __init__(self, em, kernel: ScheduledKernel, names: LocalNames):
        self.em, self.k, self.names = em, kernel, names
        self.xv, self.rv = em.xvars(kernel), em.rvars(kernel)
        self.xr = [sympy.sympify(r) for r in kernel.ranges]
        self.rr = [sympy.sympify(r) for r in kernel.reduction_ranges]
        if not self.rv:
            raise EmitError(f"kernel {kernel.name} has reductions but no reduction_ranges")
        for red in kernel.reductions:
            if red.kind not in REDUCTIONS:
                raise EmitError(f"reduction kind {red.kind!r} has no Metal rendering (target {em.target_name})")
        self.reds = [ReductionAccumulator(em, i, r) for i, r in enumerate(kernel.reductions)]
        self.passes = reduction_passes(kernel, self.reds)
        self.r_stores, self.x_stores = split_stores(kernel.stores, self.rv)

    def strided_loop(self, row: Scope) -> tuple[Scope, list[str], str]:
        """A scope declaring the r vars, the lines decomposing ``rindex``, the loop head."""
        rscope = Scope(self.em, self.names, row, declares=[v.name for v in self.rv])
        body = self.em.decompose("rindex", self.rv, self.rr, self.names)
        rnumel = self.em.numel(self.rr)
        head = f"for (long rindex = fx_tid; rindex < {rnumel}; rindex += fx_tgsize)"
        return rscope, body, head

    def render(self) -> list[str]:
        em, width = self.em, self.em.simd_width
        fn = Scope(em, self.names, None, kernel=self.k)
        out = [f"threadgroup {t} {n}[{width}];"
               for r in self.reds for t, n in zip(state_types(r), r.names("shm"))]
        out += [f"const uint fx_lane = fx_tid % {width};",
                f"const uint fx_simd = fx_tid / {width};",
                f"const uint fx_nsimd = (fx_tgsize + {width - 1}) / {width};",
                "const long xindex = fx_group;"]
        out += em.decompose("xindex", self.xv, self.xr, self.names)
        row = Scope(em, self.names, fn, declares=[v.name for v in self.xv])
        for p in self.passes:
            rscope, body, head = self.strided_loop(row)
            values = [r.value(rscope) for r in p]
            rscope.flush_into(body)
            body += [r.upd(r.names("a"), v, "rindex") for r, v in zip(p, values)]
            row.flush_into(out)
            for r in p:
                out += declarations(r, "a")
            append_block(out, head, body)
            for r in p:
                out += simd_combine(r, width)
                shm, acc = r.names("shm"), r.names("a")
                append_block(out, "if (fx_lane == 0)", [f"{s}[fx_simd] = {a};" for s, a in zip(shm, acc)])
            out.append(em.barrier)
            for r in p:
                out += declarations(r, "f")
                fold = r.cmb(r.names("f"), [f"{s}[fx_j]" for s in r.names("shm")])
                out.append(f"for (uint fx_j = 0; fx_j < fx_nsimd; ++fx_j) {{ {fold} }}")
                out += r.finish(r.names("f"))
                r.bind(row, r.names("f"))
        if self.r_stores:
            rscope, body, head = self.strided_loop(row)
            body += em.render_stores(self.k, self.r_stores, rscope)
            row.flush_into(out)
            append_block(out, head, body)
        if self.x_stores:
            stores = em.render_stores(self.k, self.x_stores, Scope(em, self.names, row))
            row.flush_into(out)
            append_block(out, "if (fx_tid == 0)", stores)
        return fn.lines + out
