"""Plan ``lookback-scan``: a long-row scan in one launch, with decoupled look-back.

Merrill & Garland, "Single-pass Parallel Prefix Scan with Decoupled Look-back" (2016):
every program scans one chunk of ``RBLOCK`` elements of a row, held in registers, and
gets the combined value of the chunks before it from *status words* its predecessors
publish in a workspace, so the input is read once and written once.

* forward progress: a program takes its chunk by a ticket (``tl.atomic_add`` on word 0
  of the workspace), not by ``tl.program_id``: a chunk only waits on chunks with smaller
  tickets, whose programs are already running;
* a program publishes its chunk's *total* (flag 1) as soon as it has it, scans its chunk,
  looks back over the ``LOOKBACK`` status words before its chunk at once (nearest first)
  until it meets a published *inclusive prefix* (flag 2) or the row's start, publishes its
  own inclusive prefix (unless ``PUBLISH_PREFIX`` is 0: tests), and stores its chunk's scan
  combined with the exclusive prefix;
* a 32-bit running state (float32: also for 16-bit floats) shares one 64-bit word with its
  flag, ``(bits << 32) | flag``, written by one atomic exchange and read by one volatile
  load: no ordering between two words to get right.  A 64-bit state (int64 for integer
  and bool inputs, float64) takes three words per chunk, ``flag, total, prefix``: the
  value is exchanged first, then the flag with ``sem="release"``; readers take the flags
  with ``sem="acquire"`` before loading the values.

The workspace is one ``int64`` buffer, zeroed before the launch (a ``ZeroFill`` line):
``[ticket, scan 0: words * xnumel * nchunks, scan 1: ...]``.  ``torch.cumsum(x, -1)`` of a
float32 ``(1, 1048576)`` tensor renders as (the chunk's scan runs while its predecessors
publish; the look-back comes after it)::

    @triton.jit
    def fxwrap_scan_0(in_ptr0, out_ptr0, ws_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr,
                      LOOKBACK: tl.constexpr, PUBLISH_PREFIX: tl.constexpr):
        ...
        nchunks = (rnumel + RBLOCK - 1) // RBLOCK
        ticket = tl.atomic_add(ws_ptr0, 1, sem="relaxed").to(tl.int32)
        chunk = ticket % nchunks
        xoffset = ticket // nchunks
        ...
        rindex = chunk * RBLOCK + rbase
        ...
        tmp0 = tl.load(in_ptr0 + (r0), rmask, other=0)
        _scan0_v = tl.where(xrmask, tmp0, tl.full([], 0, tl.float32))
        _scan0_t = tl.reduce(tl.reduce(_scan0_v, 1, _fx_add), 0, _fx_add)
        _scan0_ws = ws_ptr0 + (1 + xoffset * nchunks)
        tl.atomic_xchg(_scan0_ws + chunk, (_scan0_t.to(tl.int32, bitcast=True).to(tl.int64) << 32) | 1,
                       sem="relaxed")
        _scan0_sc = tl.associative_scan(_scan0_v, 1, _fx_add)
        _scan0_p = tl.full([], 0, tl.float32)
        _scan0_end = chunk
        while _scan0_end > 0:
            _scan0_at = _scan0_end - 1 - lanes
            _scan0_w = tl.load(_scan0_ws + _scan0_at, _scan0_at >= 0, other=2, volatile=True)
            _scan0_f = _scan0_w & 3
            _scan0_x = (_scan0_w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            _scan0_first = tl.reduce(tl.where(_scan0_f == 2, lanes, LOOKBACK), 0, _fx_min)
            _scan0_gap = tl.reduce(tl.where(_scan0_f == 0, lanes, LOOKBACK), 0, _fx_min)
            _scan0_ready = _scan0_gap >= tl.minimum(_scan0_first + 1, LOOKBACK)
            _scan0_s = tl.reduce(tl.where(lanes <= _scan0_first, _scan0_x, tl.full([], 0, tl.float32)), 0,
                                 _fx_add)
            _scan0_p = tl.where(_scan0_ready, _fx_add(_scan0_s, _scan0_p), _scan0_p)
            _scan0_end = tl.where(_scan0_ready, tl.where(_scan0_first < LOOKBACK, 0, _scan0_end - LOOKBACK),
                                  _scan0_end)
        _scan0_i = _fx_add(_scan0_p, _scan0_t)
        if PUBLISH_PREFIX:
            tl.atomic_xchg(_scan0_ws + chunk, (_scan0_i.to(tl.int32, bitcast=True).to(tl.int64) << 32) | 2,
                           sem="relaxed")
        _scan0 = _fx_add(_scan0_p, _scan0_sc)
        tl.store(out_ptr0 + (r0 + _zero_xr), _scan0, xmask & rmask)

A window waits (reads again) until every word up to its nearest prefix is published; words
beyond that prefix are neither waited for nor combined.

Float results may differ in the last bits from run to run (which predecessors had published
their prefix decides how the totals are grouped); ``Planner.lookback_scans`` keeps the
two-launch split scan under ``torch.use_deterministic_algorithms``.
"""
from __future__ import annotations

