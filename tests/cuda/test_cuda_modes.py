"""Inductor's mode names on a GPU: ``reduce-overhead`` and ``max-autotune`` replay CUDA
graphs, ``max-autotune`` times more configs per kernel than the default mode, and
``max-autotune-no-cudagraphs`` times them without graphs.  Eager's numbers throughout."""
import pytest
import torch

from fxwrap.runtime.graph_replay import replay_runners
from fxwrap.runtime.kernel import Kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the lead's H200)")


def model(x, w):
    return torch.softmax(x @ w, -1).sin() * 2 + x.sum(0)


def _compile(mode):
    torch._dynamo.reset()
    programs = []
    fn = torch.compile(model, backend="fxwrap", options={"mode": mode, "target": "cuda",
                                                         "on_program": programs.append})
    for _ in range(3):
        x, w = torch.randn(512, 256, device="cuda"), torch.randn(256, 256, device="cuda") / 16
        torch.testing.assert_close(fn(x, w), model(x, w), rtol=1e-4, atol=1e-4)
    kernels = [n.target for p in programs for n in p.graph_module.graph.nodes if isinstance(n.target, Kernel)]
    return programs, kernels


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_modes_with_cuda_graphs_replay(mode):
    programs, _ = _compile(mode)
    runners = [r for p in programs for r in replay_runners(p.runner)]
    assert runners and all(r.fallback_reason is None and r.count for r in runners)


def test_max_autotune_times_more_configs():
    _, default = _compile("default")
    _, wide = _compile("max-autotune-no-cudagraphs")
    timed = lambda ks: sum(len(dict(k.launch.timings_ms)) for k in ks)  # noqa: E731
    assert sum(len(k.launch.configs) for k in wide) > sum(len(k.launch.configs) for k in default)
    assert timed(wide) > timed(default)
    assert any(k.launch.autotuned or k.launch.autotune_reused for k in wide)
