"""``mode="cudagraphs"`` on a GPU: replays match eager, held outputs are never overwritten,
training works, dynamic sizes get a recording each.  Needs CUDA (run on the device).
The issue-27 rules (static inputs, mutation, partitions): test_graph_capture_cuda.py."""
import pytest
import torch

from fxwrap.runtime.graph_replay import replay_runners

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _runners(programs):
    return [r for p in programs for r in replay_runners(p.runner)]


def _overhead(x, w):
    for _ in range(8):
        x = torch.relu(x @ w) + x.mean()
    return x


def test_replays_match_eager_and_held_outputs_survive():
    programs = []
    fn = torch.compile(_overhead, backend="fxwrap", options={"mode": "cudagraphs", "on_program": programs.append})
    w = torch.randn(64, 64, device="cuda") / 8
    held = []
    for _ in range(6):
        x = torch.randn(64, 64, device="cuda")
        out = fn(x, w)
        torch.testing.assert_close(out, _overhead(x, w), rtol=1e-4, atol=1e-4)
        held.append((out, _overhead(x, w)))
    (runner,) = _runners(programs)
    assert runner.fallback_reason is None and 1 <= runner.count <= runner.max_recordings
    for out, want in held:  # every output kept by the caller still holds its own call's values
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


def test_replay_loop_alternates_between_two_recordings():
    programs = []
    fn = torch.compile(_overhead, backend="fxwrap", options={"mode": "cudagraphs", "on_program": programs.append})
    w = torch.randn(64, 64, device="cuda") / 8
    out = None
    for _ in range(10):
        x = torch.randn(64, 64, device="cuda")
        out = fn(x, w)  # the previous `out` is alive during the call
        torch.testing.assert_close(out, _overhead(x, w), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(programs)
    assert runner.count == 2


def test_training_through_graphs_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
    ref.load_state_dict(model.state_dict())
    programs = []
    fn = torch.compile(model, backend="fxwrap", options={"mode": "cudagraphs", "on_program": programs.append})
    for _ in range(4):
        x = torch.randn(16, 32, device="cuda")
        out, want = fn(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
            p.grad = q.grad = None
    assert sorted(p.kind for p in programs) == ["backward", "forward"]
    assert all(r.fallback_reason is None and r.recordings for r in _runners(programs))


def test_reduce_overhead_mode_means_cudagraphs():
    # torch.compile takes mode or options, not both: mode alone selects CUDA graphs
    fn = torch.compile(lambda x: (x * 2).sin(), backend="fxwrap", mode="reduce-overhead")
    for _ in range(3):
        x = torch.randn(128, device="cuda")
        torch.testing.assert_close(fn(x), (x * 2).sin())


def test_dynamic_programs_record_each_size_and_input_mutation_stays_correct():
    programs = []
    fn = torch.compile(lambda x: x.exp() + 1, backend="fxwrap", dynamic=True,
                       options={"mode": "cudagraphs", "on_program": programs.append})
    for n in (17, 33, 65):
        for _ in range(3):  # warm-up, recording, replay
            x = torch.randn(n, device="cuda")
            torch.testing.assert_close(fn(x), x.exp() + 1)
    (dynamic,) = _runners(programs)
    assert dynamic.fallback_reason is None and dynamic.count == 3

    def bump(x):
        x.add_(1)
        return x * 2

    mut = torch.compile(bump, backend="fxwrap", options={"mode": "cudagraphs", "on_program": programs.append})
    for _ in range(3):
        x = torch.randn(64, device="cuda")
        want = x.clone()
        out = mut(x)
        torch.testing.assert_close(x, want + 1)
        torch.testing.assert_close(out, (want + 1) * 2)
    # the write into x is either aot_autograd's copy after the program (the program may be
    # captured) or a line of the program (then it runs without graphs): right numbers either way


def test_recording_goes_through_the_devices_graph_capture(monkeypatch):
    """The runner records through the cuda device's ``GraphCapture`` (``graph_capture()``),
    not through a call of its own into torch.cuda."""
    from fxwrap.runtime.cuda_capture import CudaGraphCapture

    calls = []
    real = CudaGraphCapture.record
    monkeypatch.setattr(CudaGraphCapture, "record", lambda self, run, inputs: (calls.append(1), real(self, run, inputs))[1])
    programs = []
    torch._dynamo.reset()
    fn = torch.compile(_overhead, backend="fxwrap", options={"mode": "cudagraphs", "on_program": programs.append})
    w = torch.randn(64, 64, device="cuda") / 8
    for _ in range(3):
        x = torch.randn(64, 64, device="cuda")
        torch.testing.assert_close(fn(x, w), _overhead(x, w), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(programs)
    assert runner.count and calls, "no recording, or it did not go through the device's GraphCapture"


def test_autotune_times_on_the_device_interfaces_stream():
    """``autotune.choose`` synchronizes and records its events through the device interface."""
    from fxwrap.targets.cuda_triton import autotune
    from fxwrap.targets.cuda_triton.device import CudaDevice
    from shared_helpers import buf, kernel

    class Recording(CudaDevice):
        def __init__(self):
            self.calls = []

        def synchronize(self, device=None):
            self.calls.append("synchronize")
            super().synchronize(device)

        def current_stream(self, device=None):
            self.calls.append("current_stream")
            return super().current_stream(device)

    device = torch.device("cuda", 0)
    k = kernel("k", [buf("a", (1024,), device=device)], [buf("b", (1024,), device=device)], [], ranges=(1024,))
    slow = lambda a, b: [b.copy_(a.exp()) for _ in range(20)]  # noqa: E731
    fast = lambda a, b: b.copy_(a)  # noqa: E731
    interface = Recording()
    slow_cfg, fast_cfg = (("variant", "slow"),), (("variant", "fast"),)
    best, timings = autotune.choose(lambda cfg: fast if cfg == fast_cfg else slow, k, {}, [slow_cfg, fast_cfg],
                                    device, interface)
    assert best == fast_cfg and len(timings) == 2
    assert interface.calls.count("synchronize") == 2 and interface.calls.count("current_stream") == 2
