"""Graph capture on the CPU (``mode="reduce-overhead"``): the shared runner's rules through
the CPU device's launch list (``fxwrap.runtime.launch_list``).  Eager's numbers throughout.

The same rules on a GPU: tests/cuda/test_graph_capture_cuda.py; the partition pass on
hand-built lines: tests/null/test_capture_partitions.py.
"""
import pytest
import torch

import fxwrap
from fxwrap.runtime.graph_replay import replay_runners
from fxwrap.runtime.launch_list import LaunchList

OPTIONS = {"mode": "reduce-overhead", "target": "cpu"}


def _compile(fn, dynamic=None, **extra):
    torch._dynamo.reset()
    programs = []
    compiled = torch.compile(fn, backend="fxwrap", dynamic=dynamic,
                             options={**OPTIONS, **extra, "on_program": programs.append})
    return compiled, programs


def _runners(programs, kind=None):
    return [r for p in programs if kind in (None, p.kind) for r in replay_runners(p.runner)]


def _recordings(runner):
    return [r for group in runner.recordings.values() for r in group]


class Decoder(torch.nn.Module):
    """One decoding step with a static KV cache written with ``index_copy_`` (buffers)."""

    def __init__(self, dim=32, slots=16):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))
        self.register_buffer("k_cache", torch.zeros(slots, dim))
        self.register_buffer("v_cache", torch.zeros(slots, dim))

    def forward(self, x, pos):
        self.k_cache.index_copy_(0, pos, self.k(x))
        self.v_cache.index_copy_(0, pos, self.v(x))
        scores = (self.q(x) @ self.k_cache.T) / 8
        return self.o(torch.softmax(scores, -1) @ self.v_cache) + x


def _twins(cls, *args):
    torch.manual_seed(0)
    a = cls(*args)
    b = cls(*args)
    b.load_state_dict(a.state_dict())
    return a, b


