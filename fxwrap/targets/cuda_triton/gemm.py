"""The Triton GEMM kernel: a tiled ``tl.dot`` matrix product whose epilogue is the
scheduler's fused pointwise work, written by the Triton codegen (``codegen.KernelWriter``).

``relu(linear(x, w, b))`` with ``x`` ``(64, 96)``, ``w`` ``(128, 96)`` float32 (the ATen
``addmm(b, x, permute(w))``: ``M=64, N=128, K=96``, ``w.t()`` read through its strides
``(1, 96)``; the kernel's inputs are the call's operands, then the epilogue's: the bias)
renders as::

    @triton.jit
    def fxwrap_template_0(in_ptr0, in_ptr1, in_ptr2, out_ptr0, MBLOCK: tl.constexpr, NBLOCK: tl.constexpr,
                          KBLOCK: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
        M = 64
        N = 128
        K = 96
        pid = tl.program_id(0)
        mtiles = (M + MBLOCK - 1) // MBLOCK
        ntiles = (N + NBLOCK - 1) // NBLOCK
        tile = pid % (mtiles * ntiles)
        width = GROUP_M * ntiles                       # GROUP_M rows of tiles share b's columns
        first_m = (tile // width) * GROUP_M
        group_rows = tl.minimum(mtiles - first_m, GROUP_M)
        mtile = first_m + (tile % width) % group_rows
        ntile = (tile % width) // group_rows
        rm = mtile * MBLOCK + tl.arange(0, MBLOCK)
        rn = ntile * NBLOCK + tl.arange(0, NBLOCK)
        rk = tl.arange(0, KBLOCK)
        ram = rm % M
        rbn = rn % N
        a_ptrs = in_ptr0 + (ram[:, None] * (96) + rk[None, :] * (1))
        b_ptrs = in_ptr1 + (rk[:, None] * (1) + rbn[None, :] * (96))
        acc = tl.zeros([MBLOCK, NBLOCK], dtype=tl.float32)
        for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                kleft = K - kstep * KBLOCK
                a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0)
                b = tl.load(b_ptrs, mask=rk[:, None] < kleft, other=0.0)
            acc += tl.dot(a, b, input_precision="ieee")
            a_ptrs += KBLOCK * (1)
            b_ptrs += KBLOCK * (1)
        mindex = rm[:, None]
        mmask = mindex < M
        nindex = rn[None, :]
        nmask = nindex < N
        x0 = mindex
        x1 = nindex
        tmp0 = tl.load(in_ptr2 + (x1), nmask, other=0)      # the epilogue: template_out is acc
        tmp1 = (tmp0 + acc)
        tmp2 = tl.full([], 0.0, tl.float32)
        tmp3 = _fx_max(tmp1, tmp2)
        tl.store(out_ptr0 + (128*x0 + x1), tmp3, mmask & nmask)

Rows and columns past ``M``/``N`` are read at ``rm % M`` / ``rn % N`` (in bounds, never
stored; ``tl.max_contiguous`` hints where the operand is contiguous along M/N), so only the
``K`` tail is masked, and only where ``K`` is not a multiple of ``KBLOCK``
(``EVEN_K``, a per-config constexpr).  A batched product (``bmm``) has a third program
axis: ``zindex = pid // (mtiles * ntiles)``, the batch loop var.  ``float32`` operands use
TF32 only where ``torch.backends.cuda.matmul.allow_tf32`` says eager's cuBLAS does.

The accumulator is float32 (``template_out`` in the epilogue IR, ``fxwrap.core.templates``);
the epilogue rounds to bf16/fp16 where the graph does (``addmm`` once, after its bias), as
eager's cuBLAS call does.  The tilings (``gemm_configs``) are timed by the emitter on the GPU
like any kernel's block sizes; the fastest is then timed against cuBLAS + the epilogue kernel
by the template choice (``wrapper_ir.template_choice``).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from fxwrap.ir.loops import ScheduledKernel
from fxwrap.runtime.launch import TritonLaunch
from fxwrap.core.templates import Template, TemplateCall, accumulators
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import CodegenError, KernelWriter
from fxwrap.targets.cuda_triton.tiling import Plan, index_dtype, next_pow2

aten = torch.ops.aten
GEMM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def batched(call: TemplateCall) -> bool:
    """Whether the call is a batched product (``bmm``: output ``(B, M, N)``)."""
    return len(call.index) == 3


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
    (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
    (128, 128, 32, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4),
    (64, 256, 64, 8, 3), (128, 256, 32, 8, 4), (64, 128, 128, 4, 3), (32, 128, 128, 4, 4),
    (16, 128, 128, 4, 4), (32, 64, 128, 4, 5), (16, 64, 256, 4, 3), (64, 32, 128, 4, 4),
)
# float32: half the K depth per stage (twice the bytes per element)
_CONFIGS_32BIT = (
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
    (128, 128, 16, 4, 4), (32, 128, 64, 4, 4), (16, 128, 64, 4, 3), (32, 64, 64, 4, 4),
    (64, 32, 64, 4, 4),
)
MIN_BLOCK = 16  # tl.dot's smallest tile side


def gemm_configs(call: TemplateCall, interpret: bool, limit: int = 16) -> list[GemmConfig]:
    """The candidate tilings for ``call`` at its size hints: the table's, each block
    shrunk to the problem (next power of two, at least 16), deduplicated, in table order.
    Under the interpreter one small config (its cost is per program and per op)."""
    m, n, k = (max(1, call.hint(d)) for d in ("m", "n", "k"))
    cap_m, cap_n, cap_k = (max(MIN_BLOCK, next_pow2(v)) for v in (m, n, k))
    if interpret:
        return [GemmConfig(min(32, cap_m), min(32, cap_n), min(32, cap_k), 4, 1, 2)]
    table = _CONFIGS_32BIT if call.dtype == torch.float32 else _CONFIGS_16BIT
    out: list[GemmConfig] = []
    for bm, bn, bk, warps, stages in table:
        bm, bn, bk = min(bm, cap_m), min(bn, cap_n), min(bk, cap_k)
        warps = max(1, min(warps, bm * bn // 1024))  # at most one warp per 32x32 of the tile
        warps = 1 << (warps.bit_length() - 1)
        cfg = GemmConfig(bm, bn, bk, warps, stages, 8 if m > bm else 1)
        if cfg not in out:
            out.append(cfg)
    return out[:limit]


def allow_tf32() -> bool:
    """Whether eager's float32 matmuls on CUDA use TF32 (``torch.backends.cuda.matmul``)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


