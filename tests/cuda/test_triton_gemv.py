"""The Triton GEMV template (``fxwrap.targets.cuda_triton.gemv``) through torch.compile (cuda
on a GPU, triton-interpret without one): one-row products (``x[1, K]``, ``x[1, 1, K]``, a
batched ``bmm`` of ``(B, 1, K)``) in float32/bfloat16/float16 and int8 weight-only
(``linear(x, w_int8.to(x.dtype)) * scale``, rewritten to ``_weight_int8pack_mm``, the
dequantization fused), with bias/activation/residual epilogues: eager's numbers, one
launch, no ATen product left, the ``TemplateChoice`` naming ``triton_gemv`` when forced
(``templates="always"``); products of 2 to ``MAX_ROWS`` (8) rows likewise, in each of the
kernel's forms (``FORM_PARTIAL``, ``FORM_STEP_SUM``, ``FORM_DOT``); more rows (or a symbolic
row count) go to ``triton_gemm`` or the extern, and in the default mode the GEMV is timed
against the ATen call and the faster kept."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core.patterns import INT8_MM, aten_int8_mm_refusal
from fxwrap.ir.lines import CallExtern, CallKernel, TemplateChoice
from fxwrap.targets.cuda_triton import gemv
from triton_helpers import DEVICE, GPU, TARGET

aten = torch.ops.aten
PRODUCTS = {aten.mm.out, aten.addmm.out, aten.bmm.out, aten.mm.default, aten.addmm.default, aten.bmm.default,
            INT8_MM}
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16


def compiled(fn, templates="always", dynamic=False):
    programs: list = []
    torch._dynamo.reset()
    c = torch.compile(fn, backend=fxwrap.Backend(TARGET, {"on_program": programs.append, "templates": templates}),
                      dynamic=dynamic, fullgraph=True)
    return c, programs


def lines(programs, kind):
    return [ln for p in programs for ln in p.lines if isinstance(ln, kind)]


def product_externs(programs):
    return [ln for ln in lines(programs, CallExtern) if ln.op in PRODUCTS]


def gemv_kernels(programs):
    return [ln for ln in lines(programs, CallKernel) if "# plan: template triton_gemv" in ln.kernel.source]


def chosen(programs):
    return [ch.chosen for ch in lines(programs, TemplateChoice)]


def rand(*shape, dtype=f32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def tol(dtype, k):
    if dtype == f32:
        return dict(atol=1e-4 * max(1.0, k ** 0.5), rtol=1e-4)
    return dict(atol=3e-2, rtol=3e-2) if dtype == bf16 else dict(atol=4e-3, rtol=4e-3)


@pytest.fixture(autouse=True)
def full_precision_cublas_reductions():
    """Eager's reference without cuBLAS's bf16/fp16 split-K reductions (on by default): with
    them a bf16 product of 2-8 rows and K = 1000 was 0.05-0.15 off the float32 result in a few
    elements on the H200, more than the GEMV's own rounding, so the comparison judged eager's
    error (shown on the H200: with them off, every test here passes with ``FORM_DOT``)."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    yield
    matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = saved


def int8_weight(n, k):
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEVICE)
    scale = (torch.rand(n, device=DEVICE) * 0.02 + 0.005)
    return w, scale


EPILOGUES = {
    "plain": lambda y, b, r: y,
    "bias": lambda y, b, r: y + b,
    "bias_relu": lambda y, b, r: torch.relu(y + b),
    "bias_gelu_tanh": lambda y, b, r: F.gelu(y + b, approximate="tanh"),
    "silu_residual": lambda y, b, r: F.silu(y) * 0.5 + r,
}


def check_forced_gemv(programs, launches=1):
    texts = [c.text for c in lines(programs, TemplateChoice)]
    assert chosen(programs) and set(chosen(programs)) == {"triton_gemv"}, texts
    assert not product_externs(programs), "a matrix product still runs as an ATen call"
    assert len(gemv_kernels(programs)) >= 1
    assert len(lines(programs, CallKernel)) == launches, "the epilogue (or a dequantization) is a kernel of its own"