def test_kv_cache_writes_under_capture_match_eager_with_parameters_in_place():
    model, ref = _twins(Decoder)
    step, programs = _compile(model)
    with torch.no_grad():
        for i in range(6):
            x, pos = torch.randn(1, 32), torch.tensor([i])
            torch.testing.assert_close(step(x, pos), ref(x, pos), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.k_cache, ref.k_cache)  # the write, in the caller's buffer
            torch.testing.assert_close(model.v_cache, ref.v_cache)
    (runner,) = _runners(programs)
    assert runner.fallback_reason is None and runner.count >= 1 and runner.replays >= 3
    (program,) = programs
    params = {t.data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert len(program.static_inputs) == len(params)  # every parameter and buffer is static
    for recording in _recordings(runner):
        assert isinstance(recording.handle, LaunchList)
        static = {recording.inputs[i].data_ptr() for i in runner.static}
        assert static == params  # used in place: the recording holds the parameters themselves
        copied = [recording.inputs[i] for i in range(len(recording.inputs)) if i not in runner.static]
        assert copied and not {t.data_ptr() for t in copied} & params


def test_a_new_recording_when_a_static_input_moves():
    model, ref = _twins(Decoder)
    step, programs = _compile(model)
    with torch.no_grad():
        for i in range(3):
            x, pos = torch.randn(1, 32), torch.tensor([i])
            torch.testing.assert_close(step(x, pos), ref(x, pos), rtol=1e-5, atol=1e-5)
        (runner,) = _runners(programs)
        before = runner.count
        fresh = torch.randn(32, 32) / 6
        model.q.weight.data = fresh.clone()  # new storage, same Parameter
        ref.q.weight.data = fresh.clone()
        for i in range(3, 6):
            x, pos = torch.randn(1, 32), torch.tensor([i])
            torch.testing.assert_close(step(x, pos), ref(x, pos), rtol=1e-5, atol=1e-5)
    assert runner.count == before + 1


def test_a_write_into_a_plain_input_is_copied_back():
    def bump(x, y):
        x.mul_(3)
        return (x + y).sum(0)

    fn, programs = _compile(bump)
    for _ in range(4):
        x, y = torch.randn(4, 8), torch.randn(4, 8)
        want_x, want = x.clone(), bump(x.clone(), y)
        torch.testing.assert_close(fn(x, y), want)
        torch.testing.assert_close(x, want_x * 3)
    (runner,) = _runners(programs)
    assert runner.written == (0,) and runner.static == () and runner.count >= 1


def test_several_sizes_under_dynamic_shapes_get_a_recording_each():
    fn, programs = _compile(lambda x, w: torch.relu(x @ w).sum(-1), dynamic=True)
    w = torch.randn(16, 16)
    for n in (3, 5, 9):
        for _ in range(3):  # warm-up, recording, replay
            x = torch.randn(n, 16)
            torch.testing.assert_close(fn(x, w), torch.relu(x @ w).sum(-1), rtol=1e-5, atol=1e-5)
    (runner,) = _runners(programs)
    assert runner.count == 3 and len(runner.recordings) == 3


def test_partitions_around_item_give_eagers_numbers():
    def f(x, idx):
        y = x.sin() * 2
        i = idx.item()
        torch._check(i >= 0)
        torch._check(i < y.shape[0])
        return (y[i] + 1).cos() + y.sum(0)

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        fn, programs = _compile(f)
        for i in (0, 1, 2, 1, 0, 2, 2):
            x, idx = torch.randn(8, 4), torch.tensor(i)
            torch.testing.assert_close(fn(x, idx), f(x, idx))
    (program,) = programs
    code = program.code()
    assert "partition(0, capture=False)  # aten._local_scalar_dense.default has a data-dependent output" in code
    assert "partition(1, capture=True)" in code
    (runner,) = _runners(programs)
    assert runner.count == 3  # one recording per value of the scalar


def test_batch_norm_training_running_stats_under_capture():
    model, ref = _twins(lambda: torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                                    torch.nn.ReLU(), torch.nn.Linear(16, 4)))
    fn, programs = _compile(model)
    for _ in range(4):
        x = torch.randn(32, 8)
        out, want = fn(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
            p.grad = q.grad = None
        torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
        torch.testing.assert_close(model[1].running_var, ref[1].running_var)
        assert model[1].num_batches_tracked == ref[1].num_batches_tracked
        del out, want, g  # a held output keeps its recording busy: the next call would record anew
    assert {p.kind for p in programs} == {"forward", "backward"}
    assert all(r.count >= 1 and r.replays >= 2 and r.fallback_reason is None for r in _runners(programs))


def test_held_outputs_are_never_overwritten():
    fn, programs = _compile(lambda x: (x * 2).exp())
    held = []
    for _ in range(5):
        x = torch.randn(16)
        held.append((fn(x), (x * 2).exp()))
    for got, want in held:
        torch.testing.assert_close(got, want)


def test_a_saved_program_replays_after_loading(tmp_path):
    def f(x, w):
        return torch.relu(x @ w) + 1

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    prog = fxwrap.lower(f, x, w, target="cpu", options={"mode": "reduce-overhead"})
    path = tmp_path / "p.fxwrap"
    prog.save(path)
    loaded = fxwrap.load(path)
    assert replay_runners(loaded.runner)
    for _ in range(3):
        x2 = torch.randn(8, 16)
        torch.testing.assert_close(loaded.run(x2, w), f(x2, w))
    assert replay_runners(loaded.runner)[0].count == 1


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs"])
def test_modes_without_graphs_have_no_partitions(mode):
    fn, programs = _compile(lambda x: x.sin(), mode=mode)
    fn(torch.randn(4))
    assert "partition(" not in programs[0].code() and not _runners(programs)


def test_partitions_with_dynamic_sizes():
    def f(x, idx):
        y = torch.softmax(x * 2, -1)
        i = idx.item()
        torch._check(i >= 0)
        torch._check(i < y.shape[0])
        return y[i] * y.sum(0)

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        fn, programs = _compile(f, dynamic=True)
        for n in (5, 7, 9):
            for _ in range(3):
                x, idx = torch.randn(n, 6), torch.tensor(2)
                torch.testing.assert_close(fn(x, idx), f(x, idx))
    runners = _runners(programs)
    assert runners and all(r.fallback_reason is None for r in runners)
    assert sum(r.replays for r in runners) >= 3


def test_launch_list_capture_is_public_and_takes_any_device_type():
    """``fxwrap.LaunchListCapture(device_type)``: a device without a graph API of its own
    records launch lists of its tensors; inputs of another device make the runner run plainly
    (before issue 38 it was reachable only by file path and hard-coded ``"cpu"``)."""
    from fxwrap.runtime.graph_replay import GraphReplayRunner

    def f(x):
        return torch.relu(x) * 3.0

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(8, 5)
    recording, out = fxwrap.LaunchListCapture("cpu").record(gm, [x])
    torch.testing.assert_close(out, f(x))
    recording.replay()
    other = fxwrap.LaunchListCapture("npu")
    assert other.device_type == "npu"
    runner = GraphReplayRunner(gm, other, static=(), written=())
    for _ in range(3):
        torch.testing.assert_close(runner(x), f(x))
    assert runner.fallback_reason == "an input is not a npu tensor"