class ProductKernel:
    """A product template's kernel (``kernel.template`` a GEMM ``TemplateCall``) as its
    writers (``GemmWriter``, ``gemv.GemvWriter``) share it: the call's operands and their
    addresses, the plan over ``m``/``n`` (and ``b``), and the epilogue: the kernel's stores,
    written by a ``codegen.KernelWriter`` with ``template_out`` bound to the float32
    accumulator ``acc``."""

    def __init__(self, kernel: ScheduledKernel, target_name: str = "triton", intrinsics: tuple = ()):
        self.kernel = kernel
        self.call = call = kernel.template
        self.target_name = target_name
        self.a, self.b = call.operands[:2]  # _weight_int8pack_mm: (x, w, scales)
        self.batched = batched(call)
        rank = len(call.index)
        if tuple(kernel.ranges) != tuple(call.output.size) or len(kernel.ranges) != rank:
            raise CodegenError(f"template kernel {kernel.name}: ranges {tuple(kernel.ranges)} are not the "
                               f"{call.op} output's {tuple(call.output.size)} (target {target_name})")
        groups = {"m": [call.index[-2]], "n": [call.index[-1]]}
        ranges = {"m": [kernel.ranges[-2]], "n": [kernel.ranges[-1]]}
        if self.batched:
            groups["b"], ranges["b"] = [call.index[0]], [kernel.ranges[0]]
        self.plan = Plan("template", ("m", "n"), groups, ranges, index_dtype(kernel))
        self.writer = KernelWriter(kernel, self.plan, target_name, intrinsics)

    def ptr(self, buf) -> str:
        try:
            return self.writer.loads[buf.name][0]
        except KeyError:
            raise CodegenError(f"template kernel {self.kernel.name}: operand {buf.name!r} is not one of its "
                               f"inputs (target {self.target_name})") from None

    def idx(self, e) -> str:
        return self.writer.idx(sympy.sympify(e))

    def sizes(self) -> list[str]:
        """The first lines of a body: the size arguments' casts, ``M``, ``N``, ``K`` and ``pid``."""
        call, w = self.call, self.writer
        return [*w.size_casts(), f"M = {self.idx(call.size('m'))}", f"N = {self.idx(call.size('n'))}",
                f"K = {self.idx(call.size('k'))}", f"pid = {w.pid()}"]

    def operand(self, buf, rows: str, cols: str) -> str:
        """``ptr + (batch offset + rows * stride + cols * stride)`` of a 2-D/3-D operand."""
        stride = list(buf.stride)
        terms = []
        if self.batched:
            terms.append(f"zindex * ({self.idx(stride[0])})")
        terms += [f"{rows} * ({self.idx(stride[-2])})", f"{cols} * ({self.idx(stride[-1])})"]
        return f"{self.ptr(buf)} + (" + " + ".join(terms) + ")"

    def wrapped(self, index: str, size: str, buf, dim: int) -> str:
        """Rows (columns) past the end are read at ``index % size``: in bounds, never stored.
        Where the operand is contiguous along that dim and its size a static multiple of
        16, each aligned run of 16 is contiguous: said to the compiler, so it vectorizes."""
        text = f"{index} % {size}"
        extent = sympy.sympify(buf.size[dim])
        if sympy.sympify(buf.stride[dim]) == 1 and extent.is_Integer and int(extent) % 16 == 0:
            text = f"tl.max_contiguous(tl.multiple_of({text}, 16), 16)"
        return text

    def epilogue(self, body: list[str]) -> list[str]:
        """``body`` (the kernel up to its float32 ``acc`` over ``mindex`` x ``nindex``), then
        the index variables the epilogue reads, the epilogue and the stores."""
        w = self.writer
        for axis, index in (("b", "zindex"), ("m", "mindex"), ("n", "nindex")):
            for v in self.plan.groups.get(axis, ()):
                if v.name in w.used_vars:
                    body.append(f"{v.name} = {index}")
        top = w.function_scope(self.plan.groups)
        for node in accumulators(self.kernel):
            if node.dtype != torch.float32:
                raise CodegenError(f"template kernel {self.kernel.name}: the accumulator is float32, its epilogue "
                                   f"reads it as {node.dtype} (target {self.target_name})")
            top.env[node] = ("acc", node.dtype)
        for st in self.kernel.stores:
            w.store(top, st, ("m", "n"))
        zeros = [f"{name} = tl.zeros({w.shape(key)}, {self.plan.index_dtype})"
                 for key, name in sorted(w.zeros.items())]
        return body + zeros + top.lines

    @property
    def helpers(self) -> set[str]:
        w = self.writer
        return w.helpers | w.printer.helpers | w.ops.helpers


