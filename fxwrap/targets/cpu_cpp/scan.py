"""Scan kernels of the C++/OpenMP target: one task per row, or a split scan of long rows.

A scan kernel (``ScheduledKernel.is_scan``: ``cumsum``, ``cumprod``, ``logcumsumexp``,
``cummax``, ``cummin``) has one scanned dim ``r0`` and any number of row dims ``x*``.
``cumsum(x * 2, 1)`` of a ``(2, 100000)`` float tensor, rows run one per task::

    #pragma omp parallel for schedule(static)
    for (int64_t xindex = 0; xindex < 2; ++xindex) {
      const int64_t x0 = xindex;
      float sc0_s0 = float(0);
      for (int64_t r0 = 0; r0 < 100000; ++r0) {
        const float tmp0 = in_ptr0[r0 + 100000*x0];
        const float tmp2 = tmp0 * tmp1;
        sc0_s0 = sc0_s0 + tmp2;
        out_ptr0[r0 + 100000*x0] = sc0_s0;
      }
    }

A row of length ``R`` that the split rule (``ScanCode.split_rule``) calls long, among few
rows, is a **split scan** instead: it is cut into ``nchunks = ceil(R / scan_chunk)`` chunks
of ``scan_chunk`` elements (a constant: the chunks, and so the numbers, never depend on the
thread count), a task is ``scan_lanes`` consecutive chunks of one row, and three loops run::

    // 1. parallel over tasks: each chunk's total, in vector lanes (a sum's speed)
    for (int64_t c = c0; c < fx_imin(c0 + 4, nchunks); ++c) {
      float sc0_s0[16]; ...                      (element j of the chunk in lane j % 16)
      sc0_s0_w[xindex * nchunks + c] = sc0_s0[0];  (the lanes merged in lane order)
    }
    // 2. serial, per row: each total replaced by its chunk's exclusive prefix, in place
    // 3. parallel over tasks: the task's chunks scanned from their prefixes as interleaved
    //    running states (independent dependency chains the CPU overlaps, where one running
    //    sum waits on the previous add every element), with every store
    for (int64_t rj = 0; rj < 4000; ++rj)
      for (int64_t lane = 0; lane < 4; ++lane) {
        const int64_t r0 = (c0 + lane) * 4000 + rj;
        ...
        sc0_s0[lane] = sc0_s0[lane] + tmp2;
        out_ptr0[r0 + 100000*x0] = sc0_s0[lane];
      }

A row's last (short, or fewer than ``scan_lanes``) chunks run one after the other. The
totals live in workspaces (one per state of each scan: cummax/cummin carry the value and
its index) of ``rows * nchunks`` elements, which the program allocates (``Allocate`` lines,
``CStyleEmitter.workspace``); for sizes known at run time only, both plans are rendered
behind the split rule's test, and the workspaces' size is the rule as a sympy expression (0
elements where the rows run one per task).  Combining in chunk order keeps cummax/cummin
(ties and NaNs take the later index: ``fx_cumextreme_merge`` for the lanes) and integer
scans exact; a float sum, product or logcumsumexp rounds in another order than one serial
pass (a chunk starts from the sum of the totals before it), within float32 accumulation's
error (``CppEmitter.scan_accumulate`` can run them in double, as eager's CPU kernels do).
"""
from __future__ import annotations

import sympy
from torch.utils._sympy.functions import CeilDiv

from fxwrap.ir.loops import ScheduledKernel
from fxwrap.targets.cstyle import LocalNames, ScanState, Scope, append_block, c_operand


