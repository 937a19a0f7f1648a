"""Scans of the Triton target: plans ``scan`` and ``split-scan``.

``ScanWriter(writer)`` writes, through the kernel's ``codegen.KernelWriter``, a kernel whose
reductions are scans (``cumsum``, ``cumprod``, ``logcumsumexp``, ``cummax``, ``cummin``)
over one dim ``r``, and its stores (prologue and epilogue fused).  Each scan's running state
(``fields``: the value, and the index for ``cummax``/``cummin``) is carried across the
row's ``RBLOCK`` steps::

    _scan0_c = tl.full([XBLOCK, 1], 0, tl.float32)
    for roffset in range(0, rnumel, RBLOCK):
        ...
        _scan0_v = tl.where(xrmask, tmp0, tl.full([], 0, tl.float32))
        _scan0 = _fx_add(_scan0_c, tl.associative_scan(_scan0_v, 1, _fx_add))
        _scan0_c = _fx_add(_scan0_c, tl.reduce(_scan0_v, 1, _fx_add)[:, None])
        tl.store(out_ptr0 + (r0 + 3000*x0), _scan0, xmask & rmask)

* ``scan``: one program per row (``write``);
* ``split-scan``: one program per (row, chunk of ``SCAN_CHUNK``) in two kernels, the chunk
  totals into workspaces, then each chunk's scan from the totals before it (``write_split``).

The single-launch look-back scan of long rows is ``lookback.LookbackScanWriter``.
"""
from __future__ import annotations

import torch

from fxwrap.ir.loops import Reduction
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import KernelWriter, Scope
from fxwrap.targets.cuda_triton.reduction import initial_value

#: the jitted helper combining two running states of a scan kind
COMBINE = {"cumsum": "_fx_add", "cumprod": "_fx_mul", "logcumsumexp": "_fx_logaddexp",
           "cummax": "_fx_cummax", "cummin": "_fx_cummin"}


def scan_fields(red: Reduction) -> list[tuple[str, torch.dtype, str]]:
    """The running state of one scan: ``(local suffix, dtype, initial value)`` per field."""
    T = O.compute_dtype(red.dtype)
    if red.kind in ("cummax", "cummin"):
        return [("", T, initial_value("max" if red.kind == "cummax" else "min", T)), ("_ix", torch.int64, "-1")]
    init = {"cumsum": "0", "cumprod": "1", "logcumsumexp": 'float("-inf")'}[red.kind]
    return [("", T, init)]


