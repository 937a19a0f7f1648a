"""Layout choices made on the ATen graph before lowering: convolution nets run channels-last.

cuDNN and oneDNN compute a 2-D convolution fastest on NHWC (channels-last) tensors; on
NCHW ones they transpose the input and the weight in and the result out around every
convolution.  ``channels_last_convolutions(gm)`` gives every 4-D convolution (and every
4-D ``convolution_backward``: its grad_output, input and weight) channels-last tensors,
lets the layout flow through the ops after it (batch norm, ReLU, residual adds and
pooling keep a channels-last input's layout; a sum whose first operand is a broadcast
takes its operands the other way round to keep it too: ``_follow_channels_last``), and
gives the graph's outputs back the layout they were traced with::

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

Training pairs.  A forward graph's outputs are the user's values and then the
activations AOTAutograd saves for the backward graph.  ``saved_outputs`` names the
latter: they keep the layout the pass gave them (no copy back to NCHW), the user's
values get their traced layout back.  The backward graph was traced for the traced
strides of those activations; AOTAutograd hands its compiler example inputs re-strided
to what the compiled forward reported it returns (``TracingContext.output_strides``),
and ``follow_input_layouts(gm, example_inputs)`` makes the backward graph's placeholders
say the same, propagates the new strides through the graph (then converting its
convolution backwards too) and, where that propagation fails, copies each re-strided
input back into its traced layout at the top of the graph::

    # saved activation relu_1 arrives NHWC, the graph was traced for NCHW
    relu_1 = placeholder                        # meta: (1024, 1, 128, 16)
    ...
    convolution_backward = aten.convolution_backward(grad_cl, relu_1, w_cl, ...)
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fxwrap.runtime.weight_layouts import CACHED_LAYOUT

log = logging.getLogger("fxwrap.layout")
aten = torch.ops.aten

# ops whose result depends on the strides of their input, not only on its values
_STRIDE_DEPENDENT = {
    aten.as_strided.default, aten.as_strided_.default, aten.as_strided_scatter.default,
    aten.as_strided_copy.default,
}

# convolution op -> (position of its input, of its `transposed` flag, positions made channels-last)
_CONVOLUTIONS = {
    aten.convolution.default: (0, 6, (0, 1)),
    aten.convolution_backward.default: (1, 7, (0, 1, 2)),
}


def _channels_last_positions(node: torch.fx.Node) -> tuple[int, ...]:
    """The argument positions of a 4-D, not transposed convolution (or its backward)
    that the pass makes channels-last; () for any other node."""
    if node.op != "call_function" or node.target not in _CONVOLUTIONS:
        return ()
    input_at, transposed_at, positions = _CONVOLUTIONS[node.target]
    source = node.args[input_at] if len(node.args) > input_at else None
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    transposed = node.args[transposed_at] if len(node.args) > transposed_at else False
    if isinstance(val, torch.Tensor) and val.dim() == 4 and not transposed:
        return positions
    return ()


def _is_channels_last(val: torch.Tensor) -> bool:
    return val.is_contiguous(memory_format=torch.channels_last)


def has_channels_last_convolution(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` has a convolution the pass would make channels-last."""
    return any(_channels_last_positions(n) for n in gm.graph.nodes)


def half_precision_convolutions(gm: torch.fx.GraphModule) -> bool:
    """Whether every convolution the pass would make channels-last takes a float16 or
    bfloat16 input (``Capabilities`` value ``"channels_last_half"``)."""
    found = False
    for node in gm.graph.nodes:
        if _channels_last_positions(node):
            input_at = _CONVOLUTIONS[node.target][0]
            if node.args[input_at].meta["val"].dtype not in (torch.float16, torch.bfloat16):
                return False
            found = True
    return found


