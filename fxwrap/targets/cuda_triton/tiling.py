"""How a ``ScheduledKernel`` maps onto Triton blocks: the kernel's *plan*.

* pointwise, 1-D: one axis ``x`` over the flattened ranges (``XBLOCK``);
* pointwise, 2-D: axes ``y`` (the outer vars, ``YBLOCK``) and ``x`` (the inner vars,
  ``XBLOCK``) when some load or store is contiguous in a var other than the last
  (a transpose): the split is the one that coalesces the most bytes, each access
  weighed by the bytes it moves (its element size times the elements its index
  reaches) and the sectors a 1-D tiling wastes on it, and only when it saves at least
  ``pointwise2d_min_gain`` of the kernel's bytes: a small broadcast read (the positions
  of a rotary embedding) never picks a 2-D tiling, whose layout conversions cost more;
* reduction, persistent: axes ``x`` (rows) and ``r`` with the whole reduction in
  registers (``RBLOCK = next_pow2(rnumel)``), when ``rnumel`` is static and small;
* reduction, looped: the same axes, ``r`` walked in ``RBLOCK`` steps;
* reduction, split-outer: a column reduction (``x.sum(0)``, ``x.mean(1)`` of ``[A, R, B]``,
  batch norm's statistics over (N, H, W) of a channels-last tensor: a Welford reduction)
  with a long ``r`` and few ``x`` tiles.  Two kernels: the first gives each (x tile, r
  chunk) pair a program (``NSPLIT`` chunks, a power of two) and stores its partial
  accumulators to a workspace ``[NSPLIT, xnumel]`` (three for a Welford reduction: mean,
  M2, count); the second loads each ``x``'s ``[XBLOCK, NSPLIT]`` tile of partials and
  reduces it along the splits (a fixed tree: bitwise reproducible, no atomics; Chan's
  combine for Welford), then runs the x-indexed stores.  On the GPU ``XBLOCK`` spans the
  contiguous run of x the reduced load reads and the programs aim at 8-16 an SM
  (``_split_outer``).
* scan: one program per row walking it in ``RBLOCK`` steps with a carry;
* lookback-scan: few long rows of ``cumsum``/``cumprod``/``logcumsumexp``, one launch:
  each program takes a chunk of ``RBLOCK`` elements (in registers) by an atomic ticket,
  publishes its total, looks back over its predecessors' published totals and prefixes
  (``LOOKBACK`` status words at a time) and scans its chunk from there (decoupled
  look-back, Merrill & Garland); the status words live in a zeroed workspace;
* split-scan: the same rows in two launches (chunk totals, then each chunk's scan from the
  totals before it): cummax/cummin, and every scan under
  ``torch.use_deterministic_algorithms`` (a look-back's float sums depend on timing).

``Plan("pointwise1d", axes=("x",), groups={"x": [x0, x1]}, index_dtype="tl.int32",
configs=[{"XBLOCK": 1024, "num_warps": 4}, ...])``.  Block sizes are ``tl.constexpr``
parameters, so one source serves every config; the plan only fixes the structure.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass, field

import sympy
import torch

from fxwrap.ir.loops import OpCode, ScheduledKernel, load_buffer, rvar, walk, xvar
from fxwrap.core.numerics import compute_dtype
from fxwrap.ir.symbolic import evaluate

INT32_LIMIT = 2 ** 31 - 2 ** 24  # margin for block overshoot past the last element


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def prev_pow2(n: int) -> int:
    """The largest power of two at most ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (int(n).bit_length() - 1)


@dataclass
class Plan:
    """Structure of one kernel; see the module docstring."""

    kind: str                       # pointwise1d | pointwise2d | persistent | looped | split-outer | scan |
    #                                 lookback-scan | split-scan
    axes: tuple[str, ...]           # block axes, in tensor-dimension order
    groups: dict                    # axis -> loop vars (outermost first)
    ranges: dict                    # axis -> their ranges
    index_dtype: str                # "tl.int32" | "tl.int64"
    reduction_shape: str = ""       # "inner" | "outer" (reductions only)
    rblock: int | None = None       # persistent reductions: the fixed RBLOCK
    configs: list = field(default_factory=list)
    extra_constexprs: tuple = ()    # split-outer: ("NSPLIT",); lookback-scan: ("LOOKBACK", "PUBLISH_PREFIX")
    combine_config: dict | None = None  # split-outer: the combine kernel's XBLOCK, num_warps
    scan_chunk: int | None = None   # split-scan: elements of a row per program (a multiple of RBLOCK);
    #                                 lookback-scan: RBLOCK itself

    @property
    def block_names(self) -> tuple[str, ...]:
        return tuple(f"{a.upper()}BLOCK" for a in self.axes) + tuple(self.extra_constexprs)


