"""Layout choices made on the ATen graph before lowering: convolution nets run channels-last.

cuDNN and oneDNN compute a 2-D convolution fastest on NHWC (channels-last) tensors; on
NCHW ones they transpose the input and the weight in and the result out around every
convolution.  ``channels_last_convolutions(gm)`` gives every 4-D convolution a
channels-last input and weight, lets the layout flow through the ops after it (batch
norm, ReLU, residual adds and pooling keep a channels-last input's layout), and gives
the graph's outputs back the layout they were traced with::

    convolution = aten.convolution(x, w, b, ...)          # x, w: NCHW
    relu = aten.relu(convolution)
    return (relu,)

becomes::

    x_cl = aten.clone(x, memory_format=torch.channels_last)
    w_cl = aten.clone(w, memory_format=torch.channels_last)
    convolution = aten.convolution(x_cl, w_cl, b, ...)    # NHWC result
    relu = aten.relu(convolution)                          # NHWC, fused into a kernel
    relu_out = aten.clone(relu, memory_format=torch.contiguous_format)
    return (relu_out,)

Every node's ``meta["val"]`` is propagated again with the graph's fake mode, so the
buffers the Wrapper IR allocates have the new strides.  The pass leaves the graph as
it was when it has no 4-D convolution, when a node's semantics depend on its input's
strides (``as_strided`` and friends), when propagation fails (a ``view`` that only a
contiguous tensor allows) or when an output had a layout the pass cannot restore.
Only inference graphs take it: a forward graph's outputs include the activations its
backward graph reads with the traced strides.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

log = logging.getLogger("fxwrap.layout")
aten = torch.ops.aten

# ops whose result depends on the strides of their input, not only on its values
_STRIDE_DEPENDENT = {
    aten.as_strided.default, aten.as_strided_.default, aten.as_strided_scatter.default,
    aten.as_strided_copy.default,
}


def _is_channels_last_conv(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    transposed = node.args[6] if len(node.args) > 6 else False
    return isinstance(val, torch.Tensor) and val.dim() == 4 and not transposed


def _is_channels_last(val: torch.Tensor) -> bool:
    return val.is_contiguous(memory_format=torch.channels_last)


def channels_last_convolutions(gm: torch.fx.GraphModule) -> bool:
    """Rewrite ``gm`` as the module docstring says; True if it changed.  The rewrite is
    made on a copy of the graph, which replaces ``gm.graph`` only once it propagated."""
    if not any(_is_channels_last_conv(n) for n in gm.graph.nodes):
        return False
    if any(n.target in _STRIDE_DEPENDENT for n in gm.graph.nodes):
        return False
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    outputs = graph.graph_copy(gm.graph, env)
    traced = {env[n]: n.meta.get("val") for n in gm.graph.nodes if n in env}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if fake_mode is None or any("val" not in n.meta for n in placeholders):
        return False

    for conv in [n for n in graph.nodes if _is_channels_last_conv(n)]:
        for position in (0, 1):
            arg = conv.args[position]
            if not isinstance(arg, torch.fx.Node) or _is_channels_last(arg.meta["val"]):
                continue
            with graph.inserting_before(conv):
                clone = graph.call_function(aten.clone.default, (arg,),
                                            {"memory_format": torch.channels_last})
            conv.replace_input_with(arg, clone)

    single = not isinstance(outputs, (tuple, list))
    values = [outputs] if single else list(outputs)
    graph.output(outputs)
    candidate = torch.fx.GraphModule(gm, graph)
    try:
        with fake_mode:
            FakeTensorProp(candidate, mode=fake_mode).propagate_dont_convert_inputs(
                *[n.meta["val"] for n in placeholders])
    except Exception as error:  # a view only a contiguous tensor allows, an unsupported op
        log.info("channels-last layout not applied: %s", error)
        return False

    output = next(n for n in graph.nodes if n.op == "output")
    restored = []
    for value in values:
        before = traced.get(value) if isinstance(value, torch.fx.Node) else None
        after = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if not isinstance(before, torch.Tensor) or before.stride() == after.stride():
            restored.append(value)
            continue
        if not before.is_contiguous():
            log.info("channels-last layout not applied: output %s was traced with strides %s",
                     value.name, before.stride())
            return False
        with graph.inserting_before(output):
            back = graph.call_function(aten.clone.default, (value,),
                                       {"memory_format": torch.contiguous_format})
        back.meta["val"] = before
        restored.append(back)
    output.args = (restored[0] if single else type(outputs)(restored),)
    graph.lint()
    gm.graph = graph
    gm.recompile()
    return True
