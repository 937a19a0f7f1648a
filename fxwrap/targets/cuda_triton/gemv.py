"""The Triton GEMV template: matrix products of one to eight rows (batch-1 to batch-8
decoding) at the bandwidth limit, with the scheduler's epilogue and, for int8 weight-only
layers, the dequantization fused.

A decode step multiplies one activation row by every weight of a layer: ``x[1, K] @ w.T``
with ``w`` an ``nn.Linear`` weight ``[N, K]`` (row-major: each output's ``K`` weights
contiguous).  Each weight is read once and used once, so the time is the weight's bytes
over the memory bandwidth; a tiled ``tl.dot`` kernel pads the one row to 16 and a
library GEMM pays a separate launch for the bias and the activation.  This kernel gives
each program ``NBLOCK`` outputs, walks ``K`` in ``KBLOCK`` steps with wide loads along the
weight's contiguous axis, keeps a float32 ``[NBLOCK, KBLOCK]`` partial sum (one FMA per
weight element, no cross-thread traffic in the loop), reduces it once, and runs the
epilogue on the ``[1, NBLOCK]`` result.  An int8 weight (``_weight_int8pack_mm``, the
rewrite of ``linear(x, w_int8.to(x.dtype)) * scale``: ``fxwrap.core.patterns``) is
widened to float32 in registers (exact) and its per-channel scale is the epilogue's
first multiply: the weight is read as int8, half the bytes of a bfloat16 copy.

``F.silu(F.linear(x, w, b))`` with ``x`` ``(1, 4096)``, ``w`` ``(11008, 4096)`` bfloat16
(``addmm(b, x, permute(w))``) renders as::

    @triton.jit
    def fxwrap_template_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, MBLOCK: tl.constexpr,
                          NBLOCK: tl.constexpr, KBLOCK: tl.constexpr, EVEN_K: tl.constexpr):
        M = 1
        N = 11008
        K = 4096
        pid = tl.program_id(0)
        ntiles = (N + NBLOCK - 1) // NBLOCK
        ntile = pid % ntiles
        rn = ntile * NBLOCK + tl.arange(0, NBLOCK)
        rk = tl.arange(0, KBLOCK)
        rbn = rn % N
        a_ptrs = in_ptr0 + (0 * (4096) + rk[None, :] * (1))
        b_ptrs = in_ptr1 + (rk[None, :] * (1) + rbn[:, None] * (4096))
        partial = tl.zeros([NBLOCK, KBLOCK], dtype=tl.float32)
        for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):
            if EVEN_K:
                a = tl.load(a_ptrs, eviction_policy="evict_last")      # x: [1, KBLOCK], kept in L2
                b = tl.load(b_ptrs, eviction_policy="evict_first")
            else:
                kleft = K - kstep * KBLOCK
                a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_last")
                b = tl.load(b_ptrs, mask=rk[None, :] < kleft, other=0.0, eviction_policy="evict_first")
            partial += b.to(tl.float32) * a.to(tl.float32)
            a_ptrs += KBLOCK * (1)
            b_ptrs += KBLOCK * (1)
        acc = tl.sum(partial, axis=1)[None, :]
        ...                      # mindex/nindex, then the epilogue (bias, silu, bf16 cast, store)

Columns past ``N`` are read at ``rn % N`` (in bounds, never stored); only the ``K`` tail is
masked, where ``K`` is not a multiple of the config's ``KBLOCK`` (``EVEN_K``).  A
batched one-row product (``bmm`` of ``(B, 1, K)``) runs ``B * ceil(N / NBLOCK)`` programs.
The tilings (``gemv_configs``) are timed by the emitter on the GPU; the fastest is timed
against the ATen call (cuBLAS, or ATen's ``_weight_int8pack_mm``) + the epilogue kernel by
the template choice, in the default mode too (``in_default_mode``: a handful of small
kernels to compile, and a one-row product is where a generated kernel can beat cuBLAS).

**Few rows** (a static ``M`` of 2 to ``MAX_ROWS``; batch-2..8 decoding): each program still
loads its ``[NBLOCK, KBLOCK]`` weight tile once a step, and every row reads it.  How the rows
use it is the config's ``FORM`` constexpr (one source, Triton compiles only the branch of
the config): ``FORM_PARTIAL`` keeps a partial sum per row (``part0`` .. ``part<M-1>``, the
one-row kernel's loop unrolled over the rows), ``FORM_STEP_SUM`` reduces each row's products
every step, ``FORM_DOT`` runs one ``tl.dot`` a step with the rows padded to 16 (those past
``M`` masked: not read); in the first two the next step's weight tile is loaded before
each step's work (two in flight: Triton pipelines only loads that feed a ``tl.dot``).  The
first two gather the row sums into ``acc`` ``[MBLOCK, NBLOCK]``::

    acc = tl.where(rm[:, None] == 0, sum0[None, :], 0.0)
    acc = tl.where(rm[:, None] == 1, sum1[None, :], acc)

and the epilogue stores the rows under ``mindex < M``.  The candidate tilings of each form
are a table by row count (``GEMV_BANDS``), all timed on the GPU; ``python benchmarks/gemv.py
--rows 1,2,4,8`` prints each candidate's time, from which the table is retuned.  A symbolic
``M`` or more than ``MAX_ROWS`` rows is ``triton_gemm``'s or the ATen call's (and the
int8 pattern is left as it is for them).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import sympy
import torch

from fxwrap.core import patterns
from fxwrap.core.patterns import INT8_MM
from fxwrap.core.templates import Template, TemplateCall
from fxwrap.ir.loops import ScheduledKernel
from fxwrap.targets.cuda_triton.codegen import CodegenError
from fxwrap.targets.cuda_triton.gemm import GEMM_DTYPES, ProductKernel, template_source
from fxwrap.targets.cuda_triton.tiling import next_pow2

aten = torch.ops.aten


#: How a program of ``M >= 2`` rows computes its ``[MBLOCK, NBLOCK]`` block (the ``FORM``
#: constexpr): ``FORM_PARTIAL`` keeps a float32 ``[NBLOCK, KBLOCK]`` partial sum per row and
#: reduces each once after the loop (the one-row kernel's way, ``M`` times the registers);
#: ``FORM_STEP_SUM`` reduces each row's products along ``K`` every step (an ``[NBLOCK]`` sum
#: per row: wider tiles in the same registers); ``FORM_DOT`` is one ``tl.dot`` a step with
#: the rows padded to 16 (``tl.dot``'s smallest side; the weight tile converted to the
#: activations' dtype first: exact for int8 in bf16/fp16).  In each, the weight tile is
#: loaded once a step and read by every row.
FORM_PARTIAL, FORM_STEP_SUM, FORM_DOT = 0, 1, 2
DOT_ROWS = 16  # tl.dot's smallest tile side: FORM_DOT pads the rows to it


@dataclass(frozen=True)
class GemvConfig:
    """One tiling: ``block_n`` outputs per program, ``block_k`` weights of each per step;
    for two rows or more, ``form`` says how the rows are computed (``FORM_*``)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1
    form: int = FORM_PARTIAL

    def launch_config(self, k_static: int | None, rows: int = 1) -> tuple:
        even_k = int(k_static is not None and k_static % self.block_k == 0)
        if rows == 1:  # the one-row kernel has no FORM
            return (("MBLOCK", 1), ("NBLOCK", self.block_n), ("KBLOCK", self.block_k), ("EVEN_K", even_k),
                    ("num_stages", self.num_stages), ("num_warps", self.num_warps))
        block_m = DOT_ROWS if self.form == FORM_DOT else next_pow2(rows)
        return (("MBLOCK", block_m), ("NBLOCK", self.block_n), ("KBLOCK", self.block_k), ("EVEN_K", even_k),
                ("FORM", self.form), ("num_stages", self.num_stages), ("num_warps", self.num_warps))