def _coeff(index, var):
    """The constant step of ``index`` along loop variable ``var`` (0 where it does not use it),
    or None where the step is not constant."""
    return _step(sympy.sympify(index), var)


@functools.lru_cache(maxsize=1 << 14)
def _step(index: sympy.Expr, var: sympy.Symbol):
    """``_coeff`` of a sympy index, memoized: the equal kernels of a model's repeated layers
    (and each kernel's several plans) ask it of the same indices."""
    if var not in index.free_symbols:
        return 0
    d = sympy.diff(index, var)
    return int(d) if d.is_Integer else None


def accesses(kernel: ScheduledKernel, buffers: dict):
    """Every (index, itemsize) a kernel loads or stores (loads deduplicated)."""
    out, seen = [], set()
    roots = [r.value for r in kernel.reductions] + [s.value for s in kernel.stores]
    for root in roots:
        for node in walk(root):
            if node.op == OpCode.LOAD and node.arg[1] is not None and node.arg not in seen:  # direct loads
                seen.add(node.arg)
                buf = buffers.get(load_buffer(node))
                out.append((node.arg[1], buf.dtype.itemsize if buf is not None else 4))
    for st in kernel.stores:
        if st.indexed:  # at offsets computed in the kernel: no stride to coalesce along
            continue
        buf = buffers.get(st.buffer)
        out.append((st.index, buf.dtype.itemsize if buf is not None else 4))
    return out


def index_dtype(kernel: ScheduledKernel) -> str:
    """int32 when every size is static and every buffer's extent fits, else int64."""
    exprs = list(kernel.ranges) + list(kernel.reduction_ranges)
    bufs = list(kernel.inputs) + list(kernel.outputs)
    for b in bufs:
        exprs += list(b.size) + list(b.stride)  # indices are relative to the data pointer
    if kernel.size_symbols or any(sympy.sympify(e).free_symbols for e in exprs):
        return "tl.int64"
    numel = 1
    for n in list(kernel.ranges) + list(kernel.reduction_ranges):
        numel *= int(n)
    if numel >= INT32_LIMIT:
        return "tl.int64"
    for b in bufs:
        extent = sum((int(n) - 1) * abs(int(s))
                                                    for n, s in zip(b.size, b.stride) if int(n) > 0)
        if extent + 1 >= INT32_LIMIT:
            return "tl.int64"
    return "tl.int32"


def _static(e) -> int | None:
    e = sympy.sympify(e)
    return int(e) if e.is_Integer else None


