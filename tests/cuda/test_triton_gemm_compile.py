"""The Triton GEMM template through torch.compile (cuda on a GPU, triton-interpret without
one): epilogues fused into one template kernel (no extern product) under
``templates="always"``, eager's numbers in float32/bfloat16/float16, odd sizes,
``dynamic=True``, ``bmm``; ``"auto"`` times the template against cuBLAS (the ATen call) +
the epilogue kernel and records the choice; ``"off"`` is the program without templates."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, TemplateChoice
from triton_helpers import DEVICE, GPU, TARGET, TARGET_NAME

aten = torch.ops.aten
GEMMS = {aten.mm.out, aten.addmm.out, aten.bmm.out, aten.mm.default, aten.addmm.default, aten.bmm.default}
f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16


def compiled(fn, templates="always", dynamic=False):
    programs: list = []
    torch._dynamo.reset()
    c = torch.compile(fn, backend=fxwrap.Backend(TARGET, {"on_program": programs.append, "templates": templates}),
                      dynamic=dynamic, fullgraph=True)
    return c, programs


def launches(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, CallKernel)]


def gemm_externs(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, CallExtern) and ln.op in GEMMS]


def template_kernels(programs):
    return [ln for ln in launches(programs) if "# plan: template triton_gemm" in ln.kernel.source]


def choices(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]


def tol(dtype, k=64):
    if dtype == f32:  # eager may use TF32 on the GPU only where allowed: the template follows the flag
        return dict(atol=1e-4 * max(1.0, k ** 0.5), rtol=1e-4)
    return dict(atol=3e-2, rtol=3e-2) if dtype == bf16 else dict(atol=4e-3, rtol=4e-3)


def rand(*shape, dtype=f32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


EPILOGUES = {
    "bias": lambda x, w, b, r: F.linear(x, w, b),
    "bias_relu": lambda x, w, b, r: torch.relu(F.linear(x, w, b)),
    "bias_gelu_tanh": lambda x, w, b, r: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "residual": lambda x, w, b, r: F.linear(x, w, b) + r,
    "silu_scale_residual_nobias": lambda x, w, b, r: F.silu(F.linear(x, w)) * 0.5 + r,
    "cast_to_float": lambda x, w, b, r: F.linear(x, w, b).float().sigmoid(),
}


@pytest.mark.parametrize("dtype", [f32, bf16, f16])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_epilogue_fused_into_one_template_kernel(epilogue, dtype):
    fn = EPILOGUES[epilogue]
    c, programs = compiled(fn)
    x, w, b, r = rand(37, 48, dtype=dtype), rand(40, 48, dtype=dtype), rand(40, dtype=dtype), rand(37, 40, dtype=dtype)
    torch.testing.assert_close(c(x, w, b, r), fn(x, w, b, r), **tol(dtype, 48))
    assert len(launches(programs)) == 1 and len(template_kernels(programs)) == 1
    assert not gemm_externs(programs)
    assert [ch.chosen for ch in choices(programs)] == ["triton_gemm"]


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_odd_sizes_and_layouts(dtype):
    def fn(a, b, c):
        return torch.tanh(a @ b) + c
    c_, programs = compiled(fn)
    for m, k, n in [(1, 17, 3), (33, 5, 65), (17, 100, 31)]:
        a = rand(k, m, dtype=dtype).t()          # transposed
        b = rand(k, 2 * n, dtype=dtype)[:, ::2]   # every other column
        c = rand(m, n, dtype=dtype)
        torch.testing.assert_close(c_(a, b, c), fn(a, b, c), **tol(dtype, k))
    assert template_kernels(programs) and not gemm_externs(programs)


def test_bmm_with_scale_and_softmax_input():
    def fn(q, k):
        return (q @ k.transpose(-1, -2)) * 0.125 + 1.0
    c, programs = compiled(fn)
    q, k = rand(3, 20, 16), rand(3, 24, 16)
    torch.testing.assert_close(c(q, k), fn(q, k), **tol(f32, 16))
    assert len(template_kernels(programs)) == 1 and not gemm_externs(programs)


def test_dynamic_batch():
    def fn(x, w, b):
        return F.gelu(F.linear(x, w, b))
    c, programs = compiled(fn, dynamic=True)
    w, b = rand(24, 32), rand(24)
    for rows in (5, 19, 40):
        x = rand(rows, 32)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), **tol(f32, 32))
    kernels = template_kernels(programs)
    assert kernels and all(k.kernel.signature[-1].role == "size" for k in kernels)
    assert not gemm_externs(programs)


def test_model_block_matches_eager():
    from fxwrap.testing.models import MODEL_CASES

    case = MODEL_CASES["transformer_block"]
    torch.manual_seed(0)
    model = case.build().to(DEVICE).eval()
    x = case.batch().to(DEVICE)
    c, programs = compiled(model)
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), atol=2e-4, rtol=2e-4)
    assert len(template_kernels(programs)) >= 4 and not gemm_externs(programs)


def test_off_keeps_the_extern():
    fn = EPILOGUES["bias_relu"]
    c, programs = compiled(fn, templates="off")
    x, w, b = rand(16, 32), rand(24, 32), rand(24)
    torch.testing.assert_close(c(x, w, b, None), fn(x, w, b, None), **tol(f32, 32))
    assert gemm_externs(programs) and not template_kernels(programs) and not choices(programs)


def test_auto_times_both_candidates_and_records_the_choice(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    fn = EPILOGUES["bias_gelu_tanh"]
    shape = (256, 512, 384) if GPU else (32, 32, 48)   # (M, K, N)
    m, k, n = shape
    dtype = bf16 if GPU else f32
    c, programs = compiled(fn, templates="auto")
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype), rand(n, dtype=dtype)
    torch.testing.assert_close(c(x, w, b, None), fn(x, w, b, None), **tol(dtype, k))
    [choice] = choices(programs)
    times = dict(choice.times)
    assert set(times) == {"extern", "triton_gemm"} and all(t > 0 for t in times.values())
    fastest = min(times, key=lambda name: (times[name], name != "extern"))
    assert choice.chosen == fastest
    assert "ms" in choice.text and "(chosen)" in choice.text
    if choice.chosen == "triton_gemm":
        assert len(template_kernels(programs)) == 1 and not gemm_externs(programs)
    else:
        assert gemm_externs(programs) and not template_kernels(programs)
    if GPU:  # the template's own tilings were timed too, on the GPU
        [launch] = [ln for ln in launches(programs)] if choice.chosen == "triton_gemm" else [None]
        if launch is not None:
            assert launch.kernel.launch.autotuned


from fxwrap.testing.templates import TemplateConformance  # noqa: E402


class TestTritonGemmConformance(TemplateConformance):
    """The kit on the target's own tensors: CUDA tensors on a GPU, else the interpreter's CPU ones."""
    target = TARGET_NAME
    template = "triton_gemm"
    shares_with = ("triton_gemv",)  # listed first: "always" gives it the one-row products
    dtypes = (f32, bf16)
    ops = ("mm", "addmm", "bmm")


def test_3d_linear_epilogue_fused():
    """A linear over (batch, seq, d): the product's epilogue joins through the reshape."""
    def fn(x, w, b, r):
        return F.gelu(F.linear(x, w, b)) + r
    c, programs = compiled(fn)
    x, w, b, r = rand(2, 9, 32), rand(24, 32), rand(24), rand(2, 9, 24)
    torch.testing.assert_close(c(x, w, b, r), fn(x, w, b, r), **tol(f32, 32))
    assert len(template_kernels(programs)) == 1 and not gemm_externs(programs)