def channels_last_convolutions(gm: torch.fx.GraphModule, saved_outputs: Collection[int] = (),
                               input_values: Sequence | None = None, cache_weights: bool = False) -> bool:
    """Rewrite ``gm`` as the module docstring says; True if it changed.

    ``saved_outputs``: positions of the (flat) outputs that keep the layout the pass gives
    them (a forward graph's saved activations); every other output gets its traced
    layout back.  ``input_values``: the fake values to propagate from, one per
    placeholder (default: the placeholders' own); they become the placeholders'
    ``meta["val"]`` when the rewrite is kept.  ``cache_weights``: a convolution's weight that
    is a graph input (a parameter) goes channels-last through ``fxwrap.cached_layout`` (one
    copy per version of the parameter, ``fxwrap.runtime.weight_layouts``), not a copy per
    call.  The rewrite is made on a copy of the graph, which replaces ``gm.graph`` only
    once it propagated."""
    if not has_channels_last_convolution(gm):
        return False
    if any(n.target in _STRIDE_DEPENDENT for n in gm.graph.nodes):
        log.info("channels-last layout not applied: the graph has a stride-dependent op (as_strided)")
        return False
    return _relayout(gm, input_values, convert=True, saved_outputs=saved_outputs, cache_weights=cache_weights)


def follow_input_layouts(gm: torch.fx.GraphModule, example_inputs: Sequence,
                         channels_last: bool) -> list[str]:
    """Make a backward graph read its inputs in the layout they will come in.

    ``example_inputs`` are AOTAutograd's example inputs for ``gm``: the placeholders' fake
    values, those of saved activations re-strided to what the compiled forward returns
    (only fake tensors of static layout are followed).
    Where they differ from the placeholders' ``meta["val"]`` the graph is propagated
    again from them (with ``channels_last``: and its convolution backwards converted);
    where that propagation fails, each such input is copied into its traced layout first
    (``aten.copy(aten.empty_strided(traced), input)``), so the rest of the graph reads the
    layout it was traced for.  Returns the names of the re-strided placeholders."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [n.meta.get("val") for n in placeholders]
    restrided = []
    for i, (node, given) in enumerate(zip(placeholders, example_inputs)):
        val = values[i]
        if isinstance(val, torch.Tensor) and isinstance(given, FakeTensor) \
                and _static(val) and _static(given) \
                and tuple(val.shape) == tuple(given.shape) and val.stride() != given.stride():
            values[i] = given
            restrided.append(node)
    if channels_last and channels_last_convolutions(gm, input_values=values):
        return [n.name for n in restrided]
    if not restrided:
        return []
    stride_dependent = any(n.target in _STRIDE_DEPENDENT for n in gm.graph.nodes)
    if not stride_dependent and _relayout(gm, values, convert=False):
        return [n.name for n in restrided]
    _copy_to_traced_layout(gm, {n: values[placeholders.index(n)] for n in restrided})
    return [n.name for n in restrided]


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether fake values ``a`` and ``b`` have one size, stride, offset and dtype."""
    return _static(a) and _static(b) and \
        (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(), b.dtype)


def _static(val: torch.Tensor) -> bool:
    return all(isinstance(s, int) for s in (*val.shape, *val.stride()))