class Planner:
    """Chooses the plan of a kernel; ``interpret`` selects small fixed configs."""

    persistent_max = 4096          # largest RBLOCK kept in registers (GPU)
    persistent_max_interpret = 64  # interpreter: small, so the looped path is exercised too
    # an outer (column) reduction keeps its rows in registers only up to this many: beyond,
    # the tile's x side shrank below 16 values (RBLOCK 1024: 4 bf16, 8 bytes of a 32-byte
    # sector per row) and the looped plan's 32- to 128-wide tiles read whole sectors
    persistent_outer_max = 256
    # split plans: chosen when the x tiles alone give fewer than split_max_programs programs
    # (see _split_outer for the column reductions); a row split aims at
    # split_target_programs programs
    split_max_programs = 264       # two waves of an H200's 132 SMs
    split_target_programs = 528    # at least four per SM
    split_min_chunk = 512          # fewest r elements per program of a row split
    split_max = 64                 # most partials per row of a row split
    split_min_rnumel_interpret = 128
    split_nsplit_interpret = 4     # interpreter: partials per x (tests raise it: wide combine tiles)
    split_min_rows_rnumel = 1 << 16  # a row split pays for its second launch from here on
    split_kinds = frozenset("sum prod max min any all welford argmax argmin".split())

    # mode="max-autotune": every candidate kept, each widened by its neighbours (half and
    # double the innermost block, half and double num_warps), at most this many in all
    max_autotune_configs = 12
    max_block_elements = 1 << 14   # a widened tile holds at most this many elements

    def __init__(self, interpret: bool, hints: dict | None = None, max_autotune: bool = False):
        self.interpret = interpret
        self.hints = dict(hints or {})
        self.max_autotune = max_autotune
        if max_autotune:  # every reduction candidate kept, small reductions included
            self.max_configs = self.max_autotune_configs
            self.small_reduction = 0

    def plan(self, kernel: ScheduledKernel) -> Plan:
        """The kernel's plan; under ``max_autotune`` with the widened candidate set
        (the default candidates first, so the first config is the same in both modes)."""
        plan = self._plan(kernel)
        # (a long-row scan keeps its one config: its chunk fixes the workspace and the grid)
        if self.max_autotune and plan.kind not in ("lookback-scan", "split-scan"):
            plan.configs = self.widened(plan)
        return plan

    def widened(self, plan: Plan) -> list[dict]:
        """``plan.configs`` and, after them, each one's neighbours: its innermost free block
        (``XBLOCK``; not a persistent reduction's fixed RBLOCK, not NSPLIT) halved and
        doubled, and num_warps halved and doubled (1 to 16), within ``max_block_elements``."""
        out = [dict(c) for c in plan.configs]
        free = [b for b in plan.block_names if b not in ("NSPLIT",)]
        if plan.rblock is not None:
            free = [b for b in free if b != "RBLOCK"]
        block = "XBLOCK" if "XBLOCK" in free else (free[-1] if free else None)
        for cfg in list(plan.configs):
            neighbours = []
            if block is not None and block in cfg:
                neighbours += [{**cfg, block: max(1, cfg[block] // 2)}, {**cfg, block: cfg[block] * 2}]
            warps = cfg.get("num_warps", 4)
            neighbours += [{**cfg, "num_warps": max(1, warps // 2)}, {**cfg, "num_warps": min(16, warps * 2)}]
            for n in neighbours:
                elements = 1
                for b in plan.block_names:
                    if b != "NSPLIT":
                        elements *= n.get(b, plan.rblock if b == "RBLOCK" and plan.rblock else 1)
                if n not in out and elements <= self.max_block_elements:
                    out.append(n)
        return out[:max(self.max_autotune_configs, len(plan.configs))]

    def _plan(self, kernel: ScheduledKernel) -> Plan:
        buffers = {b.name: b for b in (*kernel.inputs, *kernel.outputs)}
        idt = index_dtype(kernel)
        xv = [xvar(i) for i in range(len(kernel.ranges))]
        rv = [rvar(i) for i in range(len(kernel.reduction_ranges))]
        if kernel.is_scan:
            return self._scan(kernel, idt, xv, rv)
        if kernel.reductions:
            return self._reduction(kernel, buffers, idt, xv, rv)
        # a pointwise kernel with reduction_ranges (no reductions) iterates them as x vars
        ranges = list(kernel.ranges) + list(kernel.reduction_ranges)
        vars_ = xv + rv
        split = self._split(kernel, buffers, vars_, ranges)
        if split is None:
            configs = self._pointwise1d_configs(ranges)
            return Plan("pointwise1d", ("x",), {"x": vars_}, {"x": ranges}, idt, configs=configs)
        configs = self._pointwise2d_configs(ranges[:split], ranges[split:])
        return Plan("pointwise2d", ("y", "x"), {"y": vars_[:split], "x": vars_[split:]},
                    {"y": ranges[:split], "x": ranges[split:]}, idt, configs=configs)

    # -- pointwise -------------------------------------------------------------
    # what a 2-D tiling must save, as a share of the kernel's bytes, to be chosen over 1-D
    pointwise2d_min_gain = 0.125
    sector_bytes = 32              # a strided element costs a whole sector of a 1-D tiling

    def _split(self, kernel, buffers, vars_, ranges):
        """Index where the y group ends, or None for 1-D.

        Each access weighs the bytes it moves (``_footprint``).  A split gains, for every
        access it coalesces that the 1-D tiling leaves strided along the last var, those
        bytes times the sectors wasted on them (``sector_bytes / itemsize``, at most the
        stride); an access constant along the last var (a broadcast read: a rotary
        embedding's positions) loses nothing in 1-D and gains only its bytes.  The best
        split is taken when its gain reaches ``pointwise2d_min_gain`` of the kernel's
        bytes: below, the 2-D tile's layout conversions and registers cost more (HF
        Llama's rotary kernels: 177 registers a thread against 80 on sm_90, 2.5x slower)."""
        if len(vars_) < 2:
            return None
        last = vars_[-1]
        acc, total = [], 0                # acc: (index, what 1-D loses on it) of each strided access
        for index, size in accesses(kernel, buffers):
            nbytes = self._footprint(index, size, vars_, ranges)
            total += nbytes
            stride = _coeff(index, last)
            if stride == 1:
                continue  # coalesced either way
            waste = 1 if stride == 0 else max(1, self.sector_bytes // size)
            if stride is not None and stride != 0:
                waste = min(waste, abs(stride))
            acc.append((index, nbytes * waste))

        best, best_gain = None, 0
        for i in range(len(vars_) - 1):
            if _static(ranges[i]) == 1:
                continue
            gain = sum(cost for index, cost in acc if _coeff(index, vars_[i]) == 1)
            if gain > best_gain:
                best, best_gain = i + 1, gain
        return best if best_gain >= total * self.pointwise2d_min_gain else None

    def _footprint(self, index, itemsize: int, vars_, ranges) -> int:
        """Bytes an access moves: ``itemsize`` times the elements its index reaches (the
        product of the ranges of the loop vars it uses).  A broadcast read (the positions of
        a rotary embedding, ``[S]`` read by a ``[B, H, S, D]`` kernel) moves little however
        it is laid out, so it must not outweigh the full-size reads and the store when the
        tiling is chosen; a range without a static value or hint counts as unbounded."""
        used = sympy.sympify(index).free_symbols
        elements = 1
        for v, r in zip(vars_, ranges):
            if v in used:
                n = self._hint([r])
                if n is None:
                    return itemsize << 62
                elements *= n
        return itemsize * elements

    # Pointwise kernels are memory-bound: one config from a heuristic, not autotuned
    # (cold compile time); reductions keep at most ``max_configs`` candidates.
    max_configs = 3
    small_reduction = 1 << 18      # elements read: at most this, one config

    def _pointwise1d_configs(self, ranges):
        numel = _static(sympy.Mul(*[sympy.sympify(r) for r in ranges])) if ranges else 1
        if numel is None:
            numel = self._hint(ranges)
        if self.interpret:
            return [{"XBLOCK": 1024 if numel is None else min(1024, next_pow2(numel)), "num_warps": 4}]
        xb = 1024 if numel is None else max(16, min(1024, next_pow2(numel)))
        return [{"XBLOCK": xb, "num_warps": 4 if xb >= 512 else 2 if xb >= 128 else 1}]

    def _pointwise2d_configs(self, yranges, xranges):
        if self.interpret:
            return [{"YBLOCK": 16, "XBLOCK": 16, "num_warps": 4}]
        yn = _static(sympy.Mul(*[sympy.sympify(r) for r in yranges])) if yranges else 1
        xn = _static(sympy.Mul(*[sympy.sympify(r) for r in xranges])) if xranges else 1
        ycap = next_pow2(yn) if yn is not None else 1 << 20
        xcap = next_pow2(xn) if xn is not None else 1 << 20
        yb, xb = min(64, ycap), min(64, xcap)
        while yb * xb < 4096 and (yb < min(ycap, 1024) or xb < min(xcap, 1024)):  # a small dim: widen the other
            if xb < min(xcap, 1024):
                xb *= 2
            else:
                yb *= 2
        return [{"YBLOCK": yb, "XBLOCK": xb, "num_warps": 4 if yb * xb >= 1024 else 2}]

    # -- reductions ------------------------------------------------------------
    def _reduction(self, kernel, buffers, idt, xv, rv):
        groups = {"x": xv, "r": rv}
        ranges = {"x": list(kernel.ranges), "r": list(kernel.reduction_ranges)}
        shape = self._shape(kernel, buffers, xv, rv)
        rnumel = _static(sympy.Mul(*[sympy.sympify(r) for r in kernel.reduction_ranges]))
        xnumel = _static(sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges])) if kernel.ranges else 1
        limit = self.persistent_max_interpret if self.interpret else self.persistent_max
        if shape == "outer" and self._splittable(kernel):
            split = self._split_outer(kernel, groups, ranges, idt)
            if split is not None:
                return split
        if shape == "inner" and self._splittable(kernel):
            split = self._split_rows(kernel, groups, ranges, idt)
            if split is not None:
                return split
        # a small reduction (by its sizes or their hints) is launch-bound: no autotuning
        total = self._hint(list(kernel.ranges) + list(kernel.reduction_ranges))
        keep = 1 if total is not None and total <= self.small_reduction else self.max_configs
        if shape == "outer" and not self.interpret:  # x tiles narrow enough to hold the rows
            limit = min(limit, self.persistent_outer_max)
        if rnumel is not None and next_pow2(rnumel) <= limit:
            rb = next_pow2(rnumel)
            configs = self._persistent_configs(rb, xnumel, shape)[:keep]
            return Plan("persistent", ("x", "r"), groups, ranges, idt, shape, rb, configs)
        configs = self._looped_configs(xnumel, rnumel, shape)[:keep]
        return Plan("looped", ("x", "r"), groups, ranges, idt, shape, None, configs)

    # -- scans -----------------------------------------------------------------
    scan_rblock = 1024             # elements of a row one step of a scan program holds (GPU)
    scan_rblock_interpret = 16     # interpreter: small, so the loop over a row's chunks runs
    # split scan: a row this long, with too few rows to fill the GPU, is cut into chunks of
    # SCAN_CHUNK elements, one program each (chunk totals, their scan, then the fix-up)
    scan_split_min_rnumel = 1 << 15
    scan_split_min_rnumel_interpret = 64
    scan_chunk = 1 << 14           # most elements per program of a split scan (GPU)
    scan_split_rblock = 2048
    scan_chunk_interpret = 32

    # look-back scan: the rows a split scan would take, in one launch (see the module docstring)
    scan_lookback = True           # False: long rows keep the two-launch split scan
    lookback_kinds = frozenset({"cumsum", "cumprod", "logcumsumexp"})
    lookback_min_chunk = 1024      # elements per program (GPU): RBLOCK, the chunk held in registers
    lookback_max_chunk = 16384
    # programs of one look-back scan: one wave (a program per SM of an H100/H200; at
    # 56-170 registers a thread, one 8-16-warp program fills an SM's registers).  A later
    # wave's programs start only when earlier ones end, so with four waves (528 programs
    # of 2048 elements) the look-back chain waited on them: 8.5 us for a 1x1M cumsum on
    # the H200 against 6.2 us for the two-launch split scan.
    lookback_target_programs = 132
    # elements of the scanned rows from which the look-back plan runs (GPU): below, the two
    # launches of the split scan were faster on the H200 (cumsum 1x1M 6.1 vs 9.4 us, 1x4M
    # 12.7 vs 17.2, 8x131072 5.9 vs 6.7), above, the look-back (1x16M 55.3 vs 63.2 us)
    lookback_min_elements = 1 << 23
    lookback_chunk_interpret = 16  # interpreter: small, so rows have many chunks
    lookback_window = 32           # predecessors' status words one look-back step reads (GPU)
    lookback_window_interpret = 4  # interpreter: several look-back steps per chunk
    # False: programs publish only their chunk's total, never their inclusive prefix, so every
    # look-back walks to the row's start over totals (tests: the interpreter runs programs in
    # ticket order, where the look-back would otherwise stop at the nearest predecessor)
    lookback_publish_prefix = True

    def _scan(self, kernel, idt, xv, rv) -> Plan:
        """One program per row (``XBLOCK = 1``) walking it in ``RBLOCK`` steps with a carry
        (plan ``scan``); or, for long rows and few of them, ``lookback-scan`` where every
        scan of the kernel can (``lookback_scans``), else ``split-scan``."""
        groups = {"x": xv, "r": rv}
        ranges = {"x": list(kernel.ranges), "r": list(kernel.reduction_ranges)}
        rnumel = _static(sympy.Mul(*[sympy.sympify(r) for r in kernel.reduction_ranges]))
        rhint = rnumel if rnumel is not None else self._hint(list(kernel.reduction_ranges))
        xhint = self._hint(list(kernel.ranges)) if kernel.ranges else 1
        cap = self.scan_rblock_interpret if self.interpret else self.scan_rblock
        rb = min(cap, next_pow2(rhint)) if rhint is not None else cap
        nw = 1 if rb <= 128 else 2 if rb <= 256 else 4 if rb <= 1024 else 8
        split_min = self.scan_split_min_rnumel_interpret if self.interpret else self.scan_split_min_rnumel
        if rhint is not None and rhint >= split_min and xhint is not None and xhint < self.split_max_programs:
            if self.lookback_scans(kernel) and (self.interpret or rhint * xhint >= self.lookback_min_elements):
                return self._lookback(groups, ranges, idt, rhint * xhint)
            if self.interpret:
                rb, chunk, nw = self.scan_rblock_interpret, self.scan_chunk_interpret, 1
            else:  # about split_target_programs programs, each at least one RBLOCK step
                rb, nw = self.scan_split_rblock, 8
                chunk = max(rb, min(self.scan_chunk, next_pow2(-(-rhint * xhint // self.split_target_programs))))
            return Plan("split-scan", ("x", "r"), groups, ranges, idt, "inner", None,
                        [{"XBLOCK": 1, "RBLOCK": rb, "num_warps": nw}], scan_chunk=chunk)
        return Plan("scan", ("x", "r"), groups, ranges, idt, "inner", None,
                    [{"XBLOCK": 1, "RBLOCK": rb, "num_warps": nw}])

    def lookback_scans(self, kernel) -> bool:
        """Whether a long-row scan kernel takes the look-back plan: every scan a
        ``lookback_kinds`` one whose running state is 32 or 64 bits (float32 for 16-bit
        floats, int64 for integers and bool), and results need not be bitwise reproducible
        (``torch.use_deterministic_algorithms``: the two-launch split scan combines in a
        fixed order)."""
        if not self.scan_lookback or torch.are_deterministic_algorithms_enabled():
            return False
        for red in kernel.reductions:
            if red.kind not in self.lookback_kinds:
                return False
            if compute_dtype(red.dtype).itemsize not in (4, 8):
                return False
        return True

    def _lookback(self, groups, ranges, idt, elements: int) -> Plan:
        """Plan ``lookback-scan``: one program per chunk of ``RBLOCK`` elements of a row, at
        most about ``lookback_target_programs`` of them (each chunk within the
        ``lookback_*_chunk`` bounds)."""
        if self.interpret:
            chunk, nw, window = self.lookback_chunk_interpret, 1, self.lookback_window_interpret
        else:
            chunk = next_pow2(-(-elements // self.lookback_target_programs))
            chunk = max(self.lookback_min_chunk, min(self.lookback_max_chunk, chunk))
            nw, window = max(4, min(16, chunk // 512)), self.lookback_window
        cfg = {"XBLOCK": 1, "RBLOCK": chunk, "LOOKBACK": window,
               "PUBLISH_PREFIX": int(bool(self.lookback_publish_prefix)), "num_warps": nw}
        return Plan("lookback-scan", ("x", "r"), groups, ranges, idt, "inner", None, [cfg],
                    extra_constexprs=("LOOKBACK", "PUBLISH_PREFIX"), scan_chunk=chunk)

    # -- split-outer -----------------------------------------------------------
    def _hint(self, ranges) -> int | None:
        expr = sympy.Mul(*[sympy.sympify(r) for r in ranges]) if ranges else sympy.Integer(1)
        try:
            return int(evaluate(expr, self.hints))
        except (KeyError, TypeError, ValueError):
            return None

    def _splittable(self, kernel) -> bool:
        """Only reductions the combine kernel can finish: plain kinds, one pass (no
        reduction reads another's result), and stores indexed by an ``r`` var only where
        they do not read a reduction's result (the partials kernel makes them, each
        element once, in the chunk that holds it: a bias gradient fused with the
        gradient it sums)."""
        if not kernel.reduction_ranges or any(r.kind not in self.split_kinds for r in kernel.reductions):
            return False
        for red in kernel.reductions:
            if any(n.op == OpCode.ACC for n in walk(red.value)):
                return False
        rnames = {rvar(i).name for i in range(len(kernel.reduction_ranges))}
        for st in kernel.stores:
            if any(s.name in rnames for s in sympy.sympify(st.index).free_symbols) and \
                    any(n.op == OpCode.ACC for n in walk(st.value)):
                return False
        return True

    # split-outer on the GPU.  Each candidate is (elements of a [XBLOCK, RBLOCK] tile, num_warps,
    # programs aimed at).  A memory-bound kernel is at bandwidth when every SM keeps enough
    # loads in flight (on an H100 about 32 KiB or more): 1056 programs of 4 warps are 8
    # programs (32 warps) an SM in one wave, each loading 8-16 KiB a step.  Before, 528
    # programs were aimed at and NSPLIT was at most 64, so batch norm's statistics over 64
    # channels ran 64 to 256 programs (25% of copy on the H100).
    split_outer_candidates = ((4096, 4, 1056), (8192, 8, 1056), (4096, 4, 2112), (2048, 4, 2112))
    split_outer_max = 1024         # most partials per x: the combine reduces [XBLOCK, NSPLIT] tiles
    split_outer_min_steps = 1      # fewest RBLOCK steps per program
    split_outer_min_rnumel = 512   # below, the persistent / looped plans (one program per x tile)
    combine_elements = 4096        # the combine kernel's tile: XBLOCK * NSPLIT at most this
    x_run_bytes = 128              # XBLOCK covers this many contiguous bytes of a row where it can

    def _split_outer(self, kernel, groups, ranges, idt):
        """Plan ``split-outer`` for a column reduction with too few x tiles to fill the GPU.

        ``XBLOCK`` spans the contiguous run of x the main load reads (up to
        ``x_run_bytes``; a channels-last tensor's C, the B of ``[A, R, B]``), so a tile's
        rows are whole 32-byte sectors and, where the run is short, consecutive ``r`` rows
        continue the same contiguous bytes; ``RBLOCK`` fills the tile.  ``NSPLIT`` (a power of
        two) brings the programs near the candidate's aim, with at least
        ``split_outer_min_steps`` steps each."""
        xn, rn = self._hint(kernel.ranges), self._hint(kernel.reduction_ranges)
        if xn is None or rn is None or xn < 1:
            return None
        if self.interpret:
            if rn < self.split_min_rnumel_interpret:
                return None
            xb = max(1, min(8, next_pow2(xn)))
            configs = [{"XBLOCK": xb, "RBLOCK": 32, "NSPLIT": self.split_nsplit_interpret, "num_warps": 4}]
            combine = {"XBLOCK": max(1, min(16, next_pow2(xn))), "num_warps": 4}
            return Plan("split-outer", ("x", "r"), groups, ranges, idt, "outer", None, configs,
                        extra_constexprs=("NSPLIT",), combine_config=combine)
        if rn < self.split_outer_min_rnumel or -(-xn // 64) >= self.split_max_programs:
            return None
        run, itemsize = self._x_run(kernel, groups["x"])
        if run <= 1:  # no reduced load contiguous in x (or its sizes unknown): a 16-wide tile
            run = 16
        xb = max(1, min(next_pow2(xn), next_pow2(run), max(1, self.x_run_bytes // itemsize)))
        configs = []
        for elements, nw, aim in self.split_outer_candidates:
            rb = max(1, elements // xb)
            tiles = -(-xn // xb)
            nsplit = next_pow2(-(-aim // tiles))
            most = prev_pow2(max(1, rn // (rb * self.split_outer_min_steps)))
            nsplit = min(nsplit, self.split_outer_max, most)
            cfg = {"XBLOCK": xb, "RBLOCK": rb, "NSPLIT": nsplit, "num_warps": nw}
            if nsplit >= 2 and cfg not in configs:
                configs.append(cfg)
        if not configs:
            return None
        most = max(c["NSPLIT"] for c in configs)
        cb = max(1, min(next_pow2(xn), self.combine_elements // most))
        combine = {"XBLOCK": cb, "num_warps": 4 if cb * most >= 1024 else 2}
        return Plan("split-outer", ("x", "r"), groups, ranges, idt, "outer", None, configs,
                    extra_constexprs=("NSPLIT",), combine_config=combine)

    def _x_run(self, kernel, xv) -> tuple[int, int]:
        """(elements, itemsize) of the longest contiguous run of x of a reduced read (an
        access that uses an ``r`` var) contiguous in the innermost x var: the product of
        the innermost x ranges whose strides continue it (``[A, R, B]`` read ``R``-reduced:
        ``B``; the output store, contiguous in every x var, does not count)."""
        buffers = {b.name: b for b in (*kernel.inputs, *kernel.outputs)}
        rnames = {rvar(i).name for i in range(len(kernel.reduction_ranges))}
        best = (1, 4)
        if not xv:
            return best
        for index, size in accesses(kernel, buffers):
            used = {s.name for s in sympy.sympify(index).free_symbols}
            if _coeff(index, xv[-1]) != 1 or not used & rnames:
                continue
            run = 1
            for v, r in zip(reversed(xv), reversed(list(kernel.ranges))):
                n = self._hint([r])
                if n is None or _coeff(index, v) != run:
                    break
                run *= n
            best = max(best, (run, size))
        return best

    def _split_rows(self, kernel, groups, ranges, idt):
        """A few long rows (``x.sum()``, a loss): one program per row leaves the GPU idle,
        so each row is cut into NSPLIT chunks reduced by programs of their own (``[1,
        RBLOCK]`` tiles, contiguous along the row) and combined in order."""
        xn, rn = self._hint(kernel.ranges), self._hint(kernel.reduction_ranges)
        if xn is None or rn is None or xn < 1:
            return None
        if self.interpret:
            if xn > 4 or rn < self.split_min_rnumel_interpret:
                return None
            configs = [{"XBLOCK": 1, "RBLOCK": 32, "NSPLIT": self.split_nsplit_interpret, "num_warps": 4}]
        else:
            if xn >= self.split_max_programs // 2 or rn < self.split_min_rows_rnumel:
                return None
            configs = []
            for rb, nw in ((1024, 4), (2048, 8)):
                nsplit = next_pow2(-(-self.split_target_programs // xn))
                # (a power of two: the combine kernel reduces [XBLOCK, NSPLIT] tiles)
                nsplit = max(2, min(nsplit, self.split_max, prev_pow2(rn // max(rb, self.split_min_chunk))))
                cfg = {"XBLOCK": 1, "RBLOCK": rb, "NSPLIT": nsplit, "num_warps": nw}
                if nsplit >= 2 and cfg not in configs:
                    configs.append(cfg)
            if not configs:
                return None
        combine = {"XBLOCK": max(1, min(16, next_pow2(xn))), "num_warps": 1}
        return Plan("split-outer", ("x", "r"), groups, ranges, idt, "inner", None, configs,
                    extra_constexprs=("NSPLIT",), combine_config=combine)

    def _shape(self, kernel, buffers, xv, rv) -> str:
        """``outer`` when most bytes read are contiguous along an x var (``x.sum(0)``).

        Each access weighs the bytes it moves (``_footprint``): in RMSNorm's weight gradient
        (``(grad * x * rstd[:, None]).sum(0)``) the per-row ``rstd`` is contiguous in ``r``
        but is 1/1024 of the bytes; counted by its element size alone it tied the two
        ``[rows, width]`` reads, and the kernel ran one program per column reading it
        down the rows (16 of every 32-byte sector wasted)."""
        inner = outer = 0
        vars_ = list(xv) + list(rv)
        ranges = list(kernel.ranges) + list(kernel.reduction_ranges)
        for index, size in accesses(kernel, buffers):
            nbytes = self._footprint(index, size, vars_, ranges)
            if rv and _coeff(index, rv[-1]) == 1:
                inner += nbytes
            elif xv and _coeff(index, xv[-1]) == 1 and any(_coeff(index, r) not in (0,) for r in rv):
                outer += nbytes
        return "outer" if outer > inner else "inner"

    def _persistent_configs(self, rb, xnumel, shape):
        cap = next_pow2(xnumel) if xnumel is not None else 1 << 20
        if self.interpret:
            return [{"XBLOCK": max(1, min(8, cap)), "num_warps": 4}]
        out = []
        if shape == "outer":
            cands = [(max(1, min(64, 4096 // rb)), 4), (max(1, min(32, 2048 // rb)), 4), (max(1, min(128, 8192 // rb)), 8)]
        else:
            warps = 4 if rb <= 1024 else 8
            cands = [(1, warps), (max(1, min(8, 2048 // rb)), 4), (max(1, min(32, 4096 // rb)), 8)]
            if rb <= 256:  # short rows: several rows per program, never one
                cands = cands[1:] + [(max(1, 4096 // rb // 2), 4)]
        for xb, nw in cands:
            cfg = {"XBLOCK": max(1, min(xb, cap)), "num_warps": nw}
            if cfg not in out:
                out.append(cfg)
        return out[:self.max_configs]

    def _looped_configs(self, xnumel, rnumel, shape):
        cap = next_pow2(xnumel) if xnumel is not None else 1 << 20
        if self.interpret:
            return [{"XBLOCK": max(1, min(4, cap)), "RBLOCK": 32, "num_warps": 4}]
        if shape == "outer":
            cands = [(64, 32, 4), (128, 16, 4), (32, 64, 4), (64, 64, 8)]
        else:
            cands = [(1, 2048, 8), (1, 1024, 4), (4, 512, 4), (8, 256, 4)]
        out = []
        for xb, rb, nw in cands:
            cfg = {"XBLOCK": max(1, min(xb, cap)), "RBLOCK": rb, "num_warps": nw}
            if cfg not in out:
                out.append(cfg)
        return out[:self.max_configs]