@dataclass(frozen=True)
class RowBand:
    """The candidate tilings for activations of up to ``rows`` rows (and more than the band
    before): ``along_k`` for a weight read along K (an ``nn.Linear`` weight), rows of
    ``(outputs per program, weight bytes of each per step, warps, stages, form)``;
    ``along_n`` for a weight read along N, rows of ``(weight bytes along N per step, K per
    step, warps, stages, form)``.  The first row is the tiling used untimed (``autotune=False``)."""

    rows: int
    along_k: tuple
    along_n: tuple


# One row: 4-16 KiB of weights per program and step, from one output per program (many
# programs: small N) to 32 (few programs, long rows); a few pipelined.  Along N: wide along
# N, short K steps.
_ONE_ROW = RowBand(
    1,
    along_k=((1, 4096, 4, 1, 0), (2, 4096, 4, 1, 0), (4, 2048, 4, 1, 0), (8, 1024, 4, 1, 0), (16, 512, 4, 1, 0),
             (2, 8192, 8, 1, 0), (4, 4096, 8, 1, 0), (8, 2048, 8, 1, 0), (16, 1024, 8, 1, 0), (32, 512, 8, 1, 0),
             (4, 2048, 4, 3, 0), (8, 1024, 4, 3, 0)),
    along_n=((1024, 16, 4, 1, 0), (512, 32, 4, 1, 0), (2048, 16, 8, 1, 0), (1024, 32, 8, 1, 0), (512, 64, 8, 1, 0),
             (256, 64, 4, 1, 0)))