@pytest.mark.parametrize("dtype", [f32, bf16, f16], ids=["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
@pytest.mark.parametrize("lead", [(1,), (1, 1)], ids=["x1K", "x11K"])
def test_one_row_linear(lead, epilogue, dtype):
    """``ep(linear(x, w) [+ b])``, x ``[1, K]`` or ``[1, 1, K]`` (a decode step's token), K and N
    not multiples of the tile: mm or addmm with the epilogue in one GEMV launch."""
    ep = EPILOGUES[epilogue]
    k, n = 45, 37

    def fn(x, w, b, r):
        return ep(F.linear(x, w), b, r)

    c, programs = compiled(fn)
    x, w, b, r = rand(*lead, k, dtype=dtype), rand(n, k, dtype=dtype), rand(n, dtype=dtype), rand(*lead, n, dtype=dtype)
    torch.testing.assert_close(c(x, w, b, r), fn(x, w, b, r), **tol(dtype, k))
    check_forced_gemv(programs)


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["float32", "bfloat16"])
def test_linear_with_bias_addmm_and_even_k(dtype):
    """``F.linear(x, w, b)`` (addmm: the bias in the epilogue) with K a multiple of the
    tile's KBLOCK (the unmasked loop) and N a multiple of NBLOCK."""
    def fn(x, w, b):
        return F.silu(F.linear(x, w, b))

    c, programs = compiled(fn)
    x, w, b = rand(1, 1, 128, dtype=dtype), rand(64, 128, dtype=dtype), rand(64, dtype=dtype)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(dtype, 128))
    check_forced_gemv(programs)
    assert "EVEN_K" in gemv_kernels(programs)[0].kernel.source


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["float32", "bfloat16"])
def test_weight_read_along_n(dtype):
    """``x @ w`` with ``w`` a row-major ``[K, N]``: the weight contiguous along N."""
    def fn(x, w):
        return torch.tanh(x @ w)

    c, programs = compiled(fn)
    x, w = rand(1, 50, dtype=dtype), rand(50, 70, dtype=dtype)
    torch.testing.assert_close(c(x, w), fn(x, w), **tol(dtype, 50))
    check_forced_gemv(programs)
    assert "the weight read along N" in gemv_kernels(programs)[0].kernel.source


@pytest.mark.parametrize("dtype", [f32, bf16], ids=["float32", "bfloat16"])
def test_batched_one_row_bmm(dtype):
    """A decode step's attention scores: ``bmm`` of ``(B, 1, D)`` by ``(B, D, T)``, then softmax."""
    def fn(q, k):
        return torch.bmm(q, k).softmax(-1)

    c, programs = compiled(fn)
    q, k = rand(5, 1, 24, dtype=dtype), rand(5, 24, 33, dtype=dtype)
    torch.testing.assert_close(c(q, k), fn(q, k), **tol(dtype, 24))
    assert set(chosen(programs)) == {"triton_gemv"} and not product_externs(programs)


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("epilogue", ["plain", "bias_relu", "silu_residual"])
@pytest.mark.parametrize("lead", [(1,), (1, 1)], ids=["x1K", "x11K"])
def test_int8_weight_only(lead, epilogue, dtype):
    """``linear(x, w_int8.to(x.dtype)) * scale`` then the epilogue: one launch reading the
    int8 weight (no dequantized copy, no ATen product)."""
    ep = EPILOGUES[epilogue]
    k, n = 64, 37

    def fn(x, w, s, b, r):
        return ep(F.linear(x, w.to(x.dtype)) * s, b, r)

    c, programs = compiled(fn)
    w, s = int8_weight(n, k)
    x, b, r = rand(*lead, k, dtype=dtype), rand(n, dtype=dtype), rand(*lead, n, dtype=dtype)
    s = s.to(dtype)
    got, want = c(x, w, s, b, r), fn(x, w, s, b, r)
    # eager rounds the product to bf16 before the scale; the kernel rounds product * scale once
    torch.testing.assert_close(got, want, **(tol(dtype, k) if dtype == f32 else dict(atol=5e-2, rtol=2e-2)))
    check_forced_gemv(programs)
    source = gemv_kernels(programs)[0].kernel.source
    assert "_weight_int8pack_mm" in source and "b.to(tl.float32)" in source


def test_int8_with_more_rows_keeps_the_dequantize_pattern():
    """``MAX_ROWS + 1`` (9) rows: no rewrite (the GEMV refuses them, ``pattern_refusal``), the
    dequantized product as without templates, eager's numbers."""
    def fn(x, w, s):
        return F.linear(x, w.to(x.dtype)) * s

    c, programs = compiled(fn)
    w, s = int8_weight(24, 32)
    x = rand(gemv.MAX_ROWS + 1, 32)
    torch.testing.assert_close(c(x, w, s), fn(x, w, s), **tol(f32, 32))
    assert "triton_gemv" not in chosen(programs)
    assert not any("_weight_int8pack_mm" in ln.kernel.source for ln in lines(programs, CallKernel))
    assert not [ln for ln in lines(programs, CallExtern) if ln.op == INT8_MM]  # not ATen's int8 op either
    assert chosen(programs) == ["triton_gemm"]  # the dequantized weight's product