def _relayout(gm: torch.fx.GraphModule, input_values: Sequence | None, convert: bool,
              saved_outputs: Collection[int] = (), cache_weights: bool = False) -> bool:
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    outputs = graph.graph_copy(gm.graph, env)
    traced = {env[n]: n.meta.get("val") for n in gm.graph.nodes if n in env}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if input_values is None:
        input_values = [n.meta.get("val") for n in placeholders]
    fake_mode = detect_fake_mode([v for v in input_values if isinstance(v, torch.Tensor)])
    if fake_mode is None or any("val" not in n.meta for n in placeholders):
        log.info("channels-last layout not applied: the graph's inputs have no fake values")
        return False
    for node, value in zip(placeholders, input_values):
        node.meta["val"] = value

    clones = []
    if convert:
        for node in [n for n in graph.nodes if _channels_last_positions(n)]:
            for position in _channels_last_positions(node):
                arg = node.args[position]
                if not isinstance(arg, torch.fx.Node) or _is_channels_last(arg.meta["val"]):
                    continue
                val = arg.meta["val"]
                with graph.inserting_before(node):
                    if cache_weights and node.target is aten.convolution.default and position == 1 \
                            and arg.op == "placeholder" and _static(val):
                        n, c, h, w = val.shape  # a parameter: copied once per version of it
                        clone = graph.call_function(CACHED_LAYOUT, (arg, [c * h * w, 1, w * c, c]))
                    else:
                        clone = graph.call_function(aten.clone.default, (arg,),
                                                    {"memory_format": torch.channels_last})
                args = list(node.args)
                args[position] = clone
                node.args = tuple(args)
                clones.append(clone)

    graph.output(outputs)
    candidate = torch.fx.GraphModule(gm, graph)
    if not propagate(candidate, fake_mode, input_values):
        return False
    # a clone whose input the propagation made channels-last already is a copy for nothing
    # (the relu after a converted convolution, feeding the next one): drop it.  Where the
    # clone gave exactly its input's layout (the usual case) every value after it stays as
    # propagated; only a clone that changed the strides (sizes for which two layouts are both
    # channels-last) means propagating again (a whole-graph FakeTensorProp: a third of a
    # convolutional network's training compile on the host)
    needless = [c for c in clones if _is_channels_last(c.args[0].meta["val"])]
    same_layout = all(_same_layout(c.meta["val"], c.args[0].meta["val"]) for c in needless)
    for clone in needless:
        clone.replace_all_uses_with(clone.args[0])
        graph.erase_node(clone)
    if needless and not same_layout and not propagate(candidate, fake_mode, input_values):
        return False

    _follow_channels_last(candidate, fake_mode, input_values)
    if not restore_traced_outputs(graph, traced, saved_outputs, "channels-last layout"):
        return False
    gm.graph = graph
    gm.recompile()
    return True


# commutative ops whose operands may swap places exactly (IEEE addition and multiplication are)
_COMMUTATIVE = {aten.add.Tensor, aten.mul.Tensor}


def _follow_channels_last(candidate: torch.fx.GraphModule, fake_mode, input_values: Sequence) -> None:
    """A sum or product that propagation left NCHW though its second operand is a full-size
    channels-last tensor (ATen's output layout follows the first operand: a broadcast
    gradient, ``expand(div(grad, 256)) + convolution_backward(...)[0]``, makes the sum NCHW)
    takes its operands the other way round, so that it is channels-last as well; its readers
    (a max-pool gradient's gathers, a batch-norm gradient's column sums over channels, where
    it is stored) then read channels contiguous.  Nothing changes where a reader refuses the
    layout (a ``view``)::

        add_27 = aten.add(expand, getitem_24)    # getitem_24 NHWC: add_27 NCHW
        add_27 = aten.add(getitem_24, expand)    # NHWC
    """
    graph = candidate.graph
    output = next(n for n in graph.nodes if n.op == "output")
    swapped = []
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op != "call_function" or node.target not in _COMMUTATIVE or node.kwargs \
                or not isinstance(val, torch.Tensor) or val.dim() != 4 or _is_channels_last(val) \
                or output in node.users or not all(isinstance(a, torch.fx.Node) for a in node.args[:2]):
            continue
        second = node.args[1].meta.get("val")
        if isinstance(second, torch.Tensor) and second.shape == val.shape \
                and _is_channels_last(second) and not second.is_contiguous():
            node.args = (node.args[1], node.args[0], *node.args[2:])
            swapped.append(node)
    if swapped and not propagate(candidate, fake_mode, input_values, "channels-last sums and products"):
        for node in swapped:
            node.args = (node.args[1], node.args[0], *node.args[2:])
        propagate(candidate, fake_mode, input_values)