class ScanWriter:
    """``ScanWriter(writer).write()``: the body of plan ``scan``; ``write_split()``: the two
    bodies of plan ``split-scan``, whose workspaces are ``workspace_fields()`` (module doc)."""

    def __init__(self, writer: KernelWriter):
        self.w = writer
        self.kernel = writer.kernel
        self.plan = writer.plan

    def combine(self, red: Reduction) -> str:
        return self.w.helper(COMBINE[red.kind])

    def local(self, red: Reduction) -> str:
        return self.w.reduction_local(red, "_scan")

    def setup(self, split: bool) -> list[str]:
        """The row's (``split``: the chunk's) program indices, x lanes and ``rbase``."""
        w, p = self.w, self.plan
        out = [f"xnumel = {w.numel(p.ranges['x'])}", f"rnumel = {w.numel(p.ranges['r'])}"]
        if split:
            out += ["nchunks = (rnumel + SCAN_CHUNK - 1) // SCAN_CHUNK",
                    f"pid = {w.pid()}",
                    "chunk = pid % nchunks",
                    "xoffset = (pid // nchunks) * XBLOCK",
                    "rstart = chunk * SCAN_CHUNK",
                    "rend = tl.minimum(rstart + SCAN_CHUNK, rnumel)"]
        else:
            out.append(f"xoffset = {w.pid()} * XBLOCK")
        out += ["xindex = xoffset + tl.arange(0, XBLOCK)[:, None]", "xmask = xindex < xnumel",
                f"rbase = {w.block_lanes()}", *w.decompose("xindex", p.groups["x"], p.ranges["x"])]
        return out

    def carry_init(self, red: Reduction) -> list[str]:
        base = self.local(red)
        return [f"{base}{sfx}_c = tl.full([XBLOCK, 1], {init}, {O.TL_TYPES[T]})"
                for sfx, T, init in scan_fields(red)]

    def step(self, loop: Scope, red: Reduction, totals_only: bool = False) -> list[str]:
        """Lines of one ``RBLOCK`` step of a row: the block's scan combined with the carry
        (``{base}``, bound as the scan's acc in ``loop``; not with ``totals_only``), then
        the carry moved past the block."""
        base = self.local(red)
        fields = scan_fields(red)
        T = fields[0][1]
        v = self.w.value(loop, red.value)
        v = O.cast(v, red.value.dtype, red.dtype)
        fn = self.combine(red)
        lines = [f"{base}_v = tl.where(xrmask, {v}, tl.full([], {fields[0][2]}, {O.TL_TYPES[T]}))"]
        if len(fields) == 2:  # value and index
            lines.append(f"{base}_i = tl.where(xrmask, rindex.to(tl.int64), -1)")
            if not totals_only:
                lines += [f"{base}_sv, {base}_si = tl.associative_scan(({base}_v, {base}_i), 1, {fn})",
                          f"{base}, {base}_ix = {fn}({base}_c, {base}_ix_c, {base}_sv, {base}_si)"]
            lines += [f"{base}_rv, {base}_ri = tl.reduce(({base}_v, {base}_i), 1, {fn})",
                      f"{base}_c, {base}_ix_c = {fn}({base}_c, {base}_ix_c, {base}_rv[:, None], {base}_ri[:, None])"]
            fields_bound = {0: (f"{base}_ix", torch.int64), 1: (base, red.dtype)}
        else:
            # (tl.cumsum / tl.sum are the same scan and reduction, but fail under Triton's
            # interpreter once the module was imported without TRITON_INTERPRET)
            scan = f"tl.associative_scan({base}_v, 1, {fn})"
            total = f"tl.reduce({base}_v, 1, {fn})[:, None]"
            if not totals_only:
                lines.append(f"{base} = {fn}({base}_c, {scan})")
            lines.append(f"{base}_c = {fn}({base}_c, {total})")
            fields_bound = {0: (base, red.dtype)}
        if not totals_only:
            for f, bound in fields_bound.items():
                loop.accs[(red.name, f)] = bound
            loop.provides.add(("acc", red.name))
        return lines

    def row(self, top: Scope, totals_only: bool = False, split: bool = False) -> list[str]:
        """Every scan's carry, then the loop over the row's ``RBLOCK`` steps: the scans,
        then (unless ``totals_only``) every store of the kernel."""
        w = self.w
        rnames = {v.name for v in self.plan.groups["r"]}
        loop = Scope(top, provides=rnames)
        init: list[str] = []
        for red in self.kernel.reductions:
            init += self.carry_init(red)
        for red in self.kernel.reductions:
            step = self.step(loop, red, totals_only)
            loop.lines += step
        if not totals_only:
            for st in self.kernel.stores:
                w.store(loop, st, ("x", "r"))
        out = top.lines + init
        top.lines = []
        if split:
            return out + w.row_loop(loop, [], start="rstart", end="rend")
        return out + w.row_loop(loop, [])

    def write(self) -> list[str]:
        """Plan ``scan``: one program per row, a carry across its ``RBLOCK`` steps."""
        w = self.w
        top = w.function_scope(("x",))
        return w.with_zeros(w.size_casts() + self.setup(split=False) + self.row(top))

    def workspace_fields(self) -> list[tuple[int, str, torch.dtype]]:
        """Split scan: ``(reduction position, local suffix, dtype)`` of each workspace
        ``ws_ptr{i}`` (one per field of each scan's state, ``[xnumel, nchunks]``)."""
        return [(k, sfx, T) for k, red in enumerate(self.kernel.reductions) for sfx, T, _ in scan_fields(red)]

    def write_split(self) -> tuple[list[str], list[str]]:
        """Plan ``split-scan``: the bodies of the two kernels of a long-row scan, each
        taking ``(in_ptr*, out_ptr*, ws_ptr*, sizes)``, one program per (row, chunk of
        ``SCAN_CHUNK`` elements):

        1. ``_totals``: the chunk's total (the scan state past its last element) into
           ``ws[row * nchunks + chunk]``;
        2. the kernel itself: the chunk's carry, the totals of the chunks before it
           combined in order (``CBLOCK`` at a time), then the chunk's scan from it and
           every store."""
        w = self.w
        ws = self.workspace_fields()
        casts = w.size_casts()
        at = "(xindex * nchunks + chunk)"
        # 1. totals
        top = w.function_scope(("x",))
        body_a = casts + self.setup(split=True) + self.row(top, totals_only=True, split=True)
        for i, (k, sfx, T) in enumerate(ws):
            base = self.local(self.kernel.reductions[k])
            body_a.append(f"tl.store(ws_ptr{i} + {at}, {base}{sfx}_c, xmask)")
        body_a = w.with_zeros(body_a)
        # 2. each chunk's carry from the totals before it, then its scan and the stores
        top = w.function_scope(("x",))
        body_b = casts + self.setup(split=True)
        body_b.append(f"cbase = {w.block_lanes('CBLOCK')}")
        carry: list[str] = []
        for k, red in enumerate(self.kernel.reductions):
            base = self.local(red)
            fields = scan_fields(red)
            fn = self.combine(red)
            ptrs = [i for i, (kk, _, _) in enumerate(ws) if kk == k]
            names = [f"{base}{sfx}" for sfx, _, _ in fields]
            loop = ["cindex = coffset + cbase", "cmask = xmask & (cindex < chunk)"]
            loop += [f"{n}_t = tl.load(ws_ptr{i} + (xindex * nchunks + cindex), cmask, other={init})"
                     for i, n, (_, _, init) in zip(ptrs, names, fields)]
            if len(fields) == 2:
                loop += [f"{base}_rv, {base}_ri = tl.reduce(({names[0]}_t, {names[1]}_t), 1, {fn})",
                         f"{names[0]}_p, {names[1]}_p = {fn}({names[0]}_p, {names[1]}_p, {base}_rv[:, None], "
                         f"{base}_ri[:, None])"]
            else:
                loop.append(f"{names[0]}_p = {fn}({names[0]}_p, tl.reduce({names[0]}_t, 1, {fn})[:, None])")
            carry += [f"{n}_p = tl.full([XBLOCK, 1], {init}, {O.TL_TYPES[T]})" for n, (_, T, init) in zip(names, fields)]
            carry.append("for coffset in range(0, chunk, CBLOCK):")
            carry += ["    " + ln for ln in loop]
        loop_lines = self.row(top, split=True)
        # the carries start from the chunks before, not from the initial state
        starts = {f"{self.local(self.kernel.reductions[k])}{sfx}" for k, sfx, _ in ws}
        fixed = []
        for ln in loop_lines:
            name = ln.split(" = ", 1)[0]
            if name.endswith("_c") and name[:-2] in starts and "tl.full([XBLOCK, 1]" in ln:
                ln = f"{name} = {name[:-2]}_p"
            fixed.append(ln)
        body_b = w.with_zeros(body_b + carry + fixed)
        return body_a, body_b