# Two rows and more: FORM_PARTIAL holds rows x NBLOCK x KBLOCK float32 partial sums, at most
# 64 a thread (rows padded to a power of two; tests/cuda/test_triton_gemv.py checks it), so
# its tiles shrink as the rows grow; FORM_STEP_SUM keeps each thread's activations of every
# row, so its tiles shrink too (16 outputs x 512 of K for 8 rows took all 255 registers on
# sm_90).  Their loads are not pipelined (Triton pipelines loads that feed a tl.dot), so
# they take one stage and load the next step's tile ahead (two in flight).  FORM_DOT reads
# 8-32 KiB of weights a step through 3-4 stages of cp.async (16-96 KiB of shared memory),
# int8 widened to bf16 with integer tricks rather than I2F: listed first from 4 rows on (the
# tiling used untimed), where the FMA forms spend M FMAs a weight; 16 outputs a program for
# layers of few outputs (14336x4096: 256 programs), as the template has no split-K.  Each
# row of activations is re-read (from L1/L2) by every program: more outputs per program read
# it fewer times.  Every tiling below compiles for sm_90 without spilling (triton 3.9, 16-byte
# aligned pointers: 40-218 registers).  Retune from
# `python benchmarks/gemv.py --dtypes int8 --rows 1,2,4,8` (each candidate's time).
_DOT = ((64, 256, 4, 3, 2), (32, 256, 4, 3, 2), (64, 128, 4, 4, 2), (128, 128, 8, 3, 2), (128, 256, 8, 3, 2),
        (32, 512, 4, 3, 2), (16, 512, 4, 3, 2))
_DOT_ALONG_N = ((128, 64, 4, 3, 2), (256, 32, 4, 3, 2))
_TWO_ROWS = RowBand(
    2,
    along_k=((4, 2048, 8, 1, 0), (2, 2048, 4, 1, 0), (4, 1024, 4, 1, 0), (8, 1024, 8, 1, 0), (8, 512, 4, 1, 0),
             (8, 1024, 4, 1, 1), (4, 2048, 4, 1, 1), (8, 2048, 8, 1, 1), (16, 1024, 8, 1, 1), *_DOT),
    along_n=((512, 16, 4, 1, 0), (512, 32, 4, 1, 1), (1024, 16, 4, 1, 1), (2048, 16, 8, 1, 1), *_DOT_ALONG_N))
_FOUR_ROWS = RowBand(
    4,
    along_k=(*_DOT, (2, 2048, 8, 1, 0), (1, 2048, 4, 1, 0), (2, 1024, 4, 1, 0), (4, 512, 4, 1, 0),
             (4, 1024, 8, 1, 0), (4, 1024, 4, 1, 1), (8, 1024, 8, 1, 1), (8, 512, 4, 1, 1), (16, 512, 8, 1, 1)),
    along_n=((256, 16, 4, 1, 0), (512, 32, 4, 1, 1), (1024, 16, 4, 1, 1), (2048, 16, 8, 1, 1), *_DOT_ALONG_N))
