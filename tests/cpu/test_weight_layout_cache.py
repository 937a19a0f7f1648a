"""``options={"cache_weight_layouts": True}``: an inference program relays each convolution
weight out to channels-last once per version of the parameter (``fxwrap.cached_layout``,
``fxwrap.runtime.weight_layouts``), not by a copy kernel on every call; and follows every
change of the weight: an in-place write (an optimizer step), ``load_state_dict``, a new
tensor assigned to ``.data``.  Off by default: a copy per call.  Numbers against eager."""
from __future__ import annotations

import torch
import torch.nn as nn

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.runtime.weight_layouts import CACHED_LAYOUT, STATS


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()


def _cached(program):
    return [line for line in program.lines if isinstance(line, CallExtern) and line.op is CACHED_LAYOUT]


def _weight_copies(program):
    """Kernels that write a convolution's weight (the per-call relayout)."""
    weights = {line.args[1].name for line in program.lines
               if isinstance(line, CallExtern) and line.op is torch.ops.aten.convolution.default}
    return [line for line in program.lines if isinstance(line, CallKernel)
            and {b.name for b in line.writes()} & weights]


def test_weights_relaid_once_per_version():
    net, x = _net(), torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        program = fxwrap.lower(net, x, options={"cache": False, "cache_weight_layouts": True})
        # the 1x1 weight [4, 8, 1, 1] is channels-last already: two relayouts
        assert len(_cached(program)) == 2 and not _weight_copies(program), program.code()
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
        misses = STATS.misses
        for _ in range(2):  # the same parameters: no copy made
            x = torch.randn(2, 3, 10, 9)
            torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
        assert STATS.misses == misses
        net[0].weight.mul_(-1.5)  # an optimizer's in-place step
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
        assert STATS.misses == misses + 1
        other = _net()
        with torch.no_grad():
            for p in other.parameters():
                p.uniform_(-1, 1)
        net.load_state_dict(other.state_dict())
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
        net[3].weight.data = torch.randn_like(net[3].weight)  # a new tensor: a new data_ptr
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)


def test_training_steps_between_calls():
    """An optimizer step between inference calls: each call reads the stepped weights."""
    net, x = _net(), torch.randn(2, 3, 8, 8)
    compiled = torch.compile(net, backend="fxwrap", options={"cache": False, "cache_weight_layouts": True})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), net(x), rtol=1e-4, atol=1e-4)
        net.train()
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()
        net.eval()


def test_off_by_default_a_copy_per_call():
    net, x = _net(), torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        program = fxwrap.lower(net, x, options={"cache": False})
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
    assert not _cached(program) and _weight_copies(program), program.code()
