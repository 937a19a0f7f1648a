"""Channels-last convolutions in training graphs (fxwrap.core.layout, api.compile_aten_graph).

The forward graph of a training pair goes channels-last: its saved activations stay NHWC,
its user-visible outputs get their traced layout back; it reports the strides it returns
(core/capture.py), and the backward graph is compiled for them, its
``convolution_backward`` externs reading NHWC tensors.  Checked: a few SGD steps of a
conv/BN/ReLU/residual/pool net against eager (loss and every gradient) on each CPU
target, the structure of both programs, the backward's input guard, the fallback copy
of a re-strided input whose layout the graph cannot take, and dynamic shapes (off).
"""
from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import fxwrap
from fxwrap.api import compile_aten_graph, resolve_target
from fxwrap.core.layout import follow_input_layouts
from fxwrap.runtime.guards import InputMismatchError

aten = torch.ops.aten
FWD_TOL = dict(rtol=1e-4, atol=1e-5)
GRAD_TOL = dict(rtol=1e-4, atol=1e-4)


class ResidualNet(nn.Module):
    """conv-BN-ReLU, a residual block, max-pool, a strided conv, global pool, linear; returns
    the logits and the feature map after the residual block (a user-visible 4-D output)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1)
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        features = F.relu(self.bn2(self.conv2(y)) + y)
        z = F.relu(self.conv3(F.max_pool2d(features, 2)))
        return self.fc(F.adaptive_avg_pool2d(z, 1).flatten(1)), features


def _train(model, run, steps, inputs, targets, autocast_dtype=None):
    """``steps`` SGD steps of ``model`` called through ``run`` (under autocast to
    ``autocast_dtype`` if given); the losses, per step every parameter's gradient, and the
    feature maps."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads, outputs = [], [], []
    for x, t in zip(inputs[:steps], targets[:steps]):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits, features = run(x)
            loss = F.cross_entropy(logits.float(), t) + features.float().square().mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        outputs.append(features)
        optimizer.step()
    return losses, grads, outputs


def _assert_close(got, want, tol, what):
    if tol is None:  # 16-bit: the error of the whole tensor, relative to it, with a floor (the
        # gradient of a bias before batch norm is zero but for rounding)
        error = (got.float() - want.float()).norm()
        bound = 0.05 * want.float().norm() + 0.01 * want.numel() ** 0.5
        assert error <= bound, f"{what}: error {error:.3g} (norm {want.float().norm():.3g})"
    else:
        torch.testing.assert_close(got, want, **tol, msg=lambda m: f"{what}: {m}")


def compiled_steps(target, steps=3, dynamic=False, shape=(4, 3, 12, 12), device="cpu", autocast_dtype=None,
                   fwd_tol=FWD_TOL, grad_tol=GRAD_TOL):
    """``steps`` SGD steps of ``ResidualNet`` compiled by fxwrap for ``target`` and in eager,
    from the same weights and batches: the losses, feature maps (values and layout) and
    every gradient of every step agree.  Returns the fxwrap programs."""
    torch.manual_seed(11)
    model = ResidualNet()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand_like(m.weight) + 0.5)
                m.bias.copy_(torch.randn_like(m.bias))
    model = model.to(device)
    ref = copy.deepcopy(model)
    inputs = [torch.randn(shape, device=device) for _ in range(steps)]
    targets = [torch.randint(0, 10, (shape[0],), device=device) for _ in range(steps)]
    programs = []
    compiled = torch.compile(model, backend="fxwrap", dynamic=dynamic,
                             options={"target": target, "on_program": programs.append})
    got = _train(model, compiled, steps, inputs, targets, autocast_dtype)
    want = _train(ref, ref, steps, inputs, targets, autocast_dtype)
    for step in range(steps):
        _assert_close(got[0][step], want[0][step], fwd_tol, f"loss of step {step}")
        _assert_close(got[2][step], want[2][step], fwd_tol, f"feature map of step {step}")
        assert got[2][step].stride() == want[2][step].stride()  # a user-visible output: eager's layout
        for name, grad in want[1][step].items():
            _assert_close(got[1][step][name], grad, grad_tol, f"step {step}, grad of {name}")
    return programs


def program_of(programs, kind):
    (program,) = [p for p in programs if p.kind == kind]
    return program


def externs(program, op):
    return [line for line in program.lines if type(line).__name__ == "CallExtern" and line.op is op]


def channels_last(buf) -> bool:
    return len(buf.stride) == 4 and buf.stride[1] == 1 and buf.size[1] > 1