class GemmWriter:
    """``GemmWriter(kernel, target_name).write() -> body lines`` of a template kernel
    (``kernel.template`` a GEMM ``TemplateCall``): the product's main loop, then the
    kernel's stores (the epilogue, ``ProductKernel.epilogue``) with ``template_out``
    bound to the float32 accumulator ``acc``."""

    def __init__(self, kernel: ScheduledKernel, target_name: str = "triton", tf32: bool = False,
                 interpret: bool = False, intrinsics: tuple = ()):
        self.product = ProductKernel(kernel, target_name, intrinsics)
        self.tf32 = tf32
        self.interpret = interpret

    def dot(self) -> str:
        dtype = self.product.call.dtype
        if dtype == torch.float32:
            return f'tl.dot(a, b, input_precision="{"tf32" if self.tf32 else "ieee"}")'
        if self.interpret:  # the interpreter's dot of 16-bit floats is wrong: widen them (exact)
            return 'tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")'
        return "tl.dot(a, b)"

    def write(self) -> list[str]:
        p = self.product
        body = p.sizes()
        body += ["mtiles = (M + MBLOCK - 1) // MBLOCK",
                 "ntiles = (N + NBLOCK - 1) // NBLOCK"]
        if p.batched:
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
                 f"ram = {p.wrapped('rm', 'M', p.a, -2)}",
                 f"rbn = {p.wrapped('rn', 'N', p.b, -1)}",
                 f"a_ptrs = {p.operand(p.a, 'ram[:, None]', 'rk[None, :]')}",
                 f"b_ptrs = {p.operand(p.b, 'rk[:, None]', 'rbn[None, :]')}",
                 "acc = tl.zeros([MBLOCK, NBLOCK], dtype=tl.float32)",
                 "for kstep in range(0, (K + KBLOCK - 1) // KBLOCK):",
                 "    if EVEN_K:",
                 "        a = tl.load(a_ptrs)",
                 "        b = tl.load(b_ptrs)",
                 "    else:",
                 "        kleft = K - kstep * KBLOCK",
                 "        a = tl.load(a_ptrs, mask=rk[None, :] < kleft, other=0.0)",
                 "        b = tl.load(b_ptrs, mask=rk[:, None] < kleft, other=0.0)",
                 f"    acc += {self.dot()}",
                 f"    a_ptrs += KBLOCK * ({p.idx(p.a.stride[-1])})",
                 f"    b_ptrs += KBLOCK * ({p.idx(p.b.stride[-2])})",
                 "mindex = rm[:, None]", "mmask = mindex < M", "nindex = rn[None, :]", "nmask = nindex < N"]
        return p.epilogue(body)