def test_more_rows_go_to_the_gemm_template():
    """``templates="always"`` with 9 rows (``MAX_ROWS + 1``): the GEMV refuses, ``triton_gemm``
    computes it."""
    def fn(x, w, b):
        return torch.relu(F.linear(x, w, b))

    c, programs = compiled(fn)
    x, w, b = rand(gemv.MAX_ROWS + 1, 40), rand(24, 40), rand(24)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(f32, 40))
    assert chosen(programs) == ["triton_gemm"] and not gemv_kernels(programs)


def test_dynamic_rows_are_not_one_row():
    """Rows of a symbolic size are never taken for one, nor for few (even where the example
    has 2 or 5): the GEMV serves a static row count only."""
    def fn(x, w):
        return F.linear(x, w) + 1

    c, programs = compiled(fn, templates="default", dynamic=True)
    w = rand(24, 40)
    for rows in (2, 5):
        x = rand(rows, 40)
        torch.testing.assert_close(c(x, w), fn(x, w), **tol(f32, 40))
    assert not gemv_kernels(programs) and "triton_gemv" not in chosen(programs)


def test_default_mode_times_gemv_against_the_extern(tmp_path, monkeypatch):
    """The default mode (``in_default_mode``): the GEMV and the ATen call + epilogue are
    both timed, the faster kept (the extern on ties and on wins under 3%); more rows: the
    ATen call, nothing timed (the Triton GEMM is not in the default mode)."""
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    k, n = (4096, 4096) if GPU else (64, 48)
    dtype = bf16 if GPU else f32

    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))

    c, programs = compiled(fn, templates="default")
    x, w, b = rand(1, k, dtype=dtype), rand(n, k, dtype=dtype), rand(n, dtype=dtype)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(dtype, k))
    [choice] = lines(programs, TemplateChoice)
    times = dict(choice.times)
    assert set(times) == {"extern", "triton_gemv"} and all(t > 0 for t in times.values())
    wins = times["triton_gemv"] < times["extern"] * 0.97
    assert choice.chosen == ("triton_gemv" if wins else "extern")
    assert bool(gemv_kernels(programs)) == wins and bool(product_externs(programs)) == (not wins)

    c, programs = compiled(fn, templates="default")
    x = rand(gemv.MAX_ROWS + 1, k, dtype=dtype)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(dtype, k))
    # no template of the default mode takes it: the ATen call, with no choice to record
    assert not chosen(programs) and product_externs(programs) and not gemv_kernels(programs)


def test_aten_int8_kernel_is_trusted_only_where_it_is_right():
    """Where ATen's ``_weight_int8pack_mm`` runs: a CUDA kernel must exist in this torch and
    never reads strided activations (it indexes them as contiguous rows)."""
    has_cuda = torch._C._dispatch_has_kernel_for_dispatch_key("aten::_weight_int8pack_mm", "CUDA")
    assert (aten_int8_mm_refusal(bf16, 4096, "cuda", True) is None) == has_cuda
    assert aten_int8_mm_refusal(bf16, 4096, "cuda", False) is not None
    assert aten_int8_mm_refusal(bf16, 4096, "cpu") is None and aten_int8_mm_refusal(bf16, 100, "cpu") is not None
    assert "no vulkan kernel" in aten_int8_mm_refusal(bf16, 64, "vulkan")