def _conversion_kernels(program):
    """The kernels that compute a layout conversion (an ``aten.clone`` with a memory format
    is among the nodes they compute), as (reads only program inputs, writes only returned
    buffers)."""
    inputs = {b.name for b in program.inputs if hasattr(b, "stride")}
    (returned,) = [line for line in program.lines if type(line).__name__ == "Return"]
    outputs = {b.name for b in returned.reads()}
    found = []
    for line in program.lines:
        if type(line).__name__ == "CallKernel" and any(o.target == "aten.clone.default" for o in line.origins):
            written = {b.name for b in line.writes()}
            reads = {b.name for b in line.reads()} - written
            found.append((reads <= inputs, written <= outputs))
    return found


@pytest.mark.parametrize("target", ["cpu", "reference", "triton-interpret"])
def test_training_steps_match_eager_with_channels_last_programs(target):
    assert_channels_last_programs(compiled_steps(target, steps=3 if target == "cpu" else 2))


def assert_channels_last_programs(programs):
    """Every convolution of the forward program reads channels-last input and weight, every
    convolution_backward of the backward program channels-last grad_output, input, weight."""
    forward, backward = program_of(programs, "forward"), program_of(programs, "backward")
    convolutions = externs(forward, aten.convolution.default)
    assert len(convolutions) == 3
    assert all(channels_last(c.args[0]) and channels_last(c.args[1]) for c in convolutions)
    backwards = externs(backward, aten.convolution_backward.default)
    assert len(backwards) == 3
    assert all(channels_last(b.args[0]) and channels_last(b.args[1]) and channels_last(b.args[2])
               for b in backwards)


def test_layout_conversions_only_at_the_programs_edges():
    """The forward converts only its inputs (the image and the weights) and gives the
    user-visible feature map back its traced layout: nothing between convolutions.  The
    backward reads the saved activations as the forward left them (channels-last), converts
    only its inputs (the image and the weights, saved in NCHW) and gives each weight
    gradient back its parameter's layout.  Kernels are counted one a conversion: without
    combo kernels, which may launch a conversion of an input and one of an output together."""
    from combo_cases import no_combo_kernels
    from fxwrap.targets.cpu_cpp.emitter import CppEmitter
    with no_combo_kernels(CppEmitter):
        programs = compiled_steps("cpu", steps=1)
    forward, backward = program_of(programs, "forward"), program_of(programs, "backward")
    assert sorted(_conversion_kernels(forward)) == [(False, True)] + [(True, False)] * 4
    activations = [b for b in backward.inputs if hasattr(b, "stride") and len(b.stride) == 4
                   and b.size[0] == 4 and b.size[1] > 3 and b.size[2] > 1]  # batch 4: not a weight
    # all channels-last but the last: the incoming gradient of the feature map (the user's layout)
    assert [channels_last(b) for b in activations] == [True] * (len(activations) - 1) + [False]
    assert len(activations) >= 4
    assert sorted(_conversion_kernels(backward)) == [(False, True)] * 3 + [(True, False)] * 4


def test_backward_guard_accepts_the_forwards_layout_and_rejects_another():
    programs = compiled_steps("cpu", steps=1)
    backward = program_of(programs, "backward")
    args = [torch.empty_strided(tuple(int(s) for s in b.size), tuple(int(s) for s in b.stride), dtype=b.dtype)
            for b in backward.inputs]
    backward.input_guard(*args)  # the layouts the forward returns: accepted
    wrong = next(i for i, b in enumerate(backward.inputs) if channels_last(b) and min(b.size[2:]) > 1)
    args[wrong] = args[wrong].contiguous()
    with pytest.raises(InputMismatchError, match="strides"):
        backward.input_guard(*args)
    with pytest.raises(InputMismatchError, match="strides"):
        backward(*args)


def test_dynamic_shapes_keep_the_traced_layout(caplog):
    with caplog.at_level(logging.INFO, logger="fxwrap"):
        programs = compiled_steps("cpu", steps=2, dynamic=True)
    forward = program_of(programs, "forward")
    assert not any(channels_last(c.args[0]) for c in externs(forward, aten.convolution.default))
    assert "symbolic sizes" in caplog.text


def _fake_graph(fn, *shapes):
    mode = FakeTensorMode()
    gm = make_fx(fn, tracing_mode="fake")(*[torch.randn(s) for s in shapes])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, placeholders, placeholders[0].meta["val"].fake_mode or mode


