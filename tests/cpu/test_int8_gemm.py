"""The int8 weight-only GEMM on the C++ target (targets/cpu_cpp/int8_gemm.py) and the
dequantize-and-linear pattern (core/patterns.py).

``aten._weight_int8pack_mm(x, w, scales)`` and ``linear(x, w.to(x.dtype)) * scale`` in bf16
and fp32, batch 1/7/32, sizes off the kernel's blocks (16/32 in k, 4/8 channels), a
dynamic batch, fused epilogues: each runs in the template kernel (no ATen call of the
op) with eager's numbers.  Eager's own kernel of the op is wrong for bf16 with k not a
multiple of 32 in torch 2.13 (wrong numbers or a crash), so those cases compare with
the dequantized product computed in fp32 (what eager's pattern computes before its
bf16 roundings); every other case with eager's op or eager's pattern.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core.patterns import aten_int8_mm_refusal
from fxwrap.targets.cpu_cpp.int8_gemm import REQUIRED_CPU_FLAGS, cpu_flags
from fxwrap.ir.lines import CallExtern, CallKernel, TemplateChoice
from fxwrap.wrapper_ir.template_choice import TEMPLATE_MIN_GAIN

aten = torch.ops.aten
INT8_MM = aten._weight_int8pack_mm.default

pytestmark = pytest.mark.skipif(not set(REQUIRED_CPU_FLAGS) <= cpu_flags(),
                                reason=f"the int8 template needs a CPU with {', '.join(REQUIRED_CPU_FLAGS)}")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles afresh (the same function compiled for many dtypes and sizes
    would otherwise hit dynamo's recompile limit)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, templates="always", dynamic=False):
    programs: list = []
    c = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "templates": templates}),
                      dynamic=dynamic, fullgraph=True)
    return c, programs


def lines(programs, kind):
    return [ln for p in programs for ln in p.lines if isinstance(ln, kind)]


def int8_externs(programs):
    return [ln for ln in lines(programs, CallExtern) if ln.op == INT8_MM]


def compute_externs(programs):
    """ATen calls other than bookkeeping (a view's storage offset)."""
    return [ln for ln in lines(programs, CallExtern) if ln.op != aten.sym_storage_offset.default]


def int8_template_launches(programs):
    chosen = {c.chosen for c in lines(programs, TemplateChoice)}
    assert chosen == {"cpp_int8_gemm"}, chosen
    return [ln for ln in lines(programs, CallKernel) if "_template_" in ln.kernel.name]


def operands(m, n, k, dtype, lead=()):
    x = torch.randn(*lead, m, k, dtype=dtype)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    scale = (torch.rand(n) * 0.02 + 0.001).to(dtype)  # per-channel scales of a quantized weight
    return x, w, scale


def reference_op(x, w, scale):
    """Eager's ``_weight_int8pack_mm`` where its kernel is exact, else the same sum in fp32
    times the scale, rounded once to x's dtype (what the op computes)."""
    if aten_int8_mm_refusal(x.dtype, x.shape[-1]) is None:
        return torch._weight_int8pack_mm(x, w, scale)
    return ((x.float() @ w.float().t()) * scale.float()).to(x.dtype)


def tol(dtype):
    # bf16: the op rounds sum * scale once, eager's pattern twice (the product, then the
    # scaled value): one or two bf16 ulps apart
    return dict(atol=2e-2, rtol=1.6e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)


SIZES = [(1, 37, 45), (7, 13, 100), (32, 35, 1000), (1, 64, 4096 + 32), (7, 4, 17), (32, 9, 33), (6, 8, 64)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m,n,k", SIZES)
def test_op_in_the_template_kernel(m, n, k, dtype):
    x, w, scale = operands(m, n, k, dtype)
    c, programs = compiled(torch._weight_int8pack_mm)
    torch.testing.assert_close(c(x, w, scale), reference_op(x, w, scale), **tol(dtype))
    assert len(int8_template_launches(programs)) == 1 and not int8_externs(programs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("epilogue", ["relu", "residual"])
def test_fused_epilogue(epilogue, dtype):
    """relu, or a residual add, after the op: one kernel, the op's result never stored."""
    def fn(x, w, scale, r):
        y = torch._weight_int8pack_mm(x, w, scale)
        return torch.relu(y) if epilogue == "relu" else y + r

    x, w, scale = operands(7, 37, 96, dtype)
    r = torch.randn(7, 37, dtype=dtype)
    c, programs = compiled(fn)
    torch.testing.assert_close(c(x, w, scale, r), fn(x, w, scale, r), **tol(dtype))
    assert len(lines(programs, CallKernel)) == 1 and len(int8_template_launches(programs)) == 1
    assert not int8_externs(programs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dynamic_batch(dtype):
    fn = lambda x, w, s: torch.relu(torch._weight_int8pack_mm(x, w, s))  # noqa: E731
    c, programs = compiled(fn, dynamic=True)
    for m in (7, 32, 5):
        x, w, scale = operands(m, 45, 160, dtype)
        torch.testing.assert_close(c(x, w, scale), fn(x, w, scale), **tol(dtype))
    assert len(programs) == 1, "one program for every batch (dynamo specializes a batch of 1)"
    launch = int8_template_launches(programs)[0]
    assert launch.kernel.launch.size_symbols, "the batch is a size argument of the kernel"


PATTERNS = {
    "linear": lambda x, w, s: F.linear(x, w.to(x.dtype)) * s,
    "matmul_t": lambda x, w, s: (x @ w.to(x.dtype).t()) * s,
    "scale_first": lambda x, w, s: s * F.linear(x, w.to(x.dtype)),
    "scale_row": lambda x, w, s: F.linear(x, w.to(x.dtype)) * s[None, :],
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 7, 32])
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_pattern_rewritten_to_the_template(pattern, m, dtype):
    fn = PATTERNS[pattern]
    x, w, scale = operands(m, 37, 96, dtype)
    c, programs = compiled(fn)
    torch.testing.assert_close(c(x, w, scale), fn(x, w, scale), **tol(dtype))
    # the program: one template launch reading x, the int8 weight (a graph input) and the scale
    launches = lines(programs, CallKernel)
    assert len(launches) == 1 and int8_template_launches(programs) == launches
    args = [a.dtype for a in launches[0].args if hasattr(a, "dtype")]
    assert args[:3] == [dtype, torch.int8, dtype]
    assert not compute_externs(programs), "no dequantized weight, no mm"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pattern_with_epilogue_and_leading_dims(dtype):
    """x of [B, T, K] (the mm reads a 2-D view) and a residual after the scale."""
    fn = lambda x, w, s, r: F.linear(x, w.to(x.dtype)) * s + r  # noqa: E731
    x, w, scale = operands(5, 40, 64, dtype, lead=(2,))
    r = torch.randn(2, 5, 40, dtype=dtype)
    c, programs = compiled(fn)
    torch.testing.assert_close(c(x, w, scale, r), fn(x, w, scale, r), **tol(dtype))
    assert len(lines(programs, CallKernel)) == 1, "the residual add fused through the view"
    assert len(int8_template_launches(programs)) == 1 and not compute_externs(programs)


class Int8Linear(torch.nn.Module):
    """A weight-only quantized linear layer: int8 weight and per-channel scale as parameters."""

    def __init__(self, w, scale):
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)
        self.scale = torch.nn.Parameter(scale, requires_grad=False)

    def forward(self, x):
        return F.linear(x, self.w.to(x.dtype)) * self.scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pattern_in_a_module_dynamic_batch(dtype):
    """Parameters keep static shapes under dynamic=True: the batch is the one symbol."""
    _, w, scale = operands(1, 24, 128, dtype)
    model = Int8Linear(w, scale)
    c, programs = compiled(model, dynamic=True)
    with torch.no_grad():
        for m in (3, 17, 2):
            x = torch.randn(m, 128, dtype=dtype)
            torch.testing.assert_close(c(x), model(x), **tol(dtype))
    assert len(programs) == 1 and len(int8_template_launches(programs)) == 1
    assert not compute_externs(programs)


@pytest.mark.parametrize("why", ["scale_dtype", "bias", "float_weight", "bad_k_bf16", "templates_off"])
def test_pattern_left_alone(why):
    """Where the op would not compute the same thing (a promoting scale, a bias before
    the scale, a weight that is not int8), where ATen's op is not exact (bf16 with k off
    32: fallback and rival of the template), or with templates off: no rewrite, and the
    numbers are eager's."""
    dtype = torch.bfloat16
    x, w, scale = operands(7, 24, 100 if why == "bad_k_bf16" else 64, dtype)
    fn = PATTERNS["linear"]
    args = (x, w, scale)
    if why == "scale_dtype":
        args = (x, w, scale.float())
    elif why == "bias":
        b = torch.randn(24, dtype=dtype)
        fn = lambda x, w, s: F.linear(x, w.to(x.dtype), b) * s  # noqa: E731
    elif why == "float_weight":
        args = (x, w.to(torch.int16), scale)
    c, programs = compiled(fn, templates="off" if why == "templates_off" else "always")
    torch.testing.assert_close(c(*args), fn(*args), **tol(dtype))
    assert not int8_externs(programs)
    assert not [c for c in lines(programs, TemplateChoice) if c.chosen == "cpp_int8_gemm"]


def test_auto_never_runs_the_inexact_aten_kernel():
    """bf16 with k = 100: ATen's kernel is wrong there, so "auto" neither times nor chooses it."""
    x, w, scale = operands(7, 24, 100, torch.bfloat16)
    c, programs = compiled(torch._weight_int8pack_mm, templates="auto")
    torch.testing.assert_close(c(x, w, scale), reference_op(x, w, scale), **tol(torch.bfloat16))
    (choice,) = lines(programs, TemplateChoice)
    assert choice.chosen == "cpp_int8_gemm" and "not run" in choice.text and not choice.times
    assert not int8_externs(programs)


def test_auto_times_both_and_records_them():
    x, w, scale = operands(8, 256, 512, torch.bfloat16)
    c, programs = compiled(torch._weight_int8pack_mm, templates="auto")
    torch.testing.assert_close(c(x, w, scale), torch._weight_int8pack_mm(x, w, scale), **tol(torch.bfloat16))
    (choice,) = lines(programs, TemplateChoice)
    times = dict(choice.times)
    assert set(times) == {"cpp_int8_gemm", "extern"} and all(t > 0 for t in times.values())
    assert choice.chosen == ("cpp_int8_gemm" if times["cpp_int8_gemm"] < times["extern"] * (1 - TEMPLATE_MIN_GAIN)
                             else "extern")


def test_pattern_product_read_elsewhere_is_left_alone():
    """The unscaled product is also returned: rewriting would compute the product twice."""
    def fn(x, w, s):
        y = F.linear(x, w.to(x.dtype))
        return y * s, y

    x, w, scale = operands(7, 24, 64, torch.float32)
    c, programs = compiled(fn)
    # a float32 sum of 64 products of ~600 in size: where they cancel, two summation orders
    # differ by ulps of the terms, not of the result (1.2e-4 seen against an atol of 1e-4);
    # so: against the float64 sum, within k float32 roundings of the terms' magnitude
    magnitude = x.abs().double() @ w.abs().double().t()
    bound = 64 * torch.finfo(torch.float32).eps * magnitude
    exact = x.double() @ w.double().t()
    got_scaled, got = c(x, w, scale)
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((got_scaled.double() - exact * scale.double()).abs() <= bound * scale.double() + 1e-6).all()
    assert not [c for c in lines(programs, TemplateChoice) if c.chosen == "cpp_int8_gemm"]


@pytest.mark.parametrize("case", ["float16", "reference_target"])
def test_op_stays_the_aten_call_where_no_template_applies(case):
    """float16 activations (the template computes bf16 and fp32) and a target without the
    template: the op is ATen's call, with eager's numbers."""
    dtype = torch.float16 if case == "float16" else torch.float32
    x, w, scale = operands(7, 13, 64, dtype)
    target = "reference" if case == "reference_target" else "cpu"
    programs: list = []
    c = torch.compile(lambda x, w, s: torch._weight_int8pack_mm(x, w, s),
                      backend=fxwrap.Backend(target, {"on_program": programs.append, "templates": "always"}),
                      fullgraph=True)
    torch.testing.assert_close(c(x, w, scale), torch._weight_int8pack_mm(x, w, scale))
    assert len(int8_externs(programs)) == 1
    assert not [c for c in lines(programs, TemplateChoice) if c.chosen == "cpp_int8_gemm"]


def test_int8_rewrite_asks_a_privateuse1_backend_for_its_kernel():
    """The int8 weight-only rewrite's refusal looks the device's dispatch key up through
    ``backend_dispatch_key``: a PrivateUse1 device with a kernel of the op is not refused
    (before issue 38 its key table lacked PrivateUse1: always refused)."""
    from fxwrap.core.patterns import aten_int8_mm_refusal

    name = torch._C._get_privateuse1_backend_name()
    assert aten_int8_mm_refusal(torch.float32, 64, name).startswith(f"torch {torch.__version__} has no {name} kernel")
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_weight_int8pack_mm", lambda x, w, s: x, "PrivateUse1")
    try:
        assert aten_int8_mm_refusal(torch.float32, 64, name) is None
        assert "reads x as contiguous rows" in aten_int8_mm_refusal(torch.float32, 64, name, rows_contiguous=False)
    finally:
        lib._destroy()
