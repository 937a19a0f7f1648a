"""The Triton GEMM kernel: a tiled ``tl.dot`` matrix product whose epilogue is the
scheduler's fused pointwise work, written by the Triton codegen (``codegen.KernelWriter``).

``relu(addmm(b, x, w.t()))`` with ``x`` ``(64, 96)``, ``w`` ``(128, 96)`` float32 (the
GEMM problem ``M=64, N=128, K=96``; ``w.t()`` is read through its strides ``(1, 96)``)
renders as::

    @triton.jit
    def fxwrap_template_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, MBLOCK: tl.constexpr,
                          NBLOCK: tl.constexpr, KBLOCK: tl.constexpr, GROUP_M: tl.constexpr,
                          EVEN_K: tl.constexpr):
        M = 64
        N = 128
        K = 96
        pid = tl.program_id(0)
        mtiles = (M + MBLOCK - 1) // MBLOCK
        ntiles = (N + NBLOCK - 1) // NBLOCK
        tile = pid % (mtiles * ntiles)
        width = GROUP_M * ntiles                   # GROUP_M rows of tiles share B's columns
        first_m = (tile // width) * GROUP_M
        group_rows = tl.minimum(mtiles - first_m, GROUP_M)
        mtile = first_m + (tile % width) % group_rows
        ntile = (tile % width) // group_rows
        rm = mtile * MBLOCK + tl.arange(0, MBLOCK)
        rn = ntile * NBLOCK + tl.arange(0, NBLOCK)
        rk = tl.arange(0, KBLOCK)
        ram = rm % M
        rbn = tl.max_contiguous(tl.multiple_of(rn % N, 16), 16)   # b is contiguous along N
        a_ptrs = in_ptr1 + (ram[:, None] * 96 + rk[None, :] * 1)
        b_ptrs = in_ptr2 + (rk[:, None] * 1 + rbn[None, :] * 96)
        acc = tl.zeros([MBLOCK, NBLOCK], dtype=tl.float32)
        for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):
            ...  # masked on K unless EVEN_K
            acc += tl.dot(a, b, input_precision="ieee")
        mindex = rm[:, None]
        mmask = mindex < M
        nindex = rn[None, :]
        nmask = nindex < N
        x0 = mindex
        x1 = nindex
        acc = acc + tl.load(in_ptr0 + (x1), nmask, other=0).to(tl.float32)   # addmm's bias
        tmp0 = ...                                     # the epilogue, over acc
        tl.store(out_ptr0 + (128*x0 + x1), tmp2, mmask & nmask)

Rows and columns past ``M``/``N`` are read at ``rm % M`` / ``rn % N`` (in bounds, never stored), so
only the ``K`` tail is masked, and only where ``K`` is not a multiple of ``KBLOCK``
(``EVEN_K``, a per-config constexpr).  A batched product (``bmm``) has a third program
axis: ``zindex = pid // (mtiles * ntiles)``, the batch loop var.  ``float32`` operands use
TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` says eager's cuBLAS does.

The accumulator is float32; the op's result (``TEMPLATE_OUT`` in the epilogue IR) is it,
rounded to bf16/fp16 for 16-bit outputs, as eager's product is before its epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from fxwrap.core.ir import ScheduledKernel, walk
from fxwrap.core.symbolic import evaluate
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import CodegenError, KernelWriter, _Scope
from fxwrap.targets.cuda_triton.tiling import Plan, index_dtype, next_pow2

GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GemmProblem:
    """One matrix product as the kernel reads it: ``out = alpha * a @ b + beta * bias``.

    ``GemmProblem("addmm", a=x_buf, b=wt_buf, bias=b_buf, m=64, n=128, k=96)``; ``a`` is
    ``(M, K)`` (``(B, M, K)`` batched), ``b`` ``(K, N)`` (``(B, K, N)``), any strides;
    ``bias`` broadcasts to ``(M, N)`` by its own sizes and strides (ATen's rules)."""

    op: str                      # mm | addmm | bmm
    a: object                    # fxwrap.wrapper_ir.lines.Buffer
    b: object
    m: sympy.Expr
    n: sympy.Expr
    k: sympy.Expr
    batch: sympy.Expr | None = None
    bias: object | None = None
    alpha: float = 1.0
    beta: float = 1.0

    @property
    def in_dtype(self) -> torch.dtype:
        return self.a.dtype


@dataclass(frozen=True)
class GemmConfig:
    """One tiling of the kernel: block sizes, ``GROUP_M`` swizzle, warps, pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8

    def launch_config(self, k_static: int | None) -> tuple:
        even_k = int(k_static is not None and k_static % self.block_k == 0)
        return (("MBLOCK", self.block_m), ("NBLOCK", self.block_n), ("KBLOCK", self.block_k),
                ("GROUP_M", self.group_m), ("EVEN_K", even_k),
                ("num_stages", self.num_stages), ("num_warps", self.num_warps))


# (block_m, block_n, block_k, num_warps, num_stages), for 16-bit operands on Hopper-class
# GPUs (228 KiB shared memory): big square tiles for big products, narrow ones for few
# rows (decode-like M) or few columns, deep K blocks where the tile is small.
_CONFIGS_16BIT = (
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4),
    (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (64, 256, 64, 8, 3),
    (32, 128, 128, 4, 4), (16, 128, 128, 4, 4), (32, 64, 128, 4, 5), (16, 64, 256, 4, 3),
    (64, 32, 128, 4, 4),
)
# float32: half the K depth per stage (twice the bytes per element)
_CONFIGS_32BIT = (
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
    (128, 128, 16, 4, 4), (32, 128, 64, 4, 4), (16, 128, 64, 4, 3), (32, 64, 64, 4, 4),
    (64, 32, 64, 4, 4),
)
MIN_BLOCK = 16  # tl.dot's smallest tile side


def gemm_configs(problem: GemmProblem, hints: dict, interpret: bool, limit: int = 12) -> list[GemmConfig]:
    """The candidate tilings for ``problem`` at the size hints: the table's, each block
    shrunk to the problem (next power of two, at least 16), deduplicated, in table order.
    Under the interpreter one small config (its cost is per program and per op)."""
    def size(e) -> int:
        try:
            return max(int(evaluate(sympy.sympify(e), hints)), 1)
        except Exception:  # a size without a hint: assume large
            return 1 << 12

    m, n, k = size(problem.m), size(problem.n), size(problem.k)
    cap_m, cap_n, cap_k = (max(MIN_BLOCK, next_pow2(v)) for v in (m, n, k))
    if interpret:
        return [GemmConfig(min(32, cap_m), min(32, cap_n), min(32, cap_k), 4, 1, 2)]
    table = _CONFIGS_32BIT if problem.in_dtype == torch.float32 else _CONFIGS_16BIT
    out: list[GemmConfig] = []
    for bm, bn, bk, warps, stages in table:
        bm, bn, bk = min(bm, cap_m), min(bn, cap_n), min(bk, cap_k)
        tile = bm * bn
        warps = max(1, min(warps, tile // 1024 or 1))  # 1 warp per 32x32 of output at least
        warps = 1 << (warps.bit_length() - 1)
        cfg = GemmConfig(bm, bn, bk, warps, stages, 8 if m > bm else 1)
        if cfg not in out:
            out.append(cfg)
    return out[:limit]


def allow_tf32() -> bool:
    """Whether eager's float32 matmuls on CUDA use TF32 (``torch.backends.cuda.matmul``)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


class GemmWriter:
    """``GemmWriter(kernel, problem, is_out, target).write() -> body lines``; the GEMM main
    loop, then ``kernel``'s stores through a ``KernelWriter`` with ``acc`` bound to every
    op ``is_out(op)`` says is the product (the epilogue IR's ``TEMPLATE_OUT``)."""

    def __init__(self, kernel: ScheduledKernel, problem: GemmProblem, is_out, target_name: str = "triton",
                 tf32: bool = False, interpret: bool = False):
        self.interpret = interpret
        self.k = kernel
        self.p = problem
        self.is_out = is_out
        self.tf32 = tf32
        self.target_name = target_name
        ranks = len(kernel.ranges)
        if ranks != (3 if problem.batch is not None else 2):
            raise CodegenError(f"template kernel {kernel.name}: {ranks} output dims for a {problem.op} "
                               f"(target {target_name})")
        from fxwrap.core.ir import xvar
        vars_ = [xvar(i) for i in range(ranks)]
        groups = {"m": [vars_[-2]], "n": [vars_[-1]]}
        ranges = {"m": [kernel.ranges[-2]], "n": [kernel.ranges[-1]]}
        if problem.batch is not None:
            groups["b"], ranges["b"] = [vars_[0]], [kernel.ranges[0]]
        self.plan = Plan("template", ("m", "n"), groups, ranges, index_dtype(kernel))
        self.int64 = self.plan.index_dtype == "tl.int64"
        self.writer = KernelWriter(kernel, self.plan, target_name)

    def ptr(self, buf) -> str:
        try:
            return self.writer.loads[buf.name][0]
        except KeyError:
            raise CodegenError(f"template kernel {self.k.name}: operand {buf.name!r} is not one of its "
                               f"inputs (target {self.target_name})") from None

    def idx(self, e) -> str:
        return self.writer.idx(sympy.sympify(e))

    def _operand(self, buf, row: str, col: str, rows_expr: str, cols_expr: str) -> str:
        """``ptr + (batch offset + row * stride + col * stride)`` of a 2-D/3-D operand."""
        stride = list(buf.stride)
        terms = []
        if self.p.batch is not None:
            if len(stride) != 3:
                raise CodegenError(f"template kernel {self.k.name}: batched operand {buf.name} has "
                                   f"{len(stride)} dims")
            terms.append(f"zindex * ({self.idx(stride[0])})")
            stride = stride[1:]
        terms += [f"{rows_expr} * ({self.idx(stride[0])})", f"{cols_expr} * ({self.idx(stride[1])})"]
        del row, col
        return f"{self.ptr(buf)} + (" + " + ".join(terms) + ")"

    def write(self) -> list[str]:
        p, w = self.p, self.writer
        body: list[str] = []
        if self.int64:
            body += [f"{s.name} = {s.name}.to(tl.int64)" for s in self.k.size_symbols]
        pid = "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"
        body += [f"M = {self.idx(p.m)}", f"N = {self.idx(p.n)}", f"K = {self.idx(p.k)}",
                 f"pid = {pid}",
                 "mtiles = (M + MBLOCK - 1) // MBLOCK",
                 "ntiles = (N + NBLOCK - 1) // NBLOCK"]
        if p.batch is not None:
            body.append("zindex = pid // (mtiles * ntiles)")
        body += ["tile = pid % (mtiles * ntiles)",
                 "width = GROUP_M * ntiles",
                 "first_m = (tile // width) * GROUP_M",
                 "group_rows = tl.minimum(mtiles - first_m, GROUP_M)",
                 "mtile = first_m + (tile % width) % group_rows",
                 "ntile = (tile % width) // group_rows",
                 "rm = mtile * MBLOCK + tl.arange(0, MBLOCK)",
                 "rn = ntile * NBLOCK + tl.arange(0, NBLOCK)",
                 "rk = tl.arange(0, KBLOCK)",
                 f"ram = {self._wrapped('rm', 'M', p.m, p.a, -2)}",
                 f"rbn = {self._wrapped('rn', 'N', p.n, p.b, -1)}",
                 f"a_ptrs = {self._operand(p.a, 'm', 'k', 'ram[:, None]', 'rk[None, :]')}",
                 f"b_ptrs = {self._operand(p.b, 'k', 'n', 'rk[:, None]', 'rbn[None, :]')}",
                 "acc = tl.zeros([MBLOCK, NBLOCK], dtype=tl.float32)"]
        a_k, b_k = self.idx(self._kstride(p.a, 1)), self.idx(self._kstride(p.b, 0))
        precision = "tf32" if (p.in_dtype == torch.float32 and self.tf32) else "ieee"
        if p.in_dtype == torch.float32:
            dot = f'tl.dot(a, b, input_precision="{precision}")'
        elif self.interpret:  # the interpreter's dot of 16-bit floats is wrong: widen them (exact)
            dot = 'tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")'
        else:
            dot = "tl.dot(a, b)"
        body += ["for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):",
                 "    if EVEN_K:",
                 "        a = tl.load(a_ptrs)",
                 "        b = tl.load(b_ptrs)",
                 "    else:",
                 "        kleft = K - kstep * KBLOCK",
                 "        a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0)",
                 "        b = tl.load(b_ptrs, mask=rk[:, None] < kleft, other=0.0)",
                 f"    acc += {dot}",
                 f"    a_ptrs += KBLOCK * ({a_k})",
                 f"    b_ptrs += KBLOCK * ({b_k})"]
        body += ["mindex = rm[:, None]", "mmask = mindex < M", "nindex = rn[None, :]", "nmask = nindex < N"]
        for axis, index in (("b", "zindex"), ("m", "mindex"), ("n", "nindex")):
            for v in self.plan.groups.get(axis, ()):
                if v.name in w.used_vars:
                    body.append(f"{v.name} = {index}")
        out_dtype = self._out_dtype()
        if p.alpha != 1:
            body.append(f"acc = acc * {O.const_literal(float(p.alpha), torch.float32)}")
        if p.bias is not None and p.beta != 0:
            body.append(f"acc = acc + {self._bias()}")
        result = "acc"
        if out_dtype in O.HALF:
            body.append(f"acc_r = {O.round16('acc', out_dtype)}")
            result = "acc_r"
        top = _Scope(None, provides=[v.name for vs in self.plan.groups.values() for v in vs])
        for st in self.k.stores:
            for node in walk(st.value):
                if self.is_out(node):
                    if node.dtype != out_dtype:
                        raise CodegenError(f"template kernel {self.k.name}: the product is {out_dtype}, "
                                           f"its epilogue reads it as {node.dtype}")
                    top.env[node] = (result, node.dtype)
        for st in self.k.stores:
            w.store(top, st, ("m", "n"))
        zeros = [f"{name} = tl.zeros({w.shape(key)}, {self.plan.index_dtype})"
                 for key, name in sorted(w.zeros.items())]
        return body + zeros + top.lines

    @property
    def helpers(self) -> set[str]:
        w = self.writer
        return w.helpers | w.printer.helpers | w.ops.helpers

    def _wrapped(self, index: str, size: str, size_expr, buf, dim: int) -> str:
        """Rows (columns) past the end are read at ``index % size``: in bounds, never stored.
        Where the operand is contiguous along that dim and its size a static multiple of
        16, each aligned run of 16 is contiguous: said to the compiler, so it vectorizes."""
        text = f"{index} % {size}"
        size_expr = sympy.sympify(size_expr)
        if sympy.sympify(list(buf.stride)[dim]) == 1 and size_expr.is_Integer and int(size_expr) % 16 == 0:
            text = f"tl.max_contiguous(tl.multiple_of({text}, 16), 16)"
        return text

    def _kstride(self, buf, dim: int):
        stride = list(buf.stride)[-2:]
        return stride[dim]

    def _out_dtype(self) -> torch.dtype:
        return self.p.in_dtype

    def _bias(self) -> str:
        """The bias at ``(mindex, nindex)``, broadcast by its sizes (ATen's rules), as float32
        times ``beta``."""
        p, bias = self.p, self.p.bias
        sizes, strides = list(bias.size), list(bias.stride)
        dims = ["zindex", "mindex", "nindex"] if p.batch is not None else ["mindex", "nindex"]
        masks = {"mindex": "mmask", "nindex": "nmask"}
        terms, used = [], []
        for size, stride, dim in zip(reversed(sizes), reversed(strides), reversed(dims)):
            if sympy.sympify(size) == 1 or sympy.sympify(stride) == 0:
                continue
            terms.append(f"{dim} * ({self.idx(stride)})")
            if dim in masks:
                used.append(masks[dim])
        ptr = f"{self.ptr(bias)} + ({' + '.join(terms)})" if terms else self.ptr(bias)
        # loaded at the tile's rows and/or columns only; the add broadcasts it
        load = f"tl.load({ptr}, {' & '.join(used)}, other=0)" if used else f"tl.load({ptr})"
        if bias.dtype != torch.float32:
            load = f"{load}.to(tl.float32)"
        if p.beta != 1:
            load = f"{load} * {O.const_literal(float(p.beta), torch.float32)}"
        return load


def render_gemm(emitter, kernel: ScheduledKernel, problem: GemmProblem, is_out, template_name: str):
    """The ``KernelSource`` of ``kernel`` (a template kernel computing ``problem``, its stores
    the epilogue) for the Triton ``emitter``: the module text, and launch metadata in the
    emitter's format (grid axes ``b``/``m``/``n``, one config per candidate tiling, autotuned
    on the GPU by the emitter like any kernel's block sizes)."""
    from fxwrap.targets.base import KernelSource, kernel_function_name, kernel_header
    from fxwrap.targets.cuda_triton.printer import IndexPrinter

    if problem.in_dtype not in GEMM_DTYPES or problem.b.dtype != problem.in_dtype:
        raise CodegenError(f"template {template_name}: operands {problem.a.dtype} x {problem.b.dtype} "
                           f"(kernel {kernel.name}); the Triton GEMM takes {[str(d) for d in GEMM_DTYPES]}")
    name = emitter.target_name
    gw = GemmWriter(kernel, problem, is_out, name, tf32=allow_tf32(), interpret=emitter.interpret)
    body = gw.write()
    fname = kernel_function_name(kernel)
    ptrs = [f"in_ptr{i}" for i in range(len(kernel.inputs))] + [f"out_ptr{i}" for i in range(len(kernel.outputs))]
    sizes = [s.name for s in kernel.size_symbols]
    consts = [f"{c}: tl.constexpr" for c in ("MBLOCK", "NBLOCK", "KBLOCK", "GROUP_M", "EVEN_K")]
    deco = f"@triton.jit(do_not_specialize={sizes!r})" if sizes else "@triton.jit"
    tiles = "batch x " if problem.batch is not None else ""
    lines = kernel_header(kernel, "#", " (triton)")
    lines.append(f"# plan: template {template_name}: {problem.op}, {tiles}MBLOCK x NBLOCK tiles over K, "
                 f"epilogue of {len(kernel.stores)} store(s), indices {gw.plan.index_dtype}")
    lines += ["import triton", "import triton.language as tl", "",
              "from fxwrap.targets.cuda_triton.libm import fx_round_bf16, libdevice", "", ""]
    if gw.helpers:
        lines += O.helper_source(gw.helpers)
        lines.append("")
    lines += [deco, f"def {fname}({', '.join(ptrs + sizes + consts)}):"]
    lines += ["    " + ln for ln in body]
    text = "\n".join(lines) + "\n"

    host = IndexPrinter(name)
    numels = [("m", host.render(problem.m)), ("n", host.render(problem.n))]
    if problem.batch is not None:
        numels.insert(0, ("b", host.render(problem.batch)))
    k_static = int(problem.k) if sympy.sympify(problem.k).is_Integer else None
    configs = [c.launch_config(k_static) for c in
               gemm_configs(problem, emitter.size_hints or {}, emitter.interpret)]
    launch = {"symbol": fname, "language": emitter.language, "plan": "template", "template": template_name,
              "reduction_shape": "", "index_dtype": gw.plan.index_dtype,
              "pointers": len(kernel.inputs) + len(kernel.outputs),
              "size_symbols": tuple(sizes), "numels": tuple(numels),
              "configs": tuple(configs), "config": configs[0],
              "interpret": emitter.interpret, "autotuned": False,
              "pointer_dtypes": tuple(str(b.dtype) for b in (*kernel.inputs, *kernel.outputs))}
    device = emitter._device(kernel)
    if device is not None and device.index is not None:
        launch["device_index"] = device.index
    source = KernelSource(kernel.name, text, emitter.language, emitter.signature(kernel), launch)
    if emitter.autotune and len(configs) > 1:
        emitter._tune(source, kernel, configs)
    return source
