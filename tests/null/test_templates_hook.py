"""Templates from a plugin through ``fxwrap_templates`` (fxwrap.core.templates): the
session collects them, ``templates="always"`` runs the plugin's template with the
epilogue fused, "auto" times it against the ATen call, "off" leaves the call; a hook
returning something else is a PluginError naming the plugin.  Needs no compiler: the
``tiny`` target evaluates kernels with torch (tests/null/fxwrap_plugin_fixtures/tiny_template.py)."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.plugins.manager import PluginError, PluginManager, installed_entry_points, use_plugin_manager
from fxwrap.ir.lines import CallExtern, CallKernel, TemplateChoice
from fxwrap.wrapper_ir.template_choice import TEMPLATE_MIN_GAIN

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def manager_with(*modules):
    eps = [importlib.metadata.EntryPoint(m, f"fxwrap_plugin_fixtures.{m}", group="fxwrap") for m in modules]
    return PluginManager([*installed_entry_points(), *eps])


def run(fn, args, templates):
    programs: list = []
    c = torch.compile(fn, backend=fxwrap.Backend("tiny", {"templates": templates, "on_program": programs.append}),
                      fullgraph=True)
    torch._dynamo.reset()
    return c(*args), [ln for p in programs for ln in p.lines]


def test_session_collects_the_plugins_templates():
    manager = manager_with("tiny_template")
    names = [t.name for t in manager.session(manager.target("tiny")).templates]
    assert names == ["torch_gemm"]
    assert "torch_gemm" not in [t.name for t in manager.session(manager.target("cpu")).templates]


@pytest.mark.parametrize("templates", ["always", "auto", "off"])
def test_plugin_template_with_fused_epilogue(templates):
    from fxwrap_plugin_fixtures import tiny_template
    fn = lambda x, w, b, r: torch.relu(F.linear(x, w, b)) + r  # noqa: E731
    args = (torch.randn(12, 20), torch.randn(16, 20), torch.randn(16), torch.randn(12, 16))
    with use_plugin_manager(manager_with("tiny_template")):
        before = len(tiny_template.rendered)
        out, lines = run(fn, args, templates)
    torch.testing.assert_close(out, fn(*args), atol=1e-5, rtol=1e-5)
    choices = [ln for ln in lines if isinstance(ln, TemplateChoice)]
    externs = [ln for ln in lines if isinstance(ln, CallExtern) and ln.op in (aten.addmm.out, aten.addmm.default)]
    if templates == "off":
        assert not choices and externs and len(tiny_template.rendered) == before
        return
    (choice,) = choices
    assert len(tiny_template.rendered) == before + 1
    if templates == "always":
        assert choice.chosen == "torch_gemm" and choice.times == ()
    else:
        times = dict(choice.times)
        assert set(times) == {"torch_gemm", "extern"}
        assert choice.chosen == ("torch_gemm" if times["torch_gemm"] < times["extern"] * (1 - TEMPLATE_MIN_GAIN)
                                 else "extern")
    if choice.chosen == "torch_gemm":
        assert not externs
        assert [ln.kernel.name for ln in lines if isinstance(ln, CallKernel)] == ["fxwrap_template_0"]
    else:
        assert externs


def test_refused_call_stays_an_aten_call():
    fn = lambda a, b: torch.sigmoid(a @ b)  # noqa: E731
    args = (torch.randn(6, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64))
    with use_plugin_manager(manager_with("tiny_template")):
        out, lines = run(fn, args, "always")
    torch.testing.assert_close(out, fn(*args))
    assert not any(isinstance(ln, TemplateChoice) for ln in lines)
    assert any(isinstance(ln, CallExtern) and ln.op == aten.mm.out for ln in lines)


def test_hook_returning_no_template_is_a_plugin_error():
    manager = manager_with("tiny_template", "bad_template")
    with pytest.raises(PluginError, match=r"plugin 'bad_template'.*'my_gemm', not an fxwrap.Template"):
        manager.session(manager.target("tiny"))


def test_int8_weight_only_product_as_a_template_call():
    """``_weight_int8pack_mm(x, w, scales)``: the template computes the product with ``w``
    as its (K, N) operand, the epilogue multiplies by ``scales[n]`` (and runs the relu)."""
    fn = lambda x, w, s: torch.relu(torch.ops.aten._weight_int8pack_mm(x, w, s))  # noqa: E731
    args = (torch.randn(5, 64, dtype=torch.bfloat16), torch.randint(-128, 128, (24, 64), dtype=torch.int8),
            torch.rand(24, dtype=torch.bfloat16))
    with use_plugin_manager(manager_with("tiny_template")):
        out, lines = run(fn, args, "always")
    torch.testing.assert_close(out, fn(*args), atol=1e-2, rtol=1e-2)
    (choice,) = [ln for ln in lines if isinstance(ln, TemplateChoice)]
    assert choice.chosen == "torch_gemm"
    assert not any(isinstance(ln, CallExtern) and ln.op == aten._weight_int8pack_mm.default for ln in lines)