def test_int8_without_an_aten_kernel_the_gemv_is_the_path(monkeypatch):
    """Where ATen's ``_weight_int8pack_mm`` cannot run on the device (no kernel in this torch),
    activations of 1 to ``MAX_ROWS`` rows are still rewritten -- the GEMV promises to compute
    them (``pattern_guarantee``) and the extern is neither timed nor chosen --, and more rows
    keep the dequantize-and-mm pattern: ATen's op never runs."""
    from fxwrap.core import patterns

    monkeypatch.setattr(patterns, "aten_int8_mm_refusal", lambda *a, **k: "no kernel of the op here (test)")

    def fn(x, w, s, r):
        return F.linear(x, w.to(x.dtype)) * s + r

    w, s = int8_weight(37, 64)
    for rows, want_gemv in ((1, True), (4, True), (gemv.MAX_ROWS + 1, False)):
        c, programs = compiled(fn, templates="default")
        x, r = rand(1, rows, 64), rand(1, rows, 37)
        torch.testing.assert_close(c(x, w, s, r), fn(x, w, s, r), **tol(f32, 64))
        assert not [ln for ln in lines(programs, CallExtern) if ln.op == INT8_MM]
        assert bool(gemv_kernels(programs)) == want_gemv
        if want_gemv:
            [choice] = lines(programs, TemplateChoice)
            assert choice.chosen == "triton_gemv" and "not run: no kernel of the op here" in choice.text


def test_tilings_read_4_to_16_kib_of_weight_per_step():
    """``gemv_configs`` at decode shapes: powers of two capped at the problem, 4-16 KiB of
    weight per program and step along the weight's contiguous axis (K for an nn.Linear
    weight, twice the elements for int8), N-wide tiles for a weight contiguous along N."""
    import sympy
    from fxwrap.core.templates import TemplateCall
    from fxwrap.ir.lines import Buffer
    from fxwrap.targets.cuda_triton.gemv import gemv_configs

    def call(k, n, dtype, along_n=False):
        x = Buffer("x", (1, k), (k, 1), torch.bfloat16, torch.device("cuda"))
        w = Buffer("w", (k, n), (n, 1) if along_n else (1, k), dtype, torch.device("cuda"))
        out = Buffer("out", (1, n), (n, 1), torch.bfloat16, torch.device("cuda"))
        sizes = (("batch", sympy.Integer(1)), ("m", sympy.Integer(1)), ("n", sympy.Integer(n)), ("k", sympy.Integer(k)))
        return TemplateCall(aten.mm.default, "mm", (x, w), out, sizes, tuple((d, int(v)) for d, v in sizes))

    for dtype in (bf16, torch.int8):
        configs = gemv_configs(call(4096, 11008, dtype), interpret=False)
        assert len(configs) >= 8 and len(set(configs)) == len(configs)
        for c in configs:
            assert 4096 <= c.block_n * c.block_k * dtype.itemsize <= 16384
            assert c.block_k & (c.block_k - 1) == 0 and c.block_n & (c.block_n - 1) == 0 and c.num_warps <= 8
    small = gemv_configs(call(64, 24, bf16), interpret=False)
    assert all(c.block_k <= 64 and c.block_n <= 32 for c in small)
    wide = gemv_configs(call(4096, 4096, bf16, along_n=True), interpret=False)
    assert all(c.block_n >= 128 and c.block_k <= 64 for c in wide)
    assert gemv_configs(call(4096, 4096, bf16), interpret=True) == [gemv_configs(call(64, 24, bf16), interpret=True)[0]]


def test_symbolic_k_and_n():
    """``dynamic=True``: K and N are size symbols (the one row stays a static 1), the
    kernel takes them as arguments and masks the K tail: eager's numbers at every size."""
    def fn(x, w, b):
        return F.relu(F.linear(x, w, b))

    c, programs = compiled(fn, dynamic=True)
    for k, n in ((40, 24), (56, 33), (72, 17)):
        x, w, b = rand(1, k), rand(n, k), rand(n)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(f32, k))
    [launch] = gemv_kernels(programs)
    assert [a.role for a in launch.kernel.signature][-2:] == ["size", "size"] and chosen(programs) == ["triton_gemv"]


# -- few rows: M = 2 .. MAX_ROWS ---------------------------------------------------------

FORMS = {"partial": gemv.FORM_PARTIAL, "step_sum": gemv.FORM_STEP_SUM, "dot": gemv.FORM_DOT}