def restore_traced_outputs(graph: torch.fx.Graph, traced: dict, keep: Collection[int] = (),
                           what: str = "layout pass") -> bool:
    """After a layout rewrite of ``graph`` (values propagated): each output whose strides
    changed gets its traced layout back through ``aten.clone`` (``traced``: node -> its
    value before the rewrite), but those at positions in ``keep``.  False (the output node
    unchanged) when a changed output was traced with a layout a clone cannot give back
    (not contiguous); ``what`` names the pass in the log."""
    output = next(n for n in graph.nodes if n.op == "output")
    outputs = output.args[0]
    single = not isinstance(outputs, (tuple, list))
    values = [outputs] if single else list(outputs)
    restored = []
    for position, value in enumerate(values):
        before = traced.get(value) if isinstance(value, torch.fx.Node) else None
        after = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
        if position in keep or not isinstance(before, torch.Tensor) or before.stride() == after.stride():
            restored.append(value)
            continue
        if not before.is_contiguous():
            log.info("%s not applied: output %s was traced with strides %s", what, value.name, before.stride())
            return False
        with graph.inserting_before(output):
            back = graph.call_function(aten.clone.default, (value,),
                                       {"memory_format": torch.contiguous_format})
        back.meta["val"] = before
        restored.append(back)
    output.args = (restored[0] if single else type(outputs)(restored),)
    graph.lint()
    return True


def propagate(candidate: torch.fx.GraphModule, fake_mode, input_values: Sequence,
              what: str = "channels-last layout") -> bool:
    """Propagate ``input_values`` (fake) through ``candidate``, setting every node's
    ``meta["val"]``; False (logged, naming ``what``) where an op refuses the new layouts."""
    # constants the graph holds as real tensors (``get_attr``: the values constant folding
    # computed once) are converted as they are met, not refused
    allow = fake_mode.allow_non_fake_inputs
    fake_mode.allow_non_fake_inputs = True
    try:
        with fake_mode:
            FakeTensorProp(candidate, mode=fake_mode).propagate_dont_convert_inputs(*input_values)
    except Exception as error:  # a view only a contiguous tensor allows, an unsupported op
        log.info("%s not applied: %s", what, error)
        return False
    finally:
        fake_mode.allow_non_fake_inputs = allow
    return True


def _copy_to_traced_layout(gm: torch.fx.GraphModule, given: dict[torch.fx.Node, torch.Tensor]) -> None:
    """Each placeholder of ``given`` takes that value's layout and is copied into a tensor of
    its traced layout, which its users read instead."""
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node, value in given.items():
        traced = node.meta["val"]
        with graph.inserting_before(first):
            empty = graph.call_function(aten.empty_strided.default, (list(traced.shape), list(traced.stride())),
                                        {"dtype": traced.dtype, "device": traced.device})
            copy = graph.call_function(aten.copy.default, (empty, node))
        node.replace_all_uses_with(copy, delete_user_cb=lambda user: user is not copy)
        fake_mode = detect_fake_mode([traced])
        with fake_mode:
            empty.meta["val"] = torch.empty_strided(traced.shape, traced.stride(), dtype=traced.dtype,
                                                    device=traced.device)
            copy.meta["val"] = aten.copy.default(empty.meta["val"], value)
        if copy.meta["val"].stride() != traced.stride():
            raise RuntimeError(f"fxwrap: the backward graph's input {node.name} arrives with strides "
                               f"{value.stride()} but was traced with {traced.stride()}, and aten.copy "
                               f"cannot restore that layout (it gave {copy.meta['val'].stride()}); this is "
                               "a bug in fxwrap's layout choice (fxwrap.core.layout): please report it "
                               "with the graphs FXWRAP_DEBUG_DIR=dir writes")
        node.meta["val"] = value
        log.info("backward input %s arrives with strides %s (traced %s): copied into the traced layout",
                 node.name, value.stride(), traced.stride())
    graph.lint()
    gm.recompile()
