"""A convolution's bias added by the kernel after it, where the vendor call adds it in a pass of its own.

ATen's cuDNN path computes ``convolution(x, w, b)`` as the convolution without bias and
then ``out.add_(b.view(1, C, 1, 1))``: one more read and write of the whole result, an
ATen ``add_`` kernel of its own (ConvNeXt-T: 22 of them a call).  Where the device says
so (``capabilities().convolution_bias == "epilogue"``), ``bias_as_epilogue(gm)``
rewrites each convolution with a bias on the ATen graph::

    convolution = aten.convolution(x, w, b, [1, 1], [3, 3], [1, 1], False, [0, 0], 96)
    gelu = aten.gelu(convolution)

into::

    convolution = aten.convolution(x, w, None, [1, 1], [3, 3], [1, 1], False, [0, 0], 96)
    view = aten.view(b, [96, 1, 1])
    add = aten.add.Tensor(convolution, view)      # fused with the gelu: one kernel
    gelu = aten.gelu(add)

so the bias is one more operand of the pointwise kernel that follows (batch norm, the
activation, a residual add) instead of a pass over the result.  The numbers are eager's:
the convolution's result is rounded to its dtype before the bias is added, as the cuDNN
path does.  oneDNN (``cpu``) adds the bias inside the convolution: that device does not
ask for the rewrite, and its programs pass the bias to the call.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch._guards import detect_fake_mode

log = logging.getLogger("fxwrap.layout")
aten = torch.ops.aten


def _bias(node: torch.fx.Node) -> torch.fx.Node | None:
    """The bias node of a convolution with one (``convolution(x, w, b, ...)``), else None."""
    if node.op != "call_function" or node.target is not aten.convolution.default or len(node.args) != 9:
        return None
    bias = node.args[2]
    val = node.meta.get("val")
    bias_val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or not isinstance(bias_val, torch.Tensor) or bias_val.dim() != 1:
        return None
    if val.dim() < 3 or bias_val.dtype != val.dtype:
        return None
    return bias


def bias_as_epilogue(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place as the module docstring says; the number of convolutions
    rewritten.  A convolution whose sum would not keep its result's layout is left as it was."""
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    if fake_mode is None:
        return 0
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        bias = _bias(node)
        if bias is None:
            continue
        val = node.meta["val"]
        shape = [val.shape[1]] + [1] * (val.dim() - 2)
        with fake_mode:
            bare_val = aten.convolution.default(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a
                                                   for a in (*node.args[:2], None, *node.args[3:])))
            view_val = aten.view.default(bias.meta["val"], shape)
            sum_val = aten.add.Tensor(bare_val, view_val)
        if sum_val.stride() != val.stride() or bare_val.stride() != val.stride():
            log.info("convolution bias kept in %s: the sum's strides %s are not the result's %s",
                     node.name, sum_val.stride(), val.stride())
            continue
        with graph.inserting_before(node):
            bare = graph.call_function(aten.convolution.default, (*node.args[:2], None, *node.args[3:]))
            view = graph.call_function(aten.view.default, (bias, shape))
            total = graph.call_function(aten.add.Tensor, (bare, view))
        for new, new_val in ((bare, bare_val), (view, view_val), (total, sum_val)):
            new.meta.update({k: v for k, v in node.meta.items() if k != "val"})
            new.meta["val"] = new_val
        node.replace_all_uses_with(total)
        graph.erase_node(node)
        rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
        log.info("convolution bias: %d convolution(s) add their bias in the kernel after them", rewritten)
    return rewritten
