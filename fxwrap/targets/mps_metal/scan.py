"""Metal scan kernels: one thread per row, or one threadgroup per row for few long rows.

A scan kernel (``cumsum``...: ``ScheduledKernel.is_scan``) with many rows runs one thread per
row, a serial pass over ``r0`` (``CStyleEmitter.scan_pass``)::

    const long xindex = fx_gid;
    if (xindex >= 6) return;
    const long x0 = xindex;
    float sc0_s0 = float(0);
    for (long r0 = 0; r0 < 50; ++r0) { ...; sc0_s0 = sc0_s0 + tmp2; out_ptr0[r0 + 50*x0] = sc0_s0; }

Few long rows (``MetalScan.splits``: sizes known when compiling, fewer than
``scan_split_max_rows`` rows of at least ``scan_split_min_length``) run one threadgroup per
row instead, the row cut into ``nchunks`` chunks of ``chunk_size`` elements (functions of
the row's length only: ``chunks``; never of the threadgroup size, so the numbers do not
change with it); thread ``fx_tid`` takes chunks ``fx_tid``, ``fx_tid + fx_tgsize``, ...::

    const long xindex = fx_group;                   // the row
    for (long c = fx_tid; c < 157; c += fx_tgsize) {  // 1. each chunk's total
      float sc0_s0 = float(0);
      for (long r0 = c * 255; r0 < min(...); ++r0) { ...; sc0_s0 = sc0_s0 + tmp0; }
      sc0_s0_w[xindex * 157 + c] = sc0_s0;
    }
    threadgroup_barrier(mem_flags::mem_device);
    if (fx_tid == 0) { ... }                        // 2. the totals -> exclusive prefixes
    threadgroup_barrier(mem_flags::mem_device);
    for (long c = fx_tid; c < 157; c += fx_tgsize) {  // 3. each chunk from its prefix
      float sc0_s0 = sc0_s0_w[xindex * 157 + c];
      for (long r0 = ...) { ...; out_ptr0[r0 + 40001*x0] = sc0_s0; }
    }

The totals live in workspaces (one per state of each scan) of ``rows * nchunks`` elements
that the program allocates (``CStyleEmitter.workspace``).  A threadgroup cannot wait for
another inside one dispatch, so a row is one threadgroup's work (a row per threadgroup, as
the reductions); sizes known only at run time keep one thread per row.
"""
from __future__ import annotations

import math

import sympy

from fxwrap.ir.loops import ScheduledKernel
from fxwrap.targets.cstyle import LocalNames, ScanState, Scope, append_block