def test_restrided_input_the_graph_cannot_take_is_copied_to_its_traced_layout():
    """A backward-like graph that views its input flat (valid only for the traced,
    contiguous layout) gets it channels-last: the program copies it back first, computes
    the right numbers, and its guard takes channels-last inputs only."""
    def graph(a, b):
        return (a.view(a.shape[0], -1) * 2 + b.view(a.shape[0], -1),)

    gm, placeholders, fake_mode = _fake_graph(graph, (2, 4, 3, 3), (2, 4, 3, 3))
    traced = placeholders[0].meta["val"]
    given = [traced.as_strided(traced.shape, (36, 1, 12, 4)), placeholders[1].meta["val"]]
    program = compile_aten_graph(gm, resolve_target("cpu"), "backward", example_inputs=given)
    copies = [n for n in gm.graph.nodes if n.target is aten.copy.default]
    assert [c.args[1] for c in copies] == [placeholders[0]]
    a, b = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    (got,) = program(a.contiguous(memory_format=torch.channels_last), b)
    torch.testing.assert_close(got, graph(a, b)[0])
    with pytest.raises(InputMismatchError):
        program(a, b)


def test_restrided_input_propagates_where_the_graph_allows():
    """Pointwise math on a re-strided input: no copy, the program reads it channels-last."""
    def graph(a):
        return (torch.relu(a) * 3,)

    gm, placeholders, _ = _fake_graph(graph, (2, 4, 3, 3))
    traced = placeholders[0].meta["val"]
    given = [traced.as_strided(traced.shape, (36, 1, 12, 4))]
    assert follow_input_layouts(gm, given, channels_last=False) == [placeholders[0].name]
    assert not any(n.target is aten.copy.default for n in gm.graph.nodes)
    program = compile_aten_graph(gm, resolve_target("cpu"), "backward")
    a = torch.randn(2, 4, 3, 3)
    (got,) = program(a.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, graph(a)[0])
    assert got.stride() == (36, 9, 3, 1)  # the output keeps its traced layout


def test_each_layout_rewrite_propagates_the_graph_once(monkeypatch):
    """A clone made needless by the propagation (the ReLU after a converted convolution,
    feeding the next one) gives its input's layout exactly: dropping it changes no value, so
    neither the forward's rewrite nor the backward's propagates the whole graph a second
    time (a FakeTensorProp over every node: a third of EfficientNet-B0's training compile
    on the host).  The programs are channels-last and the numbers eager's."""
    from fxwrap.core import layout
    calls = []
    real = layout.propagate

    def counted(candidate, fake_mode, input_values, what="channels-last layout"):
        # the operand swap of _follow_channels_last changes layouts and propagates on its own
        if what == "channels-last layout":
            calls.append(sum(n.op == "call_function" for n in candidate.graph.nodes))
        return real(candidate, fake_mode, input_values, what)
    monkeypatch.setattr(layout, "propagate", counted)
    needless = []
    real_erase = torch.fx.Graph.erase_node

    def erase(graph, node):
        if node.target is aten.clone.default:
            needless.append(node.name)
        return real_erase(graph, node)
    monkeypatch.setattr(torch.fx.Graph, "erase_node", erase)
    programs = compiled_steps("cpu", steps=1)
    assert_channels_last_programs(programs)
    assert needless  # the case the rule is for: clones dropped after the propagation
    assert len(calls) == 2, calls  # the forward's rewrite, the backward's (besides the operand swap's)


def test_bf16_autocast_training_steps_run_channels_last():
    assert_channels_last_programs(compiled_steps("cpu", steps=2, autocast_dtype=torch.bfloat16,
                                                 fwd_tol=None, grad_tol=None))


def test_a_half_precision_only_device_trains_float32_convolutions_in_the_traced_layout(monkeypatch):
    """``training_convolution_layout="channels_last_half"`` (the cuda device: cuDNN's float32
    NHWC convolutions use TF32): a float32 training pair keeps the traced NCHW layout, a
    bfloat16 autocast pair goes channels-last.  Here on the cpu target with its device's
    capabilities set so."""
    from fxwrap.targets.host.device import CpuDevice
    real = CpuDevice.capabilities
    monkeypatch.setattr(CpuDevice, "capabilities",
                        lambda self: dataclasses.replace(real(self), training_convolution_layout="channels_last_half"))
    # sessions ask the device once: a fresh manager's sessions ask the patched one
    with fxwrap.use_plugin_manager(fxwrap.PluginManager(fxwrap.installed_entry_points())):
        torch._dynamo.reset()
        fp32 = compiled_steps("cpu", steps=2)
        convolutions = externs(program_of(fp32, "forward"), aten.convolution.default)
        assert len(convolutions) == 3 and not any(channels_last(c.args[0]) for c in convolutions)
        torch._dynamo.reset()
        assert_channels_last_programs(compiled_steps("cpu", steps=2, autocast_dtype=torch.bfloat16,
                                                     fwd_tol=None, grad_tol=None))
