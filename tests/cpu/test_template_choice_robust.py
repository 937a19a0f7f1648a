"""The template choice on a noisy machine (``fxwrap.wrapper_ir.template_choice``): a template
replaces the ATen call only when a second series of rounds confirms it; a group's times are
measured and cached together, keyed by the device's model and features and torch's version;
``FXWRAP_RETUNE=1`` measures again and replaces both the timing and the program cache entries;
the ``autotune`` log says what was chosen and by how much.  The timings are injected (a stand-in
``_measure``): what is checked is the choice made from them, and the numbers of the program
against eager."""
from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core.templates import TimingCache
from fxwrap.ir.lines import TemplateChoice
from fxwrap.targets.host.device import CpuDevice
from fxwrap.wrapper_ir import template_choice


def _linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def _args():
    g = torch.Generator().manual_seed(0)
    return torch.randn(24, 40, generator=g), torch.randn(56, 40, generator=g), torch.randn(56, generator=g)


class Series:
    """A stand-in ``_measure``: the n-th series of any group returns ``series[n]`` (the last
    one again after that), and counts the series it was asked for."""

    def __init__(self, *series):
        self.series, self.calls = series, 0

    def __call__(self, runs, load, hints, target):
        times = self.series[min(self.calls, len(self.series) - 1)]
        self.calls += 1
        assert set(runs) == set(times)
        return dict(times)


def _choices(program):
    return [ln for ln in program.lines if isinstance(ln, TemplateChoice)]


def _lower(options=None):
    args = _args()
    program = fxwrap.lower(_linear_gelu, *args, target="cpu", options={"templates": "auto", **(options or {})})
    torch.testing.assert_close(program.run(*args), _linear_gelu(*args), atol=1e-4, rtol=1e-4)
    return program


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("FXWRAP_RETUNE", raising=False)
    monkeypatch.delenv("FXWRAP_TEMPLATE_CACHE", raising=False)
    return tmp_path


def test_a_slow_stretch_of_the_extern_does_not_choose_the_template(monkeypatch, cache_dir):
    """The first series catches the ATen call in a slow stretch (the CPU's addmm + epilogue
    measured 0.259 ms in one process, 0.211 in eight others; the template 0.240 in all): the
    second series confirms nothing, the extern stays, each time the fastest of both series."""
    fake = Series({"cpp_gemm": 0.240, "extern": 0.259}, {"cpp_gemm": 0.242, "extern": 0.211})
    monkeypatch.setattr(template_choice, "_measure", fake)
    (choice,) = _choices(_lower({"cache": False}))
    assert fake.calls == 2
    assert choice.chosen == "extern"
    assert dict(choice.times) == {"cpp_gemm": 0.240, "extern": 0.211}


def test_a_confirmed_win_chooses_the_template(monkeypatch, cache_dir):
    fake = Series({"cpp_gemm": 0.20, "extern": 0.26}, {"cpp_gemm": 0.21, "extern": 0.25})
    monkeypatch.setattr(template_choice, "_measure", fake)
    program = _lower({"cache": False})
    (choice,) = _choices(program)
    assert fake.calls == 2 and choice.chosen == "cpp_gemm"
    assert dict(choice.times) == {"cpp_gemm": 0.20, "extern": 0.25}
    assert not any("aten.addmm" in str(ln) for ln in program.lines if type(ln).__name__ == "CallExtern")


def test_the_extern_winning_the_first_series_is_not_timed_again(monkeypatch, cache_dir):
    fake = Series({"cpp_gemm": 0.24, "extern": 0.21})
    monkeypatch.setattr(template_choice, "_measure", fake)
    (choice,) = _choices(_lower({"cache": False}))
    assert fake.calls == 1 and choice.chosen == "extern"