def render_gemm(emitter, kernel: ScheduledKernel, template_name: str = "triton_gemm"):
    """The ``KernelSource`` of template kernel ``kernel`` for the Triton ``emitter``: the
    module text, and launch metadata in the emitter's format (grid axes ``b``/``m``/``n``,
    one config per candidate tiling, autotuned on the GPU by the emitter like any
    kernel's block sizes)."""
    call = kernel.template
    a, b = call.operands
    if call.dtype not in GEMM_DTYPES or b.dtype != a.dtype:
        raise CodegenError(f"template {template_name}: operands {a.dtype} x {b.dtype} of {call.node} "
                           f"(kernel {kernel.name}, target {emitter.target_name}); it takes "
                           f"{[str(d) for d in GEMM_DTYPES]}")
    gw = GemmWriter(kernel, emitter.target_name, tf32=allow_tf32(), interpret=emitter.interpret,
                    intrinsics=emitter.intrinsics)
    k = sympy.sympify(call.size("k"))
    configs = [c.launch_config(int(k) if k.is_Integer else None) for c in gemm_configs(call, emitter.interpret)]
    tiles = "batch x " if gw.product.batched else ""
    return template_source(emitter, kernel, template_name, gw, ("MBLOCK", "NBLOCK", "KBLOCK", "GROUP_M", "EVEN_K"),
                           configs, f"{tiles}MBLOCK x NBLOCK tiles over K")