import struct

import sympy
import torch

from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import CodegenError, KernelWriter, Scope
from fxwrap.targets.cuda_triton.reduction import COMBINE
from fxwrap.targets.cuda_triton.scan import ScanWriter, scan_fields

TOTAL, PREFIX = 1, 2  # status flags: the chunk's total, the inclusive prefix up to its end


def _bits_literal(init: str, dtype: torch.dtype) -> int:
    """The bit pattern (as a signed integer of the dtype's width) of a scan's initial value."""
    value = {"0": 0, "1": 1, 'float("-inf")': float("-inf")}[init]
    if dtype == torch.float32:
        return struct.unpack("<i", struct.pack("<f", float(value)))[0]
    if dtype == torch.float64:
        return struct.unpack("<q", struct.pack("<d", float(value)))[0]
    return int(value)


class LookbackScanWriter:
    """Writes the one kernel of plan ``lookback-scan`` (see the module docstring) through the
    kernel's ``codegen.KernelWriter``: ``LookbackScanWriter(writer).write() -> body lines``;
    ``workspace_numel(xnumel, nchunks)`` is the size of its ``int64`` status workspace
    (``ws_ptr0``).  A scan's state, combine and locals are the plain scan's (``scan.ScanWriter``)."""

    def __init__(self, writer: KernelWriter):
        self.w = writer
        self.kernel = kernel = writer.kernel
        self.plan = writer.plan
        self.scans = ScanWriter(writer)
        for red in kernel.reductions:
            if red.kind not in ("cumsum", "cumprod", "logcumsumexp") or self.state_bits(red) not in (32, 64):
                raise CodegenError(f"kernel {kernel.name}: scan {red.kind} of {red.dtype} has no look-back "
                                   f"status word (target {writer.target_name}); the planner keeps it a split scan")

    # ------------------------------------------------------------------ layout
    @staticmethod
    def state_dtype(red) -> torch.dtype:
        return scan_fields(red)[0][1]

    def state_bits(self, red) -> int:
        return self.state_dtype(red).itemsize * 8

    def words_per_chunk(self, red) -> int:
        """1: value and flag packed in one word; 3: flag, total, prefix."""
        return 1 if self.state_bits(red) == 32 else 3

    def workspace_numel(self, xnumel, nchunks):
        """Words of the status workspace: the ticket, then each scan's words of every chunk."""
        words = sum(self.words_per_chunk(red) for red in self.kernel.reductions)
        return 1 + words * sympy.sympify(xnumel) * sympy.sympify(nchunks)

    # ------------------------------------------------------------------ words
    def _as_bits(self, value: str, dtype: torch.dtype) -> str:
        """``value`` (of ``dtype``) as a signed integer of its width."""
        if dtype.is_floating_point:
            return f"{value}.to({O.TL_TYPES[torch.int32 if dtype.itemsize == 4 else torch.int64]}, bitcast=True)"
        return value

    def _from_bits(self, bits: str, dtype: torch.dtype) -> str:
        if dtype.is_floating_point:
            return f"{bits}.to({O.TL_TYPES[dtype]}, bitcast=True)"
        return bits

    def _packed(self, value: str, dtype: torch.dtype, flag: int) -> str:
        return f"({self._as_bits(value, dtype)}.to(tl.int64) << 32) | {flag}"

    def _publish(self, base: str, red, value: str, flag: int) -> list[str]:
        """Lines that publish ``value`` with ``flag`` in this chunk's status word(s)."""
        T = self.state_dtype(red)
        if self.words_per_chunk(red) == 1:
            # one word holds value and flag: atomic on its own, nothing else to order
            return [f'tl.atomic_xchg({base}_ws + chunk, {self._packed(value, T, flag)}, sem="relaxed")']
        bits = self._as_bits(value, T)
        return [f'tl.atomic_xchg({base}_ws + 3 * chunk + {flag}, {bits}, sem="relaxed")',
                "tl.debug_barrier()",
                f'tl.atomic_xchg({base}_ws + 3 * chunk, {flag}, sem="release")']

    def _window(self, base: str, red, init_bits: int) -> list[str]:
        """Lines (in the look-back loop) reading the ``LOOKBACK`` status words before
        ``{base}_end``, nearest first, as ``{base}_f`` (flags; a word before the row's start
        reads as a prefix of the initial value) and ``{base}_x`` (the values)."""
        T = self.state_dtype(red)
        lines = [f"{base}_at = {base}_end - 1 - lanes"]
        if self.words_per_chunk(red) == 1:
            word = (init_bits << 32) | PREFIX
            lines += [f"{base}_w = tl.load({base}_ws + {base}_at, {base}_at >= 0, other={word}, volatile=True)",
                      f"{base}_f = {base}_w & 3",
                      f"{base}_x = {self._from_bits(f'({base}_w >> 32).to(tl.int32)', T)}"]
            return lines
        lines += [f"{base}_in = {base}_at >= 0",
                  f'{base}_f = tl.where({base}_in, tl.atomic_add({base}_ws + 3 * {base}_at, 0, mask={base}_in, '
                  f'sem="acquire"), {PREFIX})',
                  "tl.debug_barrier()",
                  f"{base}_w = tl.load({base}_ws + 3 * {base}_at + tl.where({base}_f == {PREFIX}, {PREFIX}, {TOTAL}), "
                  f"{base}_in & ({base}_f != 0), other={init_bits}, volatile=True)",
                  f"{base}_x = {self._from_bits(f'{base}_w', T)}"]
        return lines

    # ------------------------------------------------------------------ body
    def write(self) -> list[str]:
        w, p = self.w, self.plan
        top = w.function_scope(p.groups)
        body = w.size_casts()
        ticket = 'tl.atomic_add(ws_ptr0, 1, sem="relaxed")' + ("" if w.int64 else ".to(tl.int32)")
        body += [f"xnumel = {w.numel(p.ranges['x'])}",
                 f"rnumel = {w.numel(p.ranges['r'])}",
                 "nchunks = (rnumel + RBLOCK - 1) // RBLOCK",
                 f"ticket = {ticket}",
                 "chunk = ticket % nchunks",
                 "xoffset = ticket // nchunks",
                 "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
                 "xmask = xindex < xnumel",
                 f"rbase = {w.block_lanes()}",
                 "rindex = chunk * RBLOCK + rbase",
                 "rmask = rindex < rnumel",
                 "xrmask = xmask & rmask",
                 "lanes = tl.arange(0, LOOKBACK)",
                 *w.decompose("xindex", p.groups["x"], p.ranges["x"]),
                 *w.decompose("rindex", p.groups["r"], p.ranges["r"])]
        before = 0  # status words per (row, chunk) of the scans before this one
        for red in self.kernel.reductions:
            self._scan(top, red, before)
            before += self.words_per_chunk(red)
        for st in self.kernel.stores:
            w.store(top, st, ("x", "r"))
        return w.with_zeros(body + top.lines)

    def _scan(self, top: Scope, red, before: int) -> None:
        base = self.scans.local(red)
        _, T, init = scan_fields(red)[0]
        tt = O.TL_TYPES[T]
        fn = self.scans.combine(red)
        low = self.w.helper(COMBINE["min"])
        v = O.cast(self.w.value(top, red.value), red.value.dtype, red.dtype)
        words = self.words_per_chunk(red)
        area = f"{before} * xnumel * nchunks + " if before else ""
        row = f"{words} * xoffset" if words > 1 else "xoffset"
        init_bits = _bits_literal(init, T)
        lines = [f"{base}_v = tl.where(xrmask, {v}, tl.full([], {init}, {tt}))",
                 f"{base}_t = tl.reduce(tl.reduce({base}_v, 1, {fn}), 0, {fn})",
                 f"{base}_ws = ws_ptr0 + (1 + {area}{row} * nchunks)",
                 *self._publish(base, red, f"{base}_t", TOTAL),
                 # the chunk's own scan while the chunks before publish theirs
                 f"{base}_sc = tl.associative_scan({base}_v, 1, {fn})",
                 # the exclusive prefix: every chunk before this one, combined
                 f"{base}_p = tl.full([], {init}, {tt})",
                 f"{base}_end = chunk",
                 f"while {base}_end > 0:"]
        loop = self._window(base, red, init_bits)
        loop += [f"{base}_first = tl.reduce(tl.where({base}_f == {PREFIX}, lanes, LOOKBACK), 0, {low})",
                 f"{base}_gap = tl.reduce(tl.where({base}_f == 0, lanes, LOOKBACK), 0, {low})",
                 # every word up to the nearest prefix (or the whole window) is published
                 f"{base}_ready = {base}_gap >= tl.minimum({base}_first + 1, LOOKBACK)",
                 f"{base}_s = tl.reduce(tl.where(lanes <= {base}_first, {base}_x, tl.full([], {init}, {tt})), 0, {fn})",
                 f"{base}_p = tl.where({base}_ready, {fn}({base}_s, {base}_p), {base}_p)",
                 f"{base}_end = tl.where({base}_ready, tl.where({base}_first < LOOKBACK, 0, {base}_end - LOOKBACK), "
                 f"{base}_end)"]
        lines += ["    " + ln for ln in loop]
        lines += [f"{base}_i = {fn}({base}_p, {base}_t)", "if PUBLISH_PREFIX:"]
        lines += ["    " + ln for ln in self._publish(base, red, f"{base}_i", PREFIX)]
        lines.append(f"{base} = {fn}({base}_p, {base}_sc)")
        top.lines += lines
        top.accs[(red.name, 0)] = (base, red.dtype)
        top.provides.add(("acc", red.name))