def only_form(monkeypatch, form, dtype):
    """Compile the few-row GEMV in ``form`` alone: under the interpreter its one tiling's form
    (``INTERPRET_FORM``), on a GPU the table's tilings of that form (the autotuner times those;
    the table offers ``FORM_DOT`` to 16-bit activations only: float32 ones skip it there)."""
    if GPU and form == gemv.FORM_DOT and dtype == f32:
        pytest.skip("the table offers FORM_DOT to 16-bit activations only (gemv_configs)")
    monkeypatch.setattr(gemv, "DOT_FORM_ON_GPU", True)  # the form under test (FXWRAP_GEMV_DOT=0 turns it off)
    monkeypatch.setattr(gemv, "INTERPRET_FORM", form)
    table = gemv.gemv_configs
    monkeypatch.setattr(gemv, "gemv_configs",
                        lambda call, interpret: [c for c in table(call, interpret) if c.form == form])


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 8])
def test_int8_weight_only_few_rows(rows, dtype, form, monkeypatch):
    """Batch-2..8 decode: ``linear(x, w_int8.to(x.dtype)) * scale`` of ``rows`` rows (odd N
    and K: masked K tail, wrapped N), an epilogue (plain, bias + relu, silu + residual by
    row count), in each form: one launch reading the int8 weight, rewritten to
    ``_weight_int8pack_mm`` and computed by the GEMV (no dequantized copy, no ATen product),
    eager's numbers."""
    only_form(monkeypatch, FORMS[form], dtype)
    ep = EPILOGUES[("plain", "bias_relu", "silu_residual")[rows % 3]]
    k, n = 45, 37

    def fn(x, w, s, b, r):
        return ep(F.linear(x, w.to(x.dtype)) * s, b, r)

    c, programs = compiled(fn)
    w, s = int8_weight(n, k)
    x, b, r, s = rand(rows, k, dtype=dtype), rand(n, dtype=dtype), rand(rows, n, dtype=dtype), s.to(dtype)
    got, want = c(x, w, s, b, r), fn(x, w, s, b, r)
    torch.testing.assert_close(got, want, **(tol(dtype, k) if dtype == f32 else dict(atol=5e-2, rtol=2e-2)))
    check_forced_gemv(programs)
    [launch] = gemv_kernels(programs)
    assert "_weight_int8pack_mm" in launch.kernel.source and f"for {rows} rows" in launch.kernel.source
    assert dict(launch.kernel.launch.config)["FORM"] == FORMS[form]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [bf16, f32, f16], ids=["bfloat16", "float32", "float16"])
def test_float_linear_few_rows(dtype, form, monkeypatch):
    """``gelu(linear(x, w, b))`` (addmm, the bias in the epilogue) of 3 rows, ``x @ w`` of 6
    rows with ``w`` read along N, and of 5 transposed rows (``x`` contiguous along M): the
    GEMV in each form, eager's numbers."""
    only_form(monkeypatch, FORMS[form], dtype)

    def linear(x, w, b):
        return F.gelu(F.linear(x, w, b))

    def along_n(x, w):
        return torch.tanh(x @ w)

    for fn, args in ((linear, (rand(3, 45, dtype=dtype), rand(37, 45, dtype=dtype), rand(37, dtype=dtype))),
                     (along_n, (rand(6, 50, dtype=dtype), rand(50, 70, dtype=dtype))),
                     (along_n, (rand(50, 5, dtype=dtype).t(), rand(50, 37, dtype=dtype)))):
        c, programs = compiled(fn)
        torch.testing.assert_close(c(*args), fn(*args), **tol(dtype, 50))
        check_forced_gemv(programs)


def test_batched_few_rows_bmm():
    """Attention scores of 4 query positions: ``bmm`` of ``(B, 4, D)`` by ``(B, D, T)``,
    then softmax: the GEMV, batch x tiles, eager's numbers."""
    def fn(q, k):
        return torch.bmm(q, k).softmax(-1)

    c, programs = compiled(fn)
    q, k = rand(5, 4, 24), rand(5, 24, 33)
    torch.testing.assert_close(c(q, k), fn(q, k), **tol(f32, 24))
    assert set(chosen(programs)) == {"triton_gemv"} and not product_externs(programs)


@pytest.mark.parametrize("rows", [1, 2, 4, 8, 9])
def test_template_serves_up_to_max_rows(rows):
    """Structure by row count: the GEMV's kernel is in the program for 1 to 8 rows (the
    one-row kernel has no ``FORM``; few rows have it), not for 9 (``triton_gemm``'s), and
    the numbers are eager's either way."""
    def fn(x, w, s):
        return F.linear(x, w.to(x.dtype)) * s

    c, programs = compiled(fn)
    w, s = int8_weight(24, 40)
    x = rand(rows, 40)
    torch.testing.assert_close(c(x, w, s), fn(x, w, s), **tol(f32, 40))
    kernels = gemv_kernels(programs)
    assert bool(kernels) == (rows <= gemv.MAX_ROWS)
    assert chosen(programs) == (["triton_gemv"] if rows <= gemv.MAX_ROWS else ["triton_gemm"])
    if kernels:
        assert ("FORM: tl.constexpr" in kernels[0].kernel.source) == (rows > 1)