def template_source(emitter, kernel: ScheduledKernel, template_name: str, writer,
                    constexprs: tuple, configs: list, shape_note: str):
    """The ``KernelSource`` of a product template's kernel: ``writer``'s body (``write()``;
    ``writer.product``: its ``ProductKernel``) in one ``@triton.jit`` function with the
    kernel's usual signature and the ``constexprs``, launched over the grid axes
    ``b``/``m``/``n`` (each divided by its ``<AXIS>BLOCK``), each of ``configs`` timed on the
    GPU by the emitter (the fastest kept)."""
    from fxwrap.targets.base import KernelSource, kernel_function_name, kernel_header
    from fxwrap.targets.cuda_triton.printer import IndexPrinter

    call = kernel.template
    name = emitter.target_name
    body = writer.write()
    product = writer.product
    fname = kernel_function_name(kernel)
    ptrs = [f"in_ptr{i}" for i in range(len(kernel.inputs))] + [f"out_ptr{i}" for i in range(len(kernel.outputs))]
    sizes = [s.name for s in kernel.size_symbols]
    consts = [f"{c}: tl.constexpr" for c in constexprs]
    deco = f"@triton.jit(do_not_specialize={sizes!r})" if sizes else "@triton.jit"
    lines = kernel_header(kernel, "#", " (triton)")
    lines.append(f"# plan: template {template_name}: {call.op}, {shape_note}, "
                 f"epilogue of {len(kernel.stores)} store(s), indices {product.plan.index_dtype}")
    lines += ["import triton", "import triton.language as tl", "",
              "from fxwrap.targets.cuda_triton.libm import fx_round_bf16, libdevice", "", ""]
    if product.helpers:
        lines += O.helper_source(product.helpers)
        lines.append("")
    lines += [deco, f"def {fname}({', '.join(ptrs + sizes + consts)}):"]
    lines += ["    " + ln for ln in body]
    text = "\n".join(lines) + "\n"

    host = IndexPrinter(name)
    numels = [("m", host.render(call.size("m"))), ("n", host.render(call.size("n")))]
    if product.batched:
        numels.insert(0, ("b", host.render(call.size("batch"))))
    launch = TritonLaunch(symbol=fname, language=emitter.language, plan="template", template=template_name,
                          reduction_shape="", index_dtype=product.plan.index_dtype,
                          pointers=len(kernel.inputs) + len(kernel.outputs),
                          size_symbols=tuple(sizes), numels=tuple(numels),
                          configs=tuple(configs), config=configs[0],
                          interpret=emitter.interpret, autotuned=False,
                          pointer_dtypes=tuple(str(b.dtype) for b in (*kernel.inputs, *kernel.outputs)))
    device = emitter._device(kernel)
    if device is not None and device.index is not None:
        launch.device_index = device.index
    source = KernelSource(kernel.name, text, emitter.language, emitter.signature(kernel), launch)
    if emitter.autotune and len(configs) > 1:
        emitter._tune(source, kernel, configs)  # each tiling timed; the fastest kept
    return source


class TritonGemm(Template):
    """``mm``/``addmm``/``bmm`` of float32, bfloat16 or float16 operands (any strides) on
    the Triton targets, the scheduler's epilogue fused: ``render(kernel, emitter)`` is a
    ``KernelSource`` of one ``@triton.jit`` function with the kernel's usual signature (the
    call's operands first), see the module docstring.  ``addmm``'s bias and scales are
    in the epilogue (``fxwrap.core.templates``)."""

    name = "triton_gemm"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})
    in_default_mode = False  # max-autotune or templates="auto" (Template.in_default_mode)

    def refusal(self, call: TemplateCall) -> str | None:
        if call.dtype not in GEMM_DTYPES:
            return f"{call.dtype} operands ({self.name} computes float32, bfloat16 and float16)"
        if call.acc_dtype != torch.float32:
            return f"a {call.acc_dtype} accumulator"
        if any(int(h) == 0 for _, h in call.hints):
            return "an empty product"
        return None

    def render(self, kernel: ScheduledKernel, emitter):
        return render_gemm(emitter, kernel, self.name)
