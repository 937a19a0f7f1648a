"""Inductor's ``torch.compile`` mode names on fxwrap: each compiles and gives eager's numbers;
``max-autotune`` hands the Triton emitter a wider candidate set per kernel (recorded in each
kernel's ``launch.configs``); an unknown mode names the valid ones.  The GPU side (CUDA
graphs, configs timed) is tests/cuda/test_cuda_modes.py."""
import importlib.util

import pytest
import torch

import fxwrap
from fxwrap.runtime.kernel import Kernel

MODES = ["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
TRITON_MISSING = next((f"{m} is not installed; pip install -e '.[triton]'" for m in ("triton", "numpy")
                       if importlib.util.find_spec(m) is None), None)
INTERPRET = pytest.param("triton-interpret", marks=pytest.mark.skipif(
    TRITON_MISSING is not None or torch.cuda.is_available(), reason=str(TRITON_MISSING or "a GPU: tests/cuda")))


def model(x, w):
    return torch.softmax(x @ w, -1).sin() * 2 + x.sum(0)


def kernels_of(programs):
    return [n.target for p in programs for n in p.graph_module.graph.nodes if isinstance(n.target, Kernel)]


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_mode_names_compile(mode):
    """``torch.compile(mode=...)`` (no options beside it: torch takes one or the other), default target."""
    fn = torch.compile(model, backend="fxwrap", mode=mode)
    for _ in range(2):
        x, w = torch.randn(16, 8), torch.randn(8, 8)
        torch.testing.assert_close(fn(x, w), model(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["cpu", INTERPRET])
@pytest.mark.parametrize("mode", MODES)
def test_mode_option_on_target(target, mode):
    programs = []
    fn = torch.compile(model, backend="fxwrap", options={"mode": mode, "target": target,
                                                         "on_program": programs.append})
    x, w = torch.randn(16, 8), torch.randn(8, 8)
    torch.testing.assert_close(fn(x, w), model(x, w), rtol=1e-5, atol=1e-5)
    assert kernels_of(programs) and all(p.target.name == target for p in programs)


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
@pytest.mark.skipif(TRITON_MISSING is not None, reason=str(TRITON_MISSING))
def test_max_autotune_widens_the_triton_candidates(mode):
    """Every kernel gets more candidate configs than under the default mode, the default's
    first config still first (under the interpreter the first one runs; on a GPU all are timed)."""
    def candidates(mode):
        torch._dynamo.reset()
        programs = []
        fn = torch.compile(model, backend="fxwrap", options={"mode": mode, "target": "triton-interpret",
                                                             "on_program": programs.append})
        x, w = torch.randn(16, 8), torch.randn(8, 8)
        torch.testing.assert_close(fn(x, w), model(x, w), rtol=1e-5, atol=1e-5)
        return [(k.name, k.launch.configs) for k in kernels_of(programs)]

    default, wide = candidates("default"), candidates(mode)
    assert [n for n, _ in default] == [n for n, _ in wide] and default
    for (name, few), (_, many) in zip(default, wide):
        assert len(many) > len(few), (name, few, many)
        assert many[0] == few[0] and len(set(many)) == len(many)


def test_cpu_emitter_has_nothing_to_widen():
    """The C++ emitter has no tunable choices: max-autotune renders the same kernels."""
    def sources(mode):
        torch._dynamo.reset()
        programs = []
        fn = torch.compile(model, backend="fxwrap", options={"mode": mode, "target": "cpu",
                                                             "on_program": programs.append})
        fn(torch.randn(16, 8), torch.randn(8, 8))
        return [k.source for k in kernels_of(programs)]
    assert sources("max-autotune") == sources("default")


def test_unknown_mode_lists_the_valid_ones():
    fn = torch.compile(model, backend="fxwrap", mode="max-autotun")
    with pytest.raises(Exception, match="fxwrap has no mode 'max-autotun'; valid modes: 'default', "
                                        "'cudagraphs', 'reduce-overhead', 'max-autotune', "
                                        "'max-autotune-no-cudagraphs'"):
        fn(torch.randn(16, 8), torch.randn(8, 8))
    with pytest.raises(ValueError, match="valid modes: .*'max-autotune-no-cudagraphs'"):
        fxwrap.Backend(options={"mode": "fast"})