def test_few_row_tilings_by_band(monkeypatch):
    """``gemv_configs`` for 2-8 rows: the band's table (``GEMV_BANDS``: up to 2, 4, 8 rows),
    every form offered for bf16 activations, ``FORM_DOT`` never for float32 ones nor with a
    block under 16; ``FORM_PARTIAL``'s float32 partial sums at most 64 registers a thread
    (rows padded to a power of two); MBLOCK 16 for ``FORM_DOT``, the padded rows otherwise."""
    import sympy
    from fxwrap.core.templates import TemplateCall
    from fxwrap.ir.lines import Buffer
    from fxwrap.targets.cuda_triton.tiling import next_pow2

    def call(m, k, n, dtype):
        x = Buffer("x", (m, k), (k, 1), dtype, torch.device("cuda"))
        w = Buffer("w", (k, n), (1, k), torch.int8, torch.device("cuda"))
        out = Buffer("out", (m, n), (n, 1), dtype, torch.device("cuda"))
        sizes = (("batch", sympy.Integer(1)), ("m", sympy.Integer(m)), ("n", sympy.Integer(n)), ("k", sympy.Integer(k)))
        return TemplateCall(INT8_MM, "mm", (x, w), out, sizes, tuple((d, int(v)) for d, v in sizes))

    assert [band.rows for band in gemv.GEMV_BANDS] == [1, 2, 4, 8] and gemv.MAX_ROWS == 8
    monkeypatch.setattr(gemv, "DOT_FORM_ON_GPU", False)  # FXWRAP_GEMV_DOT=0
    assert gemv.FORM_DOT not in {c.form for c in gemv.gemv_configs(call(4, 4096, 14336, bf16), interpret=False)}
    monkeypatch.setattr(gemv, "DOT_FORM_ON_GPU", True)  # the default
    for rows in range(2, 9):
        assert gemv.row_band(rows).rows == next_pow2(rows)
        configs = gemv.gemv_configs(call(rows, 4096, 14336, bf16), interpret=False)
        assert {c.form for c in configs} == set(FORMS.values()) and len(set(configs)) == len(configs)
        for c in configs:
            if c.form == gemv.FORM_PARTIAL:
                assert next_pow2(rows) * c.block_n * c.block_k <= 64 * 32 * c.num_warps
            assert c.num_stages == 1 or c.form == gemv.FORM_DOT  # only a dot's loads are pipelined
            block_m = dict(c.launch_config(4096, rows))["MBLOCK"]
            assert block_m == (16 if c.form == gemv.FORM_DOT else next_pow2(rows))
        fp32 = gemv.gemv_configs(call(rows, 4096, 14336, f32), interpret=False)
        assert fp32 and gemv.FORM_DOT not in {c.form for c in fp32}
        small = gemv.gemv_configs(call(rows, 40, 8, bf16), interpret=False)
        assert all(min(c.block_n, c.block_k) >= 16 for c in small if c.form == gemv.FORM_DOT)
    one_row = gemv.gemv_configs(call(1, 4096, 14336, bf16), interpret=False)
    assert {c.form for c in one_row} == {gemv.FORM_PARTIAL} and "FORM" not in dict(one_row[0].launch_config(4096))