_EIGHT_ROWS = RowBand(
    8,
    along_k=(*_DOT, (2, 1024, 8, 1, 0), (1, 1024, 4, 1, 0), (2, 512, 4, 1, 0), (4, 512, 8, 1, 0),
             (4, 512, 4, 1, 1), (8, 512, 8, 1, 1), (4, 1024, 8, 1, 1), (2, 1024, 4, 1, 1)),
    along_n=((128, 16, 4, 1, 0), (512, 32, 4, 1, 1), (1024, 16, 4, 1, 1), (2048, 16, 8, 1, 1), *_DOT_ALONG_N))
#: the candidate tilings by row count: the first band whose ``rows`` is at least the call's
GEMV_BANDS = (_ONE_ROW, _TWO_ROWS, _FOUR_ROWS, _EIGHT_ROWS)
#: the most rows the template computes (more: triton_gemm, cuBLAS)
MAX_ROWS = GEMV_BANDS[-1].rows
#: the form the interpreter runs for two rows or more (one tiling there; tests set the others)
INTERPRET_FORM = FORM_PARTIAL

#: ``FORM_DOT`` on a GPU, on unless ``FXWRAP_GEMV_DOT=0``.  It was off for a session: on the H200
#: (2026-11-29, Triton 3.6) few-row bf16 tests failed where it was the tiling kept (a few
#: elements 0.05-0.15 off eager's at K = 1000).  The cause was eager's reference: cuBLAS reduces
#: split-K partial sums in bf16 by default.  With those reductions off in the tests' reference,
#: every few-row test passed with the dot form on the H200 (tests/cuda/test_triton_gemv.py, 112
#: passed).  The dot form is what reaches 2.9 TB/s from 4 rows on (``benchmarks/gemv.py``).
DOT_FORM_ON_GPU = os.environ.get("FXWRAP_GEMV_DOT", "1") != "0"


def static_rows(call: TemplateCall) -> int | None:
    """The call's row count ``M`` where it is a number (a symbolic ``M`` never counts), else None."""
    m = sympy.sympify(call.size("m"))
    return int(m) if m.is_Integer else None


def reads_along_n(call: TemplateCall) -> bool:
    """Whether the weight ``b`` (``(K, N)``) is contiguous along N rather than along K."""
    b = call.operands[1]
    return sympy.sympify(b.stride[-1]) == 1 and sympy.sympify(b.stride[-2]) != 1


def row_band(rows: int) -> RowBand:
    """The band of ``GEMV_BANDS`` serving ``rows`` (1 to ``MAX_ROWS``) rows."""
    return next(band for band in GEMV_BANDS if rows <= band.rows)