def test_the_group_is_cached_together_and_retune_measures_again(monkeypatch, cache_dir):
    """One timing-cache file holds the whole group (times of one session, never mixed with
    another's); a second compile reads it; FXWRAP_RETUNE=1 measures again and replaces it."""
    fake = Series({"cpp_gemm": 0.30, "extern": 0.20})
    monkeypatch.setattr(template_choice, "_measure", fake)
    assert _choices(_lower({"cache": False}))[0].chosen == "extern"
    files = list((cache_dir / "templates").glob("*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text()) == {"times": {"cpp_gemm": 0.30, "extern": 0.20}}
    assert _choices(_lower({"cache": False}))[0].chosen == "extern"
    assert fake.calls == 1  # read back, not measured

    monkeypatch.setenv("FXWRAP_RETUNE", "1")
    fake.series = ({"cpp_gemm": 0.10, "extern": 0.20},)
    (choice,) = _choices(_lower({"cache": False}))
    assert fake.calls == 3 and choice.chosen == "cpp_gemm"  # measured, and the win confirmed
    assert json.loads(files[0].read_text()) == {"times": {"cpp_gemm": 0.10, "extern": 0.20}}
    monkeypatch.delenv("FXWRAP_RETUNE")
    assert _choices(_lower({"cache": False}))[0].chosen == "cpp_gemm"
    assert fake.calls == 3


def test_retune_replaces_the_cached_program(monkeypatch, cache_dir):
    """A cached program holds its choice: FXWRAP_RETUNE=1 does not load it but compiles again and
    stores the new program under the same key, which later compiles (without it) load.  (The
    timing cache is off here: every compile the program cache does not serve measures.)"""
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")  # the test session turns it off
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    fake = Series({"cpp_gemm": 0.30, "extern": 0.20})
    monkeypatch.setattr(template_choice, "_measure", fake)
    assert _choices(_lower())[0].chosen == "extern" and fake.calls == 1
    assert _choices(_lower())[0].chosen == "extern" and fake.calls == 1  # the program cache's

    monkeypatch.setenv("FXWRAP_RETUNE", "1")
    fake.series = ({"cpp_gemm": 0.10, "extern": 0.20},)
    assert _choices(_lower())[0].chosen == "cpp_gemm" and fake.calls == 3  # measured, the win confirmed
    monkeypatch.delenv("FXWRAP_RETUNE")
    assert _choices(_lower())[0].chosen == "cpp_gemm" and fake.calls == 3  # the program cache's, replaced


def test_times_are_keyed_by_the_cpu_and_torch(monkeypatch, cache_dir):
    """Another CPU (model, ISA flags) or another torch (its ATen kernels are the extern) times
    again: a cache directory shared between machines or upgrades never hands one's choice on."""
    identity = CpuDevice().timing_identity()
    assert "model name" in identity or "CPU part" in identity or "flags" in identity or "Features" in identity
    fake = Series({"cpp_gemm": 0.30, "extern": 0.20})
    monkeypatch.setattr(template_choice, "_measure", fake)
    _lower({"cache": False})
    monkeypatch.setattr(CpuDevice, "timing_identity", lambda self: "another CPU")
    _lower({"cache": False})
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    _lower({"cache": False})
    assert fake.calls == 3
    assert len(list((cache_dir / "templates").glob("*.json"))) == 3


def test_the_log_says_what_was_chosen_and_by_how_much(monkeypatch, cache_dir, caplog):
    monkeypatch.setattr(template_choice, "_measure", Series({"cpp_gemm": 0.242, "extern": 0.211}))
    with caplog.at_level(logging.INFO, logger="fxwrap.autotune"):
        _lower({"cache": False})
    (line,) = [r.getMessage() for r in caplog.records if "extern aten.addmm" in r.getMessage()]
    assert "(chosen): the fastest template takes 1.147x the extern's time (a template needs < 0.970x)" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fxwrap.autotune"):
        _lower({"cache": False})
    assert any("read from the timing cache" in r.getMessage() and "FXWRAP_RETUNE=1" in r.getMessage()
               for r in caplog.records)


def test_timing_cache_reads_only_whole_groups(tmp_path):
    cache = TimingCache(tmp_path)
    cache.put("k", {"extern": 0.2, "cpp_gemm": 0.3})
    assert cache.get("k") == {"cpp_gemm": 0.3, "extern": 0.2}
    (tmp_path / "old.json").write_text(json.dumps({"ms": 0.2}))  # an entry of the per-candidate format
    assert cache.get("old") is None and cache.get("missing") is None