def test_benchmark_times_every_candidate_tiling(monkeypatch):
    """``benchmarks/gemv.py``'s per-tiling times (the data ``GEMV_BANDS`` is retuned from):
    every candidate of the compiled GEMV bound into the program in turn and timed, one row
    each naming its tiling and form, the autotuner's pick marked and bound again after (the
    program still gives eager's numbers)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "gemv.py"
    spec = importlib.util.spec_from_file_location("gemv_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tilings = [gemv.GemvConfig(16, 32, 1, 1, form) for form in sorted(FORMS.values())]
    monkeypatch.setattr(gemv, "gemv_configs", lambda call, interpret: tilings)
    c, programs = compiled(bench.int8_linear)
    w, s = int8_weight(37, 64)
    x, s = rand(4, 64, dtype=bf16), s.to(bf16)
    want = bench.int8_linear(x, w, s)
    torch.testing.assert_close(c(x, w, s), want, atol=5e-2, rtol=2e-2)
    kernel = bench.gemv_kernel(programs)
    picked = kernel.launcher()
    rows = bench.candidate_times(kernel, c, [(x, w, s)], 2, TARGET.name, DEVICE.type)
    assert [r["config"] for r in rows] == ["4x16x32/w1/s1/form0", "4x16x32/w1/s1/form1", "16x16x32/w1/s1/form2"]
    assert all(r["us"] > 0 for r in rows) and sum(r["picked"] for r in rows) == 1
    assert kernel.launcher() is picked
    torch.testing.assert_close(c(x, w, s), want, atol=5e-2, rtol=2e-2)


def test_few_rows_with_symbolic_k_and_n():
    """A static row count (4) with K and N size symbols (``mark_dynamic``): the GEMV takes
    them as arguments, masks the K tail and wraps N, eager's numbers at every size."""
    def fn(x, w, b):
        return F.relu(F.linear(x, w, b))

    c, programs = compiled(fn, templates="always", dynamic=None)
    for k, n in ((40, 24), (56, 33), (72, 17)):
        x, w, b = rand(4, k), rand(n, k), rand(n)
        torch._dynamo.mark_dynamic(x, 1)
        torch._dynamo.mark_dynamic(w, 0)
        torch._dynamo.mark_dynamic(w, 1)
        torch._dynamo.mark_dynamic(b, 0)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(f32, k))
    [launch] = gemv_kernels(programs)
    assert "M = 4" in launch.kernel.source and [a.role for a in launch.kernel.signature][-2:] == ["size", "size"]
    assert chosen(programs) == ["triton_gemv"]


@pytest.mark.skipif(not GPU, reason="CUDA only: under the interpreter the table offers one tiling, which the "
                                    "tests above run; on a GPU the autotuner keeps one of many")
@pytest.mark.parametrize("kind", ["int8_bf16", "bf16", "fp32"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_every_tiling_gives_eager_numbers_on_the_gpu(rows, kind, monkeypatch):
    """Every candidate tiling of the table (every form, ``FORM_DOT`` too) bound in turn into
    the compiled program: eager's numbers for each (K = 1000 and N = 300: a K tail for most
    KBLOCKs, N past the tiles), not only for the one the autotuner kept."""
    from fxwrap.targets.base import KernelSource

    monkeypatch.setattr(gemv, "DOT_FORM_ON_GPU", True)

    dtype = f32 if kind == "fp32" else bf16
    k, n = 1000, 300
    b, x = rand(n, dtype=dtype), rand(rows, k, dtype=dtype)
    if kind == "int8_bf16":
        w, s = int8_weight(n, k)
        args, s = (x, w, s.to(dtype), b), s.to(dtype)

        def fn(x, w, s, b):
            return torch.relu(F.linear(x, w.to(x.dtype)) * s + b)
    else:
        args = (x, rand(n, k, dtype=dtype), b)

        def fn(x, w, b):
            return torch.relu(F.linear(x, w, b))

    c, programs = compiled(fn)
    want = fn(*args)
    torch.testing.assert_close(c(*args), want, **tol(dtype, k))
    [launch] = gemv_kernels(programs)
    kernel = launch.kernel
    emitter = TARGET.emitter(TARGET)
    picked = kernel.launcher()
    assert len(kernel.launch.configs) >= 8
    try:
        for cfg in kernel.launch.configs:
            source = KernelSource(kernel.name, kernel.source, "triton", kernel.signature,
                                  kernel.launch.replace(config=cfg))
            kernel.bind(emitter.load(source))
            torch.testing.assert_close(c(*args), want, **tol(dtype, k), msg=lambda m, cfg=cfg: f"{cfg}: {m}")
    finally:
        kernel.bind(picked)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_int8_op_with_fp16_activations(rows):
    """``_weight_int8pack_mm`` called directly with float16 activations (the pattern rewrite
    takes bf16 and fp32 only) and a gelu epilogue: the GEMV, the float32 reference's numbers."""
    def fn(x, w, s):
        return F.gelu(torch._weight_int8pack_mm(x, w, s))

    c, programs = compiled(fn)
    w, s = int8_weight(37, 45)
    x, s = rand(rows, 45, dtype=f16), (s / 8).to(f16)
    want = F.gelu((x.float() @ w.float().t()) * s.float()).to(f16)
    torch.testing.assert_close(c(x, w, s), want, atol=1e-2, rtol=1e-2)
    check_forced_gemv(programs)
