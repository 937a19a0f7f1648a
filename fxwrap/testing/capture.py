"""The conformance kit's graph-capture checks, for a target whose device declares
``graph_capture()`` (``fxwrap.runtime.graph_replay``).

Each check compiles a small program with ``mode="reduce-overhead"`` for the target, runs it
a few times (warm-up, recording, replays) and compares with eager PyTorch:

* ``replay_equals_plain``: replays give eager's numbers, and replays did happen;
* ``static_not_copied``: parameters and buffers are the recording's own inputs (the same
  data pointers), never copies;
* ``static_write_visible``: a KV-cache write (``index_copy_`` into a buffer) lands in the
  module's buffer at every replay;
* ``other_write_copied_back``: a write into a plain input (``x.mul_(2)``) reaches the
  caller's tensor;
* ``new_recording_on_storage_change``: a parameter given new storage makes a new recording,
  and the numbers follow the new values (never a stale read).

A failure names the check, the target and what the device's ``GraphCapture`` got wrong.
"""
from __future__ import annotations

import copy

import torch

import fxwrap
from fxwrap.runtime.graph_replay import replay_runners


class CacheStep(torch.nn.Module):
    """``x @ weight`` written into row ``pos`` of a buffer, then read back whole."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8) / 3)
        self.register_buffer("cache", torch.zeros(4, 8))

    def forward(self, x, pos):
        y = torch.tanh(x @ self.weight)
        self.cache.index_copy_(0, pos, y)
        return self.cache.sum(0) * 2 + y.sum(0)


def _compiled(model, target: str, programs: list):
    return fxwrap.compile(model, target=target, options={"mode": "reduce-overhead", "on_program": programs.append})


def _runner(programs, where: str):
    runners = [r for p in programs for r in replay_runners(p.runner)]
    assert runners, f"{where}: no program runs through graph capture (DeviceInterface.graph_capture())"
    return runners[0]


def _steps(model, reference, compiled, device, steps: int, where: str, start: int = 0):
    with torch.no_grad():
        for i in range(start, start + steps):
            x, pos = torch.randn(1, 8), torch.tensor([i % 4])
            got = compiled(x.to(device), pos.to(device))
            want = reference(x, pos)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, i=i: f"{where}, call {i}: differs from eager: {m}")
            torch.testing.assert_close(model.cache.cpu(), reference.cache, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, i=i: f"{where}, call {i}: the buffer write is not "
                                                          f"in the module's buffer: {m}")
            del got


def _setup(target: str, device: torch.device):
    reference = CacheStep()
    model = copy.deepcopy(reference).to(device)
    programs: list = []
    return reference, model, _compiled(model, target, programs), programs


def check_replay_equals_plain(target: str, device: torch.device) -> None:
    where = f"graph capture on target {target!r} (replay_equals_plain)"
    reference, model, compiled, programs = _setup(target, device)
    _steps(model, reference, compiled, device, 6, where)
    runner = _runner(programs, where)
    assert runner.count >= 1 and runner.replays >= 1, (
        f"{where}: {runner.count} recordings, {runner.replays} replays in 6 calls "
        f"(fallback: {runner.fallback_reason})")


def check_static_not_copied(target: str, device: torch.device) -> None:
    where = f"graph capture on target {target!r} (static_not_copied)"
    reference, model, compiled, programs = _setup(target, device)
    _steps(model, reference, compiled, device, 4, where)
    runner = _runner(programs, where)
    owned = {model.weight.data_ptr(), model.cache.data_ptr()}
    recordings = [r for group in runner.recordings.values() for r in group]
    assert recordings, f"{where}: nothing recorded (fallback: {runner.fallback_reason})"
    for recording in recordings:
        static = {recording.inputs[i].data_ptr() for i in runner.static}
        assert static == owned, (f"{where}: the recording's static inputs are not the module's parameter "
                                 f"and buffer (copies, or AOTAutograd's static_input_indices not read)")


def check_static_write_visible(target: str, device: torch.device) -> None:
    where = f"graph capture on target {target!r} (static_write_visible)"
    reference, model, compiled, programs = _setup(target, device)
    _steps(model, reference, compiled, device, 8, where)  # every row written twice, through replays
    assert _runner(programs, where).replays >= 1, f"{where}: no replay"


def check_other_write_copied_back(target: str, device: torch.device) -> None:
    where = f"graph capture on target {target!r} (other_write_copied_back)"

    def bump(x, y):
        x.mul_(2)
        return x + y

    programs: list = []
    compiled = _compiled(bump, target, programs)
    for i in range(4):
        x, y = torch.randn(6), torch.randn(6)
        xd = x.clone().to(device)  # a copy on the CPU too
        got = compiled(xd, y.to(device))
        torch.testing.assert_close(got.cpu(), x * 2 + y, msg=lambda m, i=i: f"{where}, call {i}: {m}")
        torch.testing.assert_close(xd.cpu(), x * 2, msg=lambda m, i=i: f"{where}, call {i}: the write into "
                                                                       f"the caller's x was not copied back: {m}")
    assert _runner(programs, where).replays >= 1, f"{where}: no replay"


def check_new_recording_on_storage_change(target: str, device: torch.device) -> None:
    where = f"graph capture on target {target!r} (new_recording_on_storage_change)"
    reference, model, compiled, programs = _setup(target, device)
    _steps(model, reference, compiled, device, 3, where)
    runner = _runner(programs, where)
    before = runner.count
    fresh = torch.randn(8, 8) / 3
    reference.weight.data = fresh.clone()
    model.weight.data = fresh.clone().to(device)
    _steps(model, reference, compiled, device, 3, where, start=3)
    assert runner.count == before + 1, (f"{where}: {runner.count - before} new recordings after the weight "
                                        "moved (want 1: its data pointer is part of the key)")


CAPTURE_CHECKS = {
    "replay_equals_plain": check_replay_equals_plain,
    "static_not_copied": check_static_not_copied,
    "static_write_visible": check_static_write_visible,
    "other_write_copied_back": check_other_write_copied_back,
    "new_recording_on_storage_change": check_new_recording_on_storage_change,
}
