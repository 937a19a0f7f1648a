"""Which templates a compile considers by default (``Template.in_default_mode``): the
CPU's GEMM templates always, the Triton GEMM only under a max-autotune mode or an
explicit ``templates="auto"`` / ``"always"`` (as Inductor does with its GEMM templates)."""
from __future__ import annotations

import pytest

from fxwrap.api import resolve_target
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.plugins.session import CompileOptions


def _names(target: str, **options) -> set[str]:
    session = get_plugin_manager().session(resolve_target(target)).configured(CompileOptions(**options))
    return {t.name for t in session.active_templates}


def test_cpu_templates_are_in_the_default_mode():
    assert {"cpp_gemm"} <= _names("cpu", templates="default")
    assert _names("cpu", templates="default") == _names("cpu", templates="auto")


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_triton_gemm_only_under_max_autotune_or_when_asked(mode):
    pytest.importorskip("triton", reason="the Triton targets need triton")
    assert "triton_gemm" not in _names("triton-interpret", templates="default")
    assert "triton_gemm" in _names("triton-interpret", templates="default", mode=mode)
    assert "triton_gemm" in _names("triton-interpret", templates="auto")
    assert "triton_gemm" in _names("triton-interpret", templates="always")
    session = get_plugin_manager().session(resolve_target("triton-interpret")).configured(CompileOptions(templates="default"))
    assert session.template_mode == "auto"
    assert "triton_gemm" in {t.name for t in session.templates}  # registered, not considered


def test_triton_gemv_is_in_the_default_mode():
    """The one-row GEMV is timed against the ATen call in the default mode too (a few small
    kernels to compile; a decode step's products are where it beats cuBLAS)."""
    pytest.importorskip("triton", reason="the Triton targets need triton")
    assert "triton_gemv" in _names("triton-interpret", templates="default")
    assert "triton_gemv" in _names("triton-interpret", templates="default", mode="max-autotune")


def test_unknown_template_mode_is_refused():
    with pytest.raises(ValueError, match="templates='sometimes' is not one of"):
        CompileOptions(templates="sometimes")