class ScanCode:
    """Renders one scan kernel for ``CppEmitter``: ``ScanCode(em, kernel, names).render()``
    -> the function body (per-row, split, or both behind a run-time test of the sizes)."""

    def __init__(self, em, kernel: ScheduledKernel, names: LocalNames):
        self.em, self.k, self.names = em, kernel, names
        self.it = em.index_type
        self.xv = em.xvars(kernel)
        self.rv = em.rvars(kernel)[0] if len(kernel.reduction_ranges) == 1 else None
        self.xnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges])
        self.rnumel = sympy.sympify(kernel.reduction_ranges[0]) if kernel.reduction_ranges else None

    # -- the split rule: one place -------------------------------------------------
    def split_rule(self) -> tuple[sympy.Expr, str]:
        """Where the kernel runs as a split scan: ``(is_split, condition)``, ``is_split`` 1 or 0
        as a sympy expression over the size symbols (a number for static shapes; it sizes
        the workspaces), ``condition`` the same test in C (for sizes known at run time only).
        Split when there are fewer rows than ``scan_split_max_rows`` and a row has at least
        ``scan_split_min_length`` elements (and the kernel can split: ``splittable``)."""
        if not self.splittable():
            return sympy.Integer(0), "false"
        em = self.em
        one, zero = sympy.Integer(1), sympy.Integer(0)
        few_rows = sympy.Max(zero, sympy.Min(one, em.scan_split_max_rows - self.xnumel))
        long_rows = sympy.Max(zero, sympy.Min(one, self.rnumel - em.scan_split_min_length + 1))
        condition = (f"{c_operand(em.render_index(self.xnumel))} < {em.scan_split_max_rows} && "
                     f"{c_operand(em.render_index(self.rnumel))} >= {em.scan_split_min_length}")
        return few_rows * long_rows, condition

    def splittable(self) -> bool:
        """A split scan runs a row's chunks out of order: every store must be at an element
        of the scanned dim (no per-row store made by every chunk), and no output may be an
        input too (an in-place scan could read what another chunk already wrote)."""
        if self.rv is None or not self.k.stores:
            return False
        if any(self.rv not in sympy.sympify(st.index).free_symbols for st in self.k.stores):
            return False
        return not ({b.name for b in self.k.inputs} & {b.name for b in self.k.outputs})

    def nchunks(self) -> sympy.Expr:
        return CeilDiv(self.rnumel, self.em.scan_chunk)

    # -- top level -----------------------------------------------------------------
    def render(self) -> list[str]:
        fn = Scope(self.em, self.names, None, kernel=self.k)
        rule, condition = self.split_rule()
        if rule.is_number:
            body = self.split(fn, rule) if int(rule) else self.per_row(fn)
            return fn.lines + body
        split = self.split(fn, rule)
        per_row = self.per_row(fn)
        lines = list(fn.lines)
        append_block(lines, f"if ({condition})", split)
        append_block(lines, "else", per_row)
        return lines

    def per_row(self, fn: Scope) -> list[str]:
        """One task per row (``omp parallel for`` over the rows), each a serial pass over
        ``r0`` that updates the running states and makes every store (the scanned value's
        producer inlined before the update, the epilogue after)."""
        em, it = self.em, self.it
        row = Scope(em, self.names, fn, declares=[v.name for v in self.xv])
        head, update, _ = em.scan_pass(self.k, self.names, row)
        rv = self.rv
        body = em.decompose("xindex", self.xv, self.k.ranges, self.names)
        row.flush_into(body)
        body += head
        append_block(body, f"for ({it} {rv.name} = 0; {rv.name} < {em.render_index(self.rnumel)}; ++{rv.name})",
                     update)
        par = em.parallel_if(self.xnumel * self.rnumel) if self.k.ranges else None
        loop = [("xindex", "0", em.render_index(self.xnumel), "1")]
        return em.parallel_for(self.names, par, loop, body)

    # -- split scan ----------------------------------------------------------------
    def split(self, fn: Scope, rule: sympy.Expr) -> list[str]:
        em, it = self.em, self.it
        lanes, chunk = em.scan_lanes, em.scan_chunk
        states = [ScanState(em, i, red) for i, red in enumerate(self.k.reductions)]
        nch = em.render_index(self.nchunks())
        lines = [f"// split scan: chunks of {chunk} elements, {lanes} interleaved per task",
                 f"const {it} nchunks = {nch};",
                 f"const {it} ngroups = (nchunks + {lanes - 1}) / {lanes};"]
        totals: list[list[str]] = []  # per scan, per state: the workspace of chunk totals
        numel = self.xnumel * self.nchunks() * rule
        for st in states:
            declared, names = st.total_workspaces(numel, "{t}* const")
            lines += declared
            totals.append(names)
        par = em.parallel_if(self.xnumel * self.rnumel)
        loop = [("task", "0", f"{em.render_index(self.xnumel)} * ngroups", "1")]
        lines += em.parallel_for(self.names, par, loop, self.totals_task(fn, states, totals))
        lines += self.prefixes(states, totals)
        lines += em.parallel_for(self.names, par, loop, self.scan_task(fn, states, totals))
        return lines

    def task_head(self) -> list[str]:
        it, lanes = self.it, self.em.scan_lanes
        out = [f"const {it} xindex = task / ngroups;",
               f"const {it} c0 = (task % ngroups) * {lanes};"]
        return out + self.em.decompose("xindex", self.xv, self.k.ranges, self.names)

    def totals_task(self, fn: Scope, states: list[ScanState], totals) -> list[str]:
        """Pass 1, one task: the total of each of its chunks, in ``reduction_lanes`` vector
        lanes (element ``j`` of the chunk in lane ``j % lanes``, the tail in lane 0) merged in
        lane order (``ScanState.merge``), written to the workspaces."""
        em, it, names = self.em, self.it, self.names
        L, chunk = em.reduction_lanes, em.scan_chunk
        out = self.task_head()
        row = Scope(em, names, fn, declares=[v.name for v in self.xv])
        lane_states = [[f"{s}[lane]" for s in st.names()] for st in states]
        first = [[f"{s}[0]" for s in st.names()] for st in states]
        body = [f"const {it} rstart = c * {chunk};",
                f"const {it} rcount = fx_imin({chunk}, {c_operand(em.render_index(self.rnumel))} - rstart);"]
        init = []
        for st in states:
            for (t, start), s in zip(st.states, st.names()):
                body.append(f"{t} {s}[{L}];")
                init.append(f"{s}[lane] = {start};")
        body.append(f"for ({it} lane = 0; lane < {L}; ++lane) {{ {' '.join(init)} }}")
        body.append(f"{it} rj = 0;")
        vec = ["#pragma omp simd"]
        append_block(vec, f"for ({it} lane = 0; lane < {L}; ++lane)",
                     [f"const {it} {self.rv.name} = rstart + rj + lane;"]
                     + self.lane_body(row, states, lane_states, final=False))
        append_block(body, f"for (; rj + {L} <= rcount; rj += {L})", vec)
        append_block(body, "for (; rj < rcount; ++rj)",
                     [f"const {it} {self.rv.name} = rstart + rj;"] + self.lane_body(row, states, first, final=False))
        merges = [st.merge(f, ls) for st, f, ls in zip(states, first, lane_states)]
        body.append(f"for ({it} lane = 1; lane < {L}; ++lane) {{ {' '.join(merges)} }}")
        body += [f"{w}[xindex * nchunks + c] = {f};" for fs, ws in zip(first, totals) for f, w in zip(fs, ws)]
        row.flush_into(out)
        append_block(out, f"for ({it} c = c0; c < fx_imin(c0 + {em.scan_lanes}, nchunks); ++c)", body)
        return out

    def scan_task(self, fn: Scope, states: list[ScanState], totals) -> list[str]:
        """Pass 2, one task: ``scan_lanes`` consecutive chunks of one row, each from its prefix
        as an interleaved running state (the row's last, short or fewer, one after the other),
        with every store."""
        em, it, names = self.em, self.it, self.names
        lanes, chunk = em.scan_lanes, em.scan_chunk
        rn = em.render_index(self.rnumel)
        out = self.task_head()
        row = Scope(em, names, fn, declares=[v.name for v in self.xv])
        lane_states = [[f"{s}[lane]" for s in st.names()] for st in states]
        init: list[str] = []
        for st, ws in zip(states, totals):
            for (t, start), s, w in zip(st.states, st.names(), ws):
                out.append(f"{t} {s}[{lanes}];")
                # chunk c0 + lane's prefix (a lane past the row's end is never read)
                init.append(f"{s}[lane] = c0 + lane < nchunks ? {w}[xindex * nchunks + c0 + lane] : {start};")
        out.append(f"for ({it} lane = 0; lane < {lanes}; ++lane) {{ {' '.join(init)} }}")
        rv = self.rv.name
        # full chunks, interleaved
        full: list[str] = []
        append_block(full, f"for ({it} lane = 0; lane < {lanes}; ++lane)",
                     [f"const {it} {rv} = (c0 + lane) * {chunk} + rj;"]
                     + self.lane_body(row, states, lane_states, final=True))
        interleaved: list[str] = []
        append_block(interleaved, f"for ({it} rj = 0; rj < {chunk}; ++rj)", full)
        # the row's last chunks, one after the other
        one = [f"const {it} rend = fx_imin((c0 + lane + 1) * {chunk}, {rn});"]
        append_block(one, f"for ({it} {rv} = (c0 + lane) * {chunk}; {rv} < rend; ++{rv})",
                     self.lane_body(row, states, lane_states, final=True))
        serial: list[str] = []
        append_block(serial, f"for ({it} lane = 0; lane < {lanes} && c0 + lane < nchunks; ++lane)", one)
        row.flush_into(out)
        append_block(out, f"if ((c0 + {lanes}) * {chunk} <= {rn})", interleaved)
        append_block(out, "else", serial)
        return out

    def lane_body(self, row: Scope, states: list[ScanState], lane_states, final: bool) -> list[str]:
        """One element of one lane: the scanned values, the state updates and, in the final
        pass, every store (reading the updated states as the scans' results)."""
        inner = Scope(self.em, self.names, row, declares=[self.rv.name])
        body: list[str] = []
        for st, ls in zip(states, lane_states):
            v = st.value(inner)
            inner.flush_into(body)
            body.append(st.upd(v, self.rv.name, ls))
        if final:
            for st, ls in zip(states, lane_states):
                st.bind(inner, ls)
            body += self.em.render_stores(self.k, self.k.stores, inner)
        return body

    def prefixes(self, states: list[ScanState], totals) -> list[str]:
        """Per row, serially: each chunk's total replaced by the state before the chunk
        (the scan's initial state folded with the totals of the chunks before it)."""
        it = self.it
        body: list[str] = []
        loop: list[str] = []
        for st, ws in zip(states, totals):
            acc = [f"{s}_p" for s in st.names()]
            nxt = [f"{s}_t" for s in st.names()]
            body += [f"{t} {a} = {start};" for (t, start), a in zip(st.states, acc)]
            loop += [f"const {t} {b} = {w}[xindex * nchunks + c];" for (t, _), b, w in zip(st.states, nxt, ws)]
            loop += [f"{w}[xindex * nchunks + c] = {a};" for a, w in zip(acc, ws)]
            loop.append(st.combine(acc, nxt))
        append_block(body, f"for ({it} c = 0; c < nchunks; ++c)", loop)
        lines: list[str] = []
        append_block(lines, f"for ({it} xindex = 0; xindex < {self.em.render_index(self.xnumel)}; ++xindex)", body)
        return lines

