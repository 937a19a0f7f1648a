"""Graph capture on a GPU (issue 27): KV-cache writes under CUDA graphs, parameters never
copied (the profiler sees no device-to-device copy of one per replay), a new recording when
a static input's storage changes, partitions around ``.item()`` (eager's numbers, faster
than no graphs), several sizes under ``dynamic=True``, batch-norm training.  Needs CUDA
(the lead's H100); the CPU launch list checks the same rules in tests/cpu/test_graph_capture.py.
"""
import statistics
import time

import pytest
import torch

from fxwrap.runtime.graph_replay import replay_runners

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")

OPTIONS = {"mode": "reduce-overhead", "target": "cuda"}


def _compile(fn, dynamic=None, **extra):
    torch._dynamo.reset()
    programs = []
    compiled = torch.compile(fn, backend="fxwrap", dynamic=dynamic,
                             options={**OPTIONS, **extra, "on_program": programs.append})
    return compiled, programs


def _runners(programs):
    return [r for p in programs for r in replay_runners(p.runner)]


class Decoder(torch.nn.Module):
    """One decoding step with a static KV cache (buffers written with ``index_copy_``) and
    masked SDPA, ``layers`` times."""

    def __init__(self, layers=4, dim=256, heads=4, slots=64):
        super().__init__()
        self.heads, self.slots = heads, slots
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, heads, slots, dim // heads))
            self.register_buffer(f"v{i}", torch.zeros(1, heads, slots, dim // heads))

    def forward(self, x, pos, mask):
        b, t, d = x.shape
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in qkv(x).split(d, -1))
            getattr(self, f"k{i}").index_copy_(2, pos, k)
            getattr(self, f"v{i}").index_copy_(2, pos, v)
            att = torch.nn.functional.scaled_dot_product_attention(q, getattr(self, f"k{i}"),
                                                                   getattr(self, f"v{i}"), attn_mask=mask)
            x = x + out(att.transpose(1, 2).reshape(b, t, d))
        return x


def _twins(make):
    torch.manual_seed(0)
    a = make().cuda()
    b = make().cuda()
    b.load_state_dict(a.state_dict())
    return a, b


def _decode_inputs(step, dim=256, slots=64):
    x = torch.randn(1, 1, dim, device="cuda")
    pos = torch.tensor([step % slots], device="cuda")
    mask = (torch.arange(slots, device="cuda") <= step % slots).view(1, 1, 1, slots)
    return x, pos, mask


def test_kv_cache_writes_under_cuda_graphs_match_eager():
    model, ref = _twins(Decoder)
    step, programs = _compile(model)
    with torch.no_grad():
        for i in range(8):
            inputs = _decode_inputs(i)
            torch.testing.assert_close(step(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)
            for name, buf in model.named_buffers():
                torch.testing.assert_close(buf, dict(ref.named_buffers())[name], rtol=1e-4, atol=1e-4)
    (runner,) = _runners(programs)
    assert runner.fallback_reason is None and runner.count >= 1 and runner.replays >= 4


def test_parameters_are_not_copied_per_replay():
    """The profiler of one replay: at most one device-to-device copy (the input ``x`` into the
    recording), none of the 24 parameters of a 12-layer MLP."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    layers = [m for _ in range(12) for m in (torch.nn.Linear(256, 256), torch.nn.ReLU())]
    model = torch.nn.Sequential(*layers).cuda().eval()
    fn, programs = _compile(model)
    x = torch.randn(8, 256, device="cuda")
    with torch.no_grad():
        for _ in range(4):
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = fn(x)
            torch.cuda.synchronize()
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(programs)
    assert len(runner.static) == 24 and runner.replays >= 3
    copies = [e.name for e in prof.events() if "memcpy" in e.name.lower() and "dtod" in e.name.lower().replace(" ", "")]
    assert len(copies) <= 1, copies


def test_a_new_recording_when_a_static_input_moves():
    model, ref = _twins(Decoder)
    step, programs = _compile(model)
    with torch.no_grad():
        for i in range(3):
            inputs = _decode_inputs(i)
            torch.testing.assert_close(step(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)
        (runner,) = _runners(programs)
        before = runner.count
        fresh = torch.randn_like(model.qkv[0].weight) / 16
        model.qkv[0].weight.data = fresh.clone()
        ref.qkv[0].weight.data = fresh.clone()
        for i in range(3, 6):
            inputs = _decode_inputs(i)
            torch.testing.assert_close(step(*inputs), ref(*inputs), rtol=1e-4, atol=1e-4)
    assert runner.count == before + 1


class ItemNet(torch.nn.Module):
    """Eight small linear layers (a launch each: matrix products do not fuse), an ``.item()``
    picking a row, eight more: host launch cost dominates, which graphs remove."""

    def __init__(self, dim=64):
        super().__init__()
        self.before = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(8))
        self.after = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(8))

    def forward(self, x, idx):
        for layer in self.before:
            x = torch.softmax(layer(x), -1)
        i = idx.item()
        torch._check(i >= 0)
        torch._check(i < x.shape[0])
        y = x[i:i + 1]
        for layer in self.after:
            y = torch.tanh(layer(y))
        return y


def test_partitions_around_item_match_eager_and_beat_no_graphs():
    torch.manual_seed(0)
    model = ItemNet().cuda().eval()
    with torch._dynamo.config.patch(capture_scalar_outputs=True), torch.no_grad():
        graphs, programs = _compile(model)
        plain, _ = _compile(model, mode="default")
        x = torch.randn(16, 64, device="cuda")
        for i in (0, 3, 3, 3, 5, 3):
            idx = torch.tensor(i, device="cuda")
            torch.testing.assert_close(graphs(x, idx), model(x, idx), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(plain(x, idx), model(x, idx), rtol=1e-4, atol=1e-4)
        code = programs[0].code()
        assert "capture=False)  # aten._local_scalar_dense.default" in code and "capture=True" in code
        assert sum(r.replays for r in _runners(programs)) >= 2

        def timed(fn):
            idx = torch.tensor(3, device="cuda")
            runs = []
            for _ in range(7):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(50):
                    fn(x, idx)
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - start)
            return statistics.median(runs)
        with_graphs, without = timed(graphs), timed(plain)
    assert with_graphs < without, f"partitioned graphs {with_graphs:.4f}s vs plain {without:.4f}s"


def test_several_sizes_under_dynamic_shapes():
    fn, programs = _compile(lambda x, w: torch.relu(x @ w).sum(-1), dynamic=True)
    w = torch.randn(64, 64, device="cuda")
    for n in (3, 17, 40):
        for _ in range(3):
            x = torch.randn(n, 64, device="cuda")
            torch.testing.assert_close(fn(x, w), torch.relu(x @ w).sum(-1), rtol=1e-4, atol=1e-4)
    (runner,) = _runners(programs)
    assert runner.count == 3 and runner.replays == 3


def test_batch_norm_training_under_cuda_graphs():
    model, ref = _twins(lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                                    torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(4)))
    x0 = torch.randn(4, 3, 10, 10, device="cuda")
    model(x0), ref(x0)  # materialize the lazy layer
    ref.load_state_dict(model.state_dict())
    fn, programs = _compile(model)
    for _ in range(5):
        x = torch.randn(4, 3, 10, 10, device="cuda")
        out, want = fn(x), ref(x)
        torch.testing.assert_close(out, want, rtol=1e-3, atol=1e-3)
        g = torch.randn_like(out)
        out.backward(g)
        want.backward(g)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-3)
            p.grad = q.grad = None
        torch.testing.assert_close(model[1].running_mean, ref[1].running_mean, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model[1].running_var, ref[1].running_var, rtol=1e-4, atol=1e-4)
        del out, want, g  # a held output keeps its recording busy: the next call would record anew
    assert all(r.count >= 1 and r.replays >= 2 and r.fallback_reason is None for r in _runners(programs))