class MetalScan:
    """Renders one Metal scan kernel: ``MetalScan(em, kernel, names).render()``."""

    def __init__(self, em, kernel: ScheduledKernel, names: LocalNames | None = None):
        self.em, self.k, self.names = em, kernel, names
        self.it = em.index_type
        self.xv = em.xvars(kernel)
        self.xnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges])
        self.rnumel = sympy.sympify(kernel.reduction_ranges[0]) if len(kernel.reduction_ranges) == 1 else None

    def splits(self) -> bool:
        """The split rule: static sizes, fewer rows than ``scan_split_max_rows``, rows of at
        least ``scan_split_min_length``, every store at an element of ``r0`` and no output
        that is also an input (chunks run out of order)."""
        em, k = self.em, self.k
        if self.rnumel is None or not self.rnumel.is_number or not self.xnumel.is_number or not k.stores:
            return False
        r0 = em.rvars(k)[0]
        if any(r0 not in sympy.sympify(st.index).free_symbols for st in k.stores):
            return False
        if {b.name for b in k.inputs} & {b.name for b in k.outputs}:
            return False
        return int(self.xnumel) < em.scan_split_max_rows and int(self.rnumel) >= em.scan_split_min_length

    def chunks(self) -> tuple[int, int]:
        """``(nchunks, chunk_size)``: at most ``scan_max_chunks`` chunks of at least
        ``scan_min_chunk`` elements, none empty."""
        n = int(self.rnumel)
        wanted = min(self.em.scan_max_chunks, math.ceil(n / self.em.scan_min_chunk))
        size = math.ceil(n / wanted)
        return math.ceil(n / size), size

    def render(self) -> list[str]:
        return self.split() if self.splits() else self.per_row()

    def per_row(self) -> list[str]:
        em, names, it = self.em, self.names, self.it
        fn = Scope(em, names, None, kernel=self.k)
        row = Scope(em, names, fn, declares=[v.name for v in self.xv])
        head, update, _ = em.scan_pass(self.k, names, row)
        rv = em.rvars(self.k)[0].name
        out = [f"const {it} xindex = {em.thread_index};",
               f"if (xindex >= {em.numel(self.k.ranges)}) return;"]
        out += em.decompose("xindex", self.xv, self.k.ranges, names)
        row.flush_into(out)
        out += head
        append_block(out, f"for ({it} {rv} = 0; {rv} < {em.render_index(self.rnumel)}; ++{rv})", update)
        return fn.lines + out

    def split(self) -> list[str]:
        em, names, it = self.em, self.names, self.it
        nch, size = self.chunks()
        rows, n = int(self.xnumel), int(self.rnumel)
        rv = em.rvars(self.k)[0].name
        fn = Scope(em, names, None, kernel=self.k)
        states = [ScanState(em, i, red) for i, red in enumerate(self.k.reductions)]
        out = [f"// split scan: {nch} chunks of {size} elements per row, one threadgroup per row",
               f"const {it} xindex = fx_group;"]
        out += em.decompose("xindex", self.xv, self.k.ranges, names)
        totals = []
        for st in states:
            declared, ws = st.total_workspaces(rows * nch, "device {t}*")
            out += declared
            totals.append(ws)
        row = Scope(em, names, fn, declares=[v.name for v in self.xv])
        chunk_range = f"for ({it} {rv} = c * {size}; {rv} < fx_imin((c + 1) * {size}, {em.int_literal(n)}); ++{rv})"
        at = f"xindex * {nch} + c"
        # 1. the chunk totals
        body = [f"{t} {s} = {start};" for st in states for (t, start), s in zip(st.states, st.names())]
        append_block(body, chunk_range, self.element(row, states, final=False))
        body += [f"{w}[{at}] = {s};" for st, ws in zip(states, totals) for s, w in zip(st.names(), ws)]
        pass1: list[str] = []
        append_block(pass1, f"for ({it} c = fx_tid; c < {nch}; c += fx_tgsize)", body)
        # 2. thread 0: the totals -> exclusive prefixes, in chunk order
        prefix: list[str] = []
        loop: list[str] = []
        for st, ws in zip(states, totals):
            acc, nxt = [f"{s}_p" for s in st.names()], [f"{s}_t" for s in st.names()]
            prefix += [f"{t} {a} = {start};" for (t, start), a in zip(st.states, acc)]
            loop += [f"const {t} {b} = {w}[{at}];" for (t, _), b, w in zip(st.states, nxt, ws)]
            loop += [f"{w}[{at}] = {a};" for a, w in zip(acc, ws)]
            loop.append(st.combine(acc, nxt))
        append_block(prefix, f"for ({it} c = 0; c < {nch}; ++c)", loop)
        # 3. each chunk from its prefix, with the stores
        body = [f"{t} {s} = {w}[{at}];" for st, ws in zip(states, totals)
                for (t, _), s, w in zip(st.states, st.names(), ws)]
        append_block(body, chunk_range, self.element(row, states, final=True))
        pass3: list[str] = []
        append_block(pass3, f"for ({it} c = fx_tid; c < {nch}; c += fx_tgsize)", body)
        row.flush_into(out)
        barrier = "threadgroup_barrier(mem_flags::mem_device);"
        out += pass1 + [barrier]
        append_block(out, "if (fx_tid == 0)", prefix)
        out += [barrier] + pass3
        return fn.lines + out

    def element(self, row: Scope, states: list[ScanState], final: bool) -> list[str]:
        """One element: the scanned values and state updates, then (``final``) the stores."""
        inner = Scope(self.em, self.names, row, declares=[self.em.rvars(self.k)[0].name])
        body: list[str] = []
        r0 = self.em.rvars(self.k)[0].name
        for st in states:
            v = st.value(inner)
            inner.flush_into(body)
            body.append(st.upd(v, r0))
        if final:
            for st in states:
                st.bind(inner)
            body += self.em.render_stores(self.k, self.k.stores, inner)
        return body