def gemv_configs(call: TemplateCall, interpret: bool) -> list[GemvConfig]:
    """The candidate tilings at ``call``'s size hints: the row band's table for the weight's
    layout, each block capped at the problem (next power of two), ``FORM_DOT`` only with
    ``DOT_FORM_ON_GPU``, for 16-bit activations and blocks of at least 16, deduplicated, in
    table order.  Under the interpreter one small tiling (its cost is per program and per op)."""
    rows = static_rows(call) or 1
    n, k = (max(1, call.hint(d)) for d in ("n", "k"))
    cap_n, cap_k = next_pow2(n), next_pow2(k)
    if interpret:
        return [GemvConfig(min(8, cap_n), min(32, cap_k), 1, 1, FORM_PARTIAL if rows == 1 else INTERPRET_FORM)]
    itemsize = call.operands[1].dtype.itemsize
    band = row_band(rows)
    out: list[GemvConfig] = []
    if reads_along_n(call):
        table = [(nbytes // itemsize, bk, warps, stages, form) for nbytes, bk, warps, stages, form in band.along_n]
    else:
        table = [(bn, kbytes // itemsize, warps, stages, form) for bn, kbytes, warps, stages, form in band.along_k]
    for bn, bk, warps, stages, form in table:
        bn, bk = min(bn, cap_n), min(bk, cap_k)
        if form == FORM_DOT and (not DOT_FORM_ON_GPU or call.dtype == torch.float32 or min(bn, bk) < DOT_ROWS):
            continue
        warps = max(1, min(warps, bn * bk // 256))  # at least 256 elements of the tile per warp
        warps = 1 << (warps.bit_length() - 1)
        cfg = GemvConfig(bn, bk, warps, stages, form)
        if cfg not in out:
            out.append(cfg)
    return out


class GemvWriter:
    """``GemvWriter(kernel, target_name).write() -> body lines`` of a GEMV template kernel:
    for one row, the ``K`` loop over a ``[NBLOCK, KBLOCK]`` float32 partial sum and its
    reduction to ``acc`` ``[1, NBLOCK]``; for ``M`` rows (2 to ``MAX_ROWS``, static), one
    ``K`` loop per ``FORM`` (``write_rows``) giving ``acc`` ``[MBLOCK, NBLOCK]``; then the
    kernel's stores (the epilogue) with ``template_out`` bound to ``acc``
    (``ProductKernel.epilogue``, as ``GemmWriter``'s).  ``interpret``: the source is for
    Triton's interpreter (``row_dot``)."""

    def __init__(self, kernel: ScheduledKernel, target_name: str = "triton", intrinsics: tuple = (),
                 interpret: bool = False):
        self.product = ProductKernel(kernel, target_name, intrinsics)
        self.interpret = interpret

    def write(self) -> list[str]:
        p = self.product
        rows = static_rows(p.call)
        body = p.sizes()
        body.append("ntiles = (N + NBLOCK - 1) // NBLOCK")
        if p.batched:
            body.append("zindex = pid // ntiles")
        body += ["ntile = pid % ntiles",
                 "rn = ntile * NBLOCK + tl.arange(0, NBLOCK)",
                 "rk = tl.arange(0, KBLOCK)",
                 f"rbn = {p.wrapped('rn', 'N', p.b, -1)}"]
        if rows != 1:
            body += self.write_rows(rows)
            body += ["mindex = rm[:, None]", "mmask = mindex < M", "nindex = rn[None, :]", "nmask = nindex < N"]
            return p.epilogue(body)
        body += [f"a_ptrs = {p.operand(p.a, '0', 'rk[None, :]')}",
                 f"b_ptrs = {p.operand(p.b, 'rk[None, :]', 'rbn[:, None]')}",
                 "partial = tl.zeros([NBLOCK, KBLOCK], dtype=tl.float32)",
                 *self._k_loop(["a", "b"], ["partial += b.to(tl.float32) * a.to(tl.float32)"]),
                 "acc = tl.sum(partial, axis=1)[None, :]",
                 "rm = tl.arange(0, MBLOCK)",
                 "mindex = rm[:, None]", "mmask = mindex < M", "nindex = rn[None, :]", "nmask = nindex < N"]
        return p.epilogue(body)

    def _k_loop(self, loads: list[str], update: list[str], rows_masked: bool = False,
                prefetch: bool = False) -> list[str]:
        """The ``K`` loop: each step loads ``loads`` (``a`` the activations at ``a_ptrs``, kept
        in L2, its rows past ``M`` masked where ``rows_masked``; ``a<r>`` row ``r`` of them;
        ``b`` the weight tile, read once), masked on the ``K`` tail unless ``EVEN_K``, then
        runs ``update`` and moves both pointers on.  ``prefetch``: the weight tile of the next
        step is loaded before this step's work (``b_next``; past the last step its mask is
        empty), so that two of them are in flight: loads that feed no ``tl.dot`` are not
        pipelined by Triton, and a few rows' partial sums leave no registers for wider tiles."""
        p = self.product
        stride_m = p.idx(p.a.stride[-2])
        b_step = f"b_ptrs += KBLOCK * ({p.idx(p.b.stride[-2])})"

        def load(name: str, masked: bool) -> str:
            ptr = "b_ptrs" if name == "b" else "a_ptrs" if name in ("a", "a0") else \
                f"a_ptrs + {name[1:]} * ({stride_m})"
            terms = (["rows_in"] if rows_masked and name == "a" else []) + (["rk[None, :] < kleft"] if masked else [])
            mask = terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms)
            mask_arg = f"mask={mask}, other=0.0, " if terms else ""
            policy = "evict_first" if name == "b" else "evict_last"
            return f'        {name} = tl.load({ptr}, {mask_arg}eviction_policy="{policy}")'

        ahead = ['b_next = tl.load(b_ptrs, mask=rk[None, :] < K, other=0.0, eviction_policy="evict_first")']
        in_step = ["    b = b_next", f"    {b_step}",
                   '    b_next = tl.load(b_ptrs, mask=rk[None, :] < K - (kstep + 1) * KBLOCK, other=0.0, '
                   'eviction_policy="evict_first")']
        if prefetch:
            loads = [name for name in loads if name != "b"]
        return [*(ahead if prefetch else []),
                "for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):",
                *(in_step if prefetch else []),
                "    if EVEN_K:",
                *(load(name, False) for name in loads),
                "    else:",
                "        kleft = K - kstep * KBLOCK",
                *(load(name, True) for name in loads),
                *("    " + ln for ln in update),
                f"    a_ptrs += KBLOCK * ({p.idx(p.a.stride[-1])})",
                *([] if prefetch else [f"    {b_step}"])]

    def write_rows(self, rows: int) -> list[str]:
        """The product of ``rows`` rows (2 to ``MAX_ROWS``) into ``acc`` ``[MBLOCK, NBLOCK]``,
        one branch per ``FORM`` (a constexpr: Triton compiles only the config's)::

            if FORM == 2:                      # FORM_DOT: rows padded to 16, those past M masked
                ... acc += tl.dot(a, tl.trans(b.to(a.dtype)))
            elif FORM == 1:                    # FORM_STEP_SUM
                ... sum0 += tl.sum(w * a0.to(tl.float32), axis=1)   (w: the weight tile in fp32)
            else:                              # FORM_PARTIAL
                ... part0 += w * a0.to(tl.float32); after the loop sum0 = tl.sum(part0, axis=1)
            acc = tl.where(rm[:, None] == 0, sum0[None, :], 0.0)   # row r's sums in row r

        In the last two the next step's weight tile is in flight during each step (``_k_loop``'s
        ``prefetch``)."""
        p = self.product
        names = [f"a{r}" for r in range(rows)]
        zeros = [f"sum{r} = tl.zeros([NBLOCK], dtype=tl.float32)" for r in range(rows)]
        parts = [f"part{r} = tl.zeros([NBLOCK, KBLOCK], dtype=tl.float32)" for r in range(rows)]
        gather = ["acc = tl.where(rm[:, None] == 0, sum0[None, :], 0.0)"]
        gather += [f"acc = tl.where(rm[:, None] == {r}, sum{r}[None, :], acc)" for r in range(1, rows)]
        widen = "w = b.to(tl.float32)"
        branches = [
            (f"if FORM == {FORM_DOT}:  # one tl.dot a step, the rows padded to MBLOCK = {DOT_ROWS}",
             ["rows_in = rm[:, None] < M",
              f"a_ptrs = {p.operand(p.a, 'rm[:, None]', 'rk[None, :]')}",
              "acc = tl.zeros([MBLOCK, NBLOCK], dtype=tl.float32)",
              *self._k_loop(["a", "b"], [f"acc += {self.row_dot()}"], rows_masked=True)]),
            (f"elif FORM == {FORM_STEP_SUM}:  # each row's products reduced along K every step",
             [f"a_ptrs = {p.operand(p.a, '0', 'rk[None, :]')}", *zeros,
              *self._k_loop(["b", *names], [widen] + [f"sum{r} += tl.sum(w * a{r}.to(tl.float32), axis=1)"
                                                      for r in range(rows)], prefetch=True),
              *gather]),
            ("else:  # a partial sum per row, reduced once after the loop",
             [f"a_ptrs = {p.operand(p.a, '0', 'rk[None, :]')}", *parts,
              *self._k_loop(["b", *names], [widen] + [f"part{r} += w * a{r}.to(tl.float32)" for r in range(rows)],
                            prefetch=True),
              *(f"sum{r} = tl.sum(part{r}, axis=1)" for r in range(rows)),
              *gather]),
        ]
        body = ["rm = tl.arange(0, MBLOCK)",
                f"b_ptrs = {p.operand(p.b, 'rk[None, :]', 'rbn[:, None]')}"]
        for head, lines in branches:
            body += [head, *("    " + ln for ln in lines)]
        return body

    def row_dot(self) -> str:
        """``FORM_DOT``'s product of the ``[MBLOCK, KBLOCK]`` rows ``a`` and the ``[NBLOCK,
        KBLOCK]`` weight tile ``b``: in the activations' 16-bit dtype (an int8 weight is exact
        there), float32 ``ieee`` for float32 activations and under the interpreter (whose dot
        of 16-bit floats is wrong)."""
        if self.interpret or self.product.call.dtype == torch.float32:
            return 'tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")'
        return "tl.dot(a, tl.trans(b.to(a.dtype)))"


class TritonGemv(Template):
    """Few-row ``mm``/``addmm``/``bmm`` (a static ``M`` of 1 to ``MAX_ROWS``, any batch) of
    float32, bfloat16 or float16 operands, and ``_weight_int8pack_mm`` with as many
    activation rows (int8 weights widened in registers, the scale in the epilogue), on the
    Triton targets, the scheduler's epilogue fused: ``render(kernel, emitter)`` is a
    ``KernelSource`` of one ``@triton.jit`` function with the kernel's usual signature
    (module docstring).

    Listed before ``triton_gemm``: under ``templates="always"`` a product of up to
    ``MAX_ROWS`` rows is this kernel's.  In the default mode it is timed against the ATen
    call (cuBLAS) and kept only where it is faster."""

    name = "triton_gemv"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, INT8_MM})
    in_default_mode = True
    pattern_guarantee = True  # pattern_refusal below accepts only what refusal accepts

    def refusal(self, call: TemplateCall) -> str | None:
        a, b = call.operands[:2]
        if a.dtype not in GEMM_DTYPES:
            return f"{a.dtype} activations ({self.name} computes float32, bfloat16 and float16)"
        if call.op == INT8_MM:
            if b.dtype != torch.int8:
                return f"a {b.dtype} weight ({INT8_MM} takes int8)"
        elif b.dtype != a.dtype:
            return f"operands {a.dtype} x {b.dtype}"
        if call.acc_dtype != torch.float32:
            return f"a {call.acc_dtype} accumulator"
        rows = static_rows(call)
        if rows is None or rows > MAX_ROWS:
            return (f"{call.size('m')} rows ({self.name} computes products of a static 1 to {MAX_ROWS} rows; "
                    "triton_gemm and cuBLAS the rest)")
        if any(int(h) == 0 for _, h in call.hints):
            return "an empty product"
        return None

    def extern_refusal(self, call: TemplateCall) -> str | None:
        if call.op != INT8_MM:
            return None
        x = call.operands[0]
        contiguous = sympy.sympify(x.stride[-1]) == 1 or sympy.sympify(x.size[-1]) == 1
        return patterns.aten_int8_mm_refusal(call.dtype, call.size("k"), call.output.device.type, contiguous)

    def pattern_refusal(self, op, args: tuple) -> str | None:
        x, w = args[:2]
        rows = x.shape[0]
        if isinstance(rows, torch.SymInt) or not 1 <= rows <= MAX_ROWS:
            return (f"activations of {rows} rows: {self.name} computes products of a static 1 to {MAX_ROWS} "
                    "rows, the dequantizing kernel and the library GEMM the others")
        if x.dtype not in GEMM_DTYPES or w.dtype != torch.int8 or any(isinstance(d, int) and d == 0
                                                                      for d in (*x.shape, *w.shape)):
            return f"{x.dtype} activations and a {w.dtype} weight of {tuple(w.shape)}"
        return None

    def render(self, kernel: ScheduledKernel, emitter):
        call = kernel.template
        if call is None:
            raise CodegenError(f"kernel {kernel.name} has no template call (template {self.name})")
        gw = GemvWriter(kernel, emitter.target_name, intrinsics=emitter.intrinsics, interpret=emitter.interpret)
        k = sympy.sympify(call.size("k"))
        rows = static_rows(call)
        configs = [c.launch_config(int(k) if k.is_Integer else None, rows)
                   for c in gemv_configs(call, emitter.interpret)]
        along = "N" if reads_along_n(call) else "K"
        batch = "batch x " if gw.product.batched else ""
        constexprs = ("MBLOCK", "NBLOCK", "KBLOCK", "EVEN_K") + (("FORM",) if rows != 1 else ())
        many = "" if rows == 1 else f" for {rows} rows"
        return template_source(emitter, kernel, self.name, gw, constexprs, configs,
                               f"{batch}NBLOCK outputs per program{many}, the weight read along {along}")
