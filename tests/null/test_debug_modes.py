"""Debug modes (``fxwrap.plugins.debug_modes``): ``check_nan`` raises at the first launch
that writes NaN/Inf and names it; ``print_values`` prints summaries equal to eager's
intermediates; with both off the program is byte for byte what it was."""
import importlib.metadata
import re
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.plugins.manager import PluginManager, installed_entry_points, use_plugin_manager
from fxwrap.runtime.debug import NonFiniteValueError
from fxwrap.wrapper_ir.debug_lines import CheckFinite, PrintValues

TARGETS = ["cpu", "reference", "triton-interpret", "mps_shim"]


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def planted_manager() -> PluginManager:
    planted = importlib.metadata.EntryPoint("nan_log1p", "fxwrap_plugin_fixtures.nan_log1p", group="fxwrap")
    return PluginManager([*installed_entry_points(), planted])


def log1p_mm(x, w):
    return torch.log1p(x.abs()) @ w


def lower(fn, *args, target="cpu", **options):
    torch._dynamo.reset()
    return fxwrap.lower(fn, *args, target=target, options=options)


@pytest.mark.parametrize("target", TARGETS)
def test_check_nan_names_the_planted_kernel(target):
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    with use_plugin_manager(planted_manager()):
        with pytest.raises(NonFiniteValueError) as info:
            lower(log1p_mm, x, w, target=target, check_nan=True)
        # the option off: the planted NaN reaches the result, nothing raises
        program = lower(log1p_mm, x, w, target=target)
    assert torch.isnan(program.run(x, w)).all()
    error = info.value
    message = str(error)
    # the kernel computing log1p, not the mm after it that spreads the NaN
    assert re.search(r"kernel fxwrap_\w+_0 \(target " + re.escape(target) + r"\) wrote 64 NaN", message), message
    assert "log1p" in error.origins and "log1p" in message, message
    assert (error.nan, error.inf, error.buffer) == (64, 0, "buf0")
    assert error.launch.startswith("kernel fxwrap_")


@pytest.mark.parametrize("target", TARGETS)
def test_check_nan_quiet_on_a_clean_program(target):
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    program = lower(log1p_mm, x, w, target=target, check_nan=True)
    checks = [line for line in program.lines if isinstance(line, CheckFinite)]
    assert len(checks) == 2 and checks[0].launch.startswith("kernel ") and "mm" in checks[1].launch
    x2, w2 = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(program.run(x2, w2), log1p_mm(x2, w2))


def test_check_nan_names_an_extern_and_its_aten_op():
    x = torch.rand(6, 5) + 0.5
    program = lower(lambda t: torch.log(t) * 2, x, kernels=False, check_nan=True)  # every op an extern
    bad = torch.rand(6, 5) + 0.5
    bad[2, 3] = -1.0  # log of a negative number: NaN, written by the extern aten.log
    with pytest.raises(NonFiniteValueError, match=r"aten\.log\.\w+ \(target cpu\) wrote 1 NaN into its output"):
        program.run(bad)
    torch.testing.assert_close(program.run(x), torch.log(x) * 2)


def test_check_nan_inf_and_nan_only():
    x = torch.randn(4, 4)
    x[0, 0] = 200.0  # exp overflows to Inf in float32

    def f(t):
        return torch.exp(t) + 1

    with pytest.raises(NonFiniteValueError, match="wrote 1 Inf"):
        lower(f, x, check_nan=True)
    out = lower(f, x, check_nan="nan").run(x)  # Inf allowed (an attention mask's -inf)
    torch.testing.assert_close(out, f(x))


def test_debug_modes_off_leave_the_program_unchanged():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    absent = lower(log1p_mm, x, w)
    off = lower(log1p_mm, x, w, check_nan=False, print_values=False)
    on = lower(log1p_mm, x, w, check_nan=True)
    assert absent.graph_module.code == off.graph_module.code
    assert absent.code() == off.code() and len(absent.lines) == len(off.lines)
    assert on.graph_module.code != absent.graph_module.code  # the comparison can fail
    assert "check_finite" in on.graph_module.code and "check_finite" not in absent.graph_module.code


def test_print_values_of_chosen_buffers_equal_eager(capsys):
    x, w = torch.randn(16, 8), torch.randn(8, 4)

    def exp_mm(t, m):
        return torch.exp(t) @ m

    program = lower(exp_mm, x, w, print_values=["exp"])
    capsys.readouterr()
    x2 = torch.randn(16, 8)
    torch.testing.assert_close(program.run(x2, w), exp_mm(x2, w))
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1, printed  # only exp's buffer, not the mm's
    line = printed[0]
    assert line.startswith("[fxwrap.values] buf0 from kernel fxwrap_pointwise_0") and "exp" in line, line
    stats = {k: float(v) for k, v in re.findall(r"(min|max|mean|norm)=(\S+)", line)}
    expected = torch.exp(x2)
    for key, value in (("min", expected.min()), ("max", expected.max()), ("mean", expected.mean()),
                       ("norm", torch.linalg.vector_norm(expected))):
        assert stats[key] == pytest.approx(float(value), rel=1e-5), (key, line)
    assert "shape=(16, 8) dtype=torch.float32" in line and "nan=0 inf=0" in line

    everything = lower(exp_mm, x, w, print_values=True)
    capsys.readouterr()
    everything.run(x2, w)
    printed = capsys.readouterr().out
    assert "buf0 from kernel" in printed and re.search(r"buf1 from aten\.mm", printed), printed
    mm_min = float(re.search(r"buf1 .*?min=(\S+)", printed).group(1))
    assert mm_min == pytest.approx(float(exp_mm(x2, w).min()), rel=1e-5)
    assert sum(isinstance(line, PrintValues) for line in everything.lines) == 2


def test_debug_lines_come_before_frees_and_block_cuda_graphs():
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    program = lower(log1p_mm, x, w, check_nan=True, print_values=True)
    freed: set[str] = set()
    for line in program.lines:
        if isinstance(line, (CheckFinite, PrintValues)):
            assert not {b.name for b in line.reads()} & freed
        if type(line).__name__ == "Free":
            freed.add(line.buf.name)
    debug_lines = [line for line in program.lines if isinstance(line, (CheckFinite, PrintValues))]
    assert len(debug_lines) == 4 and all("reads" in line.host_readback() for line in debug_lines)
    with pytest.raises(ValueError, match="mode='cudagraphs'"):
        fxwrap.Backend(options={"mode": "cudagraphs", "check_nan": True})
    with pytest.raises(ValueError, match="check_nan='yes' is not one of"):
        fxwrap.Backend(options={"check_nan": "yes"})
