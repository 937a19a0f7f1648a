"""GEMM templates on the C++ target (fxwrap.core.templates, targets/cpu_cpp/gemm.py):
epilogues fused into the template kernel, eager's numbers for every layout and odd
size, dynamic shapes, the autotuned choice and its record, "off" as before.  Every
test compares with eager on fresh random inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.wrapper_ir import template_choice
from fxwrap.ir.lines import Allocate, CallExtern, CallKernel, TemplateChoice

aten = torch.ops.aten
GEMMS = {aten.mm.out, aten.addmm.out, aten.bmm.out, aten.mm.default, aten.addmm.default, aten.bmm.default}


def compiled(fn, templates="always", dynamic=False):
    torch._dynamo.reset()  # one code object per test, many parametrizations: compile each afresh
    programs: list = []
    c = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "templates": templates}),
                      dynamic=dynamic, fullgraph=True)
    return c, programs


def launches(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, CallKernel)]


def gemm_externs(programs):
    return [ln for p in programs for ln in p.lines if isinstance(ln, CallExtern) and ln.op in GEMMS]


def template_kernels(programs):
    return [ln for ln in launches(programs) if "_template_" in ln.kernel.name]


def tol(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)


EPILOGUES = {
    "bias": lambda x, w, b, r: F.linear(x, w, b),
    "bias_relu": lambda x, w, b, r: torch.relu(F.linear(x, w, b)),
    "bias_gelu": lambda x, w, b, r: F.gelu(F.linear(x, w, b)),
    "residual": lambda x, w, b, r: F.linear(x, w, b) + r,
    "silu_residual_nobias": lambda x, w, b, r: F.silu(F.linear(x, w)) * 0.5 + r,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
def test_epilogue_fused_into_one_template_kernel(epilogue, dtype):
    fn = EPILOGUES[epilogue]
    c, programs = compiled(fn)
    x, w, b = torch.randn(37, 64, dtype=dtype), torch.randn(80, 64, dtype=dtype), torch.randn(80, dtype=dtype)
    r = torch.randn(37, 80, dtype=dtype)
    torch.testing.assert_close(c(x, w, b, r), fn(x, w, b, r), **tol(dtype))
    assert len(launches(programs)) == 1 and len(template_kernels(programs)) == 1
    assert not gemm_externs(programs)


def test_bf16_cast_epilogue():
    """A float32 product cast to bfloat16 in the epilogue: one kernel, one rounding."""
    fn = lambda x, w: torch.relu(x @ w).to(torch.bfloat16)  # noqa: E731
    c, programs = compiled(fn)
    x, w = torch.randn(33, 70), torch.randn(70, 45)
    out = c(x, w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, fn(x, w), atol=1e-2, rtol=1e-2)
    assert len(launches(programs)) == 1 and not gemm_externs(programs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt", "sliced"])
def test_layouts_match_eager(layout, dtype):
    """Transposed and non-contiguous operands are read through their strides."""
    m, k, n = 45, 67, 53
    a = torch.randn(m, k, dtype=dtype) if layout[0] == "n" else torch.randn(k, m, dtype=dtype).t()
    b = torch.randn(k, n, dtype=dtype) if layout[-1] == "n" else torch.randn(n, k, dtype=dtype).t()
    if layout == "sliced":
        a, b = torch.randn(m, 2 * k, dtype=dtype)[:, ::2], torch.randn(k + 3, n + 5, dtype=dtype)[2:-1, 3:-2]
    fn = lambda a, b: torch.mm(a, b) * 2  # noqa: E731
    c, programs = compiled(fn)
    torch.testing.assert_close(c(a, b), fn(a, b), **tol(dtype))
    assert len(template_kernels(programs)) == 1


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 300, 7), (31, 1, 33), (17, 257, 290), (129, 40, 1)])
def test_odd_sizes(m, k, n):
    fn = lambda x, w, b: torch.tanh(F.linear(x, w, b))  # noqa: E731
    c, programs = compiled(fn)
    x, w, b = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
    assert len(template_kernels(programs)) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_with_epilogue(dtype):
    fn = lambda a, b, r: torch.bmm(a, b) + r  # noqa: E731
    c, programs = compiled(fn)
    a, b, r = torch.randn(3, 19, 24, dtype=dtype), torch.randn(3, 24, 35, dtype=dtype), torch.randn(3, 19, 35,
                                                                                                      dtype=dtype)
    torch.testing.assert_close(c(a, b, r), fn(a, b, r), **tol(dtype))
    assert len(launches(programs)) == 1 and not gemm_externs(programs)


def test_dynamic_shapes():
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    c, programs = compiled(fn, dynamic=True)
    w, b = torch.randn(48, 40), torch.randn(48)
    for n in (9, 23, 64):
        x = torch.randn(n, 40)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
    assert template_kernels(programs)


def test_auto_records_the_choice_with_times():
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    c, programs = compiled(fn, templates="auto")
    x, w, b = torch.randn(64, 96), torch.randn(128, 96), torch.randn(128)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
    choices = [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
    assert len(choices) == 1
    times = dict(choices[0].times)
    assert set(times) == {"cpp_gemm", "extern"} and all(t > 0 for t in times.values())
    faster = "cpp_gemm" if times["cpp_gemm"] < times["extern"] * (1 - template_choice.TEMPLATE_MIN_GAIN) \
        else "extern"
    assert choices[0].chosen == faster  # the extern wins ties and small wins
    assert ("template cpp_gemm" in programs[0].code()) and "ms" in programs[0].code()
    # the FX node of the chosen launch carries it
    noted = [n for n in programs[0].graph_module.graph.nodes if "template cpp_gemm" in str(n.meta.get("comment", ""))]
    assert len(noted) == 1 and noted[0].op == "call_function"
    if faster == "extern":
        assert gemm_externs(programs)
    else:
        assert template_kernels(programs) and not gemm_externs(programs)


@pytest.mark.parametrize("template_ms, chosen", [(0.99, "extern"), (1.0, "extern"), (0.95, "cpp_gemm")])
def test_template_kept_only_when_faster_by_the_margin(monkeypatch, template_ms, chosen):
    """A template within ``TEMPLATE_MIN_GAIN`` of the extern's time (timing noise) is not
    chosen: the extern runs, with the epilogue as its own kernel."""
    monkeypatch.setattr(template_choice, "time_candidates",
                        lambda builder, emitter, candidates, extern: {"cpp_gemm": template_ms, "extern": 1.0})
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    c, programs = compiled(fn, templates="auto")
    x, w, b = torch.randn(24, 40), torch.randn(56, 40), torch.randn(56)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
    (choice,) = [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
    assert choice.chosen == chosen
    assert bool(template_kernels(programs)) == (chosen == "cpp_gemm")
    assert bool(gemm_externs(programs)) == (chosen == "extern")


def test_off_is_as_before():
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    c, programs = compiled(fn, templates="off")
    x, w, b = torch.randn(16, 24), torch.randn(32, 24), torch.randn(32)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b))
    assert len(gemm_externs(programs)) == 1 and not template_kernels(programs)
    assert not any(isinstance(ln, TemplateChoice) for p in programs for ln in p.lines)


def test_result_read_elsewhere_is_stored():
    """The product is also returned: the template stores it besides the epilogue."""
    def fn(x, w):
        y = x @ w
        return y, torch.sigmoid(y)

    c, programs = compiled(fn)
    x, w = torch.randn(20, 30), torch.randn(30, 40)
    got, want = c(x, w), fn(x, w)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert len(launches(programs)) == 1


def test_bad_option_names_the_choices():
    with pytest.raises(ValueError, match="templates='sometimes'.*'auto'"):
        fxwrap.Backend("cpu", {"templates": "sometimes"})


# the template conformance kit (fxwrap.testing.templates), on the built-in template
from fxwrap.testing.templates import TemplateConformance  # noqa: E402


class TestCppGemmConformance(TemplateConformance):
    target = "cpu"
    template = "cpp_gemm"
    dtypes = (torch.float32, torch.bfloat16)
    ops = ("mm", "addmm", "bmm")
    shares_with = ("cpp_gemv",)  # listed first: "always" gives it the few-row x @ w.T products


@pytest.mark.parametrize("templates", ["always", "auto"])
def test_3d_linear_epilogue_fused_through_the_reshape(templates):
    """``linear`` of a (B, T, C) activation is ``view -> addmm -> view``: the epilogue over
    (B, T, N) joins the template over (B*T, N) (scheduler._reshaped); without an epilogue
    the extern candidate views the product, as without templates (no copy kernel)."""
    gelu = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    plain = lambda x, w, b: F.linear(x, w, b)  # noqa: E731
    x, w, b = torch.randn(3, 20, 24), torch.randn(40, 24), torch.randn(40)
    for fn in (gelu, plain):
        c, programs = compiled(fn, templates=templates)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
        (choice,) = [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
        if choice.chosen == "cpp_gemm":
            assert len(launches(programs)) == 1 and not gemm_externs(programs)
        elif fn is plain:
            assert not launches(programs) and len(gemm_externs(programs)) == 1


def test_operand_made_by_a_kernel_is_stored_for_the_template():
    """The template reads its operands from memory: a pointwise value feeding the product
    (and read by nothing else) is stored by its kernel, not dropped (scheduler.template_reads)."""
    fn = lambda a, w: torch.mm(torch.relu(a) * 3, w) + 1  # noqa: E731
    c, programs = compiled(fn)
    a, w = torch.randn(18, 26), torch.randn(26, 34)
    torch.testing.assert_close(c(a, w), fn(a, w), atol=1e-4, rtol=1e-4)
    assert len(launches(programs)) == 2 and len(template_kernels(programs)) == 1


def test_cross_entropy_reads_the_template_result_lazily():
    """A language model's head: ``linear`` of (B, T, C) -> logits (B, T, V) -> viewed back
    to (B*T, V) -> cross-entropy.  Through the chain of reshapes the template's result is
    read at an affine index, so the gather reads the log-softmax lazily: no (B*T, V)
    float32 buffer besides the logits themselves, the same as with templates off."""
    def head(x, w, t):
        logits = F.linear(x, w)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), t.view(-1))
    x, w, t = torch.randn(4, 16, 32), torch.randn(300, 32), torch.randint(0, 300, (4, 16))
    peaks, big = {}, {}
    for templates in ("off", "always"):
        c, programs = compiled(head, templates=templates)
        torch.testing.assert_close(c(x, w, t), head(x, w, t), atol=1e-4, rtol=1e-4)
        (program,) = programs
        peaks[templates] = program.peak_bytes
        big[templates] = [ln.buf.name for ln in program.lines
                          if isinstance(ln, Allocate) and tuple(ln.buf.size) == (64, 300)]
    assert template_kernels(programs), "the head is a template kernel under 'always'"
    assert len(big["always"]) == len(big["off"]) == 1, big
    assert peaks["always"] <= peaks["off"], peaks
