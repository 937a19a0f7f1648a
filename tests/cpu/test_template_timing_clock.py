"""The clock the template choice times its candidates with on the CPU
(``CpuDevice.time_calls``): at one thread the calling thread's CPU time, so a loaded
machine (other processes holding the cores) does not stretch one candidate's samples
more than another's; at more threads, wall time.  The timing cache keys by the clock."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core.templates import TimingCache
from fxwrap.ir.lines import TemplateChoice
from fxwrap.targets.host.device import CpuDevice


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _busy(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_one_thread_counts_the_work_not_the_wait(threads):
    threads(1)
    device = CpuDevice()
    # waiting for a core (here: sleeping) is no work of the candidate's
    assert device.time_calls(lambda: time.sleep(0.02), 3) < 0.005
    # work is counted
    assert device.time_calls(lambda: _busy(0.01), 2) >= 0.009
    assert device.timing_clock() == "thread cpu"


def test_more_threads_use_wall_time(threads):
    threads(2)
    device = CpuDevice()
    assert device.timing_clock() == "wall"
    assert device.time_calls(lambda: time.sleep(0.01), 2) >= 0.009


def test_timing_cache_keys_by_the_clock(threads, monkeypatch, tmp_path):
    """Times taken with one clock are never read back for another: the same group timed at one
    thread with the wall clock and with the thread's CPU time has two cache entries."""
    threads(1)
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    keys = []
    real_key = TimingCache.key
    monkeypatch.setattr(TimingCache, "key", staticmethod(lambda *parts: keys.append(parts) or real_key(*parts)))
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    x, w, b = torch.randn(32, 48), torch.randn(40, 48), torch.randn(40)
    for clock in ("thread cpu", "wall"):
        monkeypatch.setattr(CpuDevice, "timing_clock", lambda self, clock=clock: clock)
        torch._dynamo.reset()
        programs = []
        c = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "templates": "auto",
                                                             "cache": False}), fullgraph=True)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
        assert [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
    timing = [k for k in keys if k and k[0] == "fxwrap template timing"]
    assert {k[3] for k in timing if isinstance(k[3], str)} == {"thread cpu", "wall"}
    by_clock = {clock: {real_key(*k) for k in timing if k[3] == clock} for clock in ("thread cpu", "wall")}
    assert by_clock["thread cpu"] and not (by_clock["thread cpu"] & by_clock["wall"])
