"""``torch.cond`` and ``while_loop`` nodes -> ``Conditional`` / ``WhileLoop`` lines.

Given the ATen graph::

    true_graph_0 = self.true_graph_0            # sin(a) * b
    false_graph_0 = self.false_graph_0          # cos(a) + b
    cond = torch.ops.higher_order.cond(gt, true_graph_0, false_graph_0, (arg0_1, arg1_1))
    getitem = cond[0]

the lowerer compiles each subgraph into a ``NestedProgram`` as it compiles its own
program (with the lowering rules, fusion and kernels on kernel targets; every node an
extern call elsewhere), plans its memory and runs the session's wrapper passes
over it, exactly as for the top program, and emits::

    # cond: cond
    (buf2,) = cond(buf0, (arg0, arg1))
        def true_graph_0(arg0, arg1): ...
        def false_graph_0(arg0, arg1): ...

Layouts: a nested program takes each operand in the layout its subgraph was traced
with (the parent copies an operand it holds in another layout) and returns each
result in the layout the op's result has (both branches of a cond alike; a loop body
in the layout of the carried value it replaces, so iterations chain without copies),
as a buffer of its own: never an input's or a constant's storage, which the op
forbids (``output_value`` copies such a result).

A node this cannot express (a non-tensor result, a Python-bool predicate, a carried
int, a subgraph the lowerer rejects) stays what it was before: an extern call of the
higher-order op on its ATen subgraphs (logged), which gives eager's numbers.
"""
from __future__ import annotations

import logging

import torch

from fxwrap.core.passes import WrapperProgram, run_wrapper_passes
from fxwrap.ir.symbolic import evaluate, is_non_overlapping_and_dense
from fxwrap.ir.control_flow import Conditional, NestedProgram, WhileLoop
from fxwrap.ir.lines import Buffer, Comment, SizeInput
from fxwrap.wrapper_ir.nesting import NestedLowering

log = logging.getLogger("fxwrap")

CONTROL_FLOW_OPS = (torch.ops.higher_order.cond, torch.ops.higher_order.while_loop)


class NotExpressible(NotImplementedError):
    """A control-flow node that stays an extern call of the higher-order op."""


def build(builder: NestedLowering, node: torch.fx.Node) -> bool:
    """Emit the line of control-flow ``node`` into ``builder``; False (nothing emitted)
    where it stays an extern call of the op."""
    try:
        if node.target is torch.ops.higher_order.cond:
            _cond(builder, node)
        else:
            _while_loop(builder, node)
        return True
    except NotImplementedError as exc:  # NotExpressible, UnsupportedNode, an FX form missing
        log.info("fxwrap: %s (%s) stays a call of the higher-order op on its ATen subgraphs on target %s: %s",
                 node.name, node.target, builder.target_name, exc)
        return False


def nested_program(builder: NestedLowering, gm: torch.fx.GraphModule, name: str, output_layouts) -> NestedProgram:
    """Subgraph ``gm`` compiled as ``builder``'s program is (``compile_nested``), memory
    planned, through the wrapper passes: a ``NestedProgram`` named ``name``."""
    built = builder.compile_nested(gm, name, output_layouts)
    builder.assume_sizes(built.size_assumptions)  # what its kernels assume: the top program's guard checks it
    settings = builder.settings
    lines, plan = run_wrapper_passes(settings.wrapper_passes, built.lines, WrapperProgram(built.hints, settings.reuse))
    return NestedProgram(name, tuple(built.inputs), tuple(lines), dict(built.constants),
                         dict(built.fake_values), plan.peak_bytes)


def _subgraph(builder, attr) -> tuple[torch.fx.GraphModule, str]:
    if not (isinstance(attr, torch.fx.Node) and attr.op == "get_attr"):
        raise NotExpressible(f"subgraph argument {attr!r} is not a get_attr of a GraphModule")
    gm = builder.subgraph(attr.target)
    if not isinstance(gm, torch.fx.GraphModule):
        raise NotExpressible(f"{attr.target} is a {type(gm).__name__}, not a GraphModule")
    return gm, attr.target


def _result_layouts(builder, val) -> list[Buffer]:
    """The layout of each tensor result (offset 0); only dense ones can be fresh buffers."""
    values = list(val) if isinstance(val, (tuple, list)) else [val]
    layouts = []
    for i, fake in enumerate(values):
        if not isinstance(fake, torch.Tensor):
            raise NotExpressible(f"result {i} is a {type(fake).__name__}, not a tensor")
        layouts.append(_layout(builder, fake, f"result{i}"))
    return layouts


def _layout(builder, fake: torch.Tensor, name: str) -> Buffer:
    buf = Buffer.from_fake(name, fake)
    hints = builder.hints
    size = [evaluate(n, hints) for n in buf.size]
    stride = [evaluate(st, hints) for st in buf.stride]
    if not is_non_overlapping_and_dense(size, stride):
        raise NotExpressible(f"{name} has a layout that is not dense (size {tuple(buf.size)}, stride "
                             f"{tuple(buf.stride)})")
    return Buffer(name, buf.size, buf.stride, buf.dtype, buf.device)


def _operands(builder, values, inputs, what: str) -> tuple:
    """The parent's operand values, each tensor in the layout the nested program takes it in
    (a copy where the parent holds it in another)."""
    out = []
    for value, inp in zip(values, inputs):
        if isinstance(inp, SizeInput):
            if isinstance(value, (Buffer, torch.Tensor)):
                raise NotExpressible(f"{what}: operand {inp.name} is a size in the subgraph, a tensor here")
            out.append(value)
            continue
        if not isinstance(value, Buffer):
            raise NotExpressible(f"{what}: operand {inp.name} is a {type(value).__name__}, not a tensor")
        if (tuple(value.size), tuple(value.stride), value.dtype) != (tuple(inp.size), tuple(inp.stride), inp.dtype):
            copy = builder.fresh_buffer_like(inp)
            if tuple(copy.stride) != tuple(inp.stride):
                raise NotExpressible(f"{what}: operand {inp.name}'s traced layout is not dense")
            builder.copy_into(copy, value)
            value = copy
        out.append(value)
    return tuple(out)


def _same_inputs(a: NestedProgram, b: NestedProgram) -> None:
    key = [(type(i), getattr(i, "size", None), getattr(i, "stride", None), getattr(i, "dtype", None))
           for i in a.inputs]
    if key != [(type(i), getattr(i, "size", None), getattr(i, "stride", None), getattr(i, "dtype", None))
               for i in b.inputs]:
        raise NotExpressible(f"{a.name} and {b.name} take their operands in different layouts")


def _result_fakes(node: torch.fx.Node, layouts) -> list:
    """The op's traced results, checked to have ``layouts`` (what the nested programs return)."""
    values = node.meta["val"]
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    for i, (fake, layout) in enumerate(zip(values, layouts)):
        traced = Buffer.from_fake("result", fake)
        if (tuple(traced.size), tuple(traced.stride)) != (tuple(layout.size), tuple(layout.stride)):
            raise NotExpressible(f"result {i} is traced with strides {tuple(traced.stride)}, its programs "
                                 f"return strides {tuple(layout.stride)}")
    return values


def _results(builder, fakes) -> tuple[Buffer, ...]:
    """The parent's buffers for the op's results: storage the op made (views of them read
    the real offset)."""
    outs = []
    for fake in fakes:
        outs.append(builder.foreign_buffer(fake))
    return tuple(outs)


def _cond(builder, node: torch.fx.Node) -> None:
    pred, true_attr, false_attr, operands = node.args[:4]
    predicate = builder.value(pred)
    if not isinstance(predicate, Buffer):
        raise NotExpressible(f"the predicate is a {type(predicate).__name__}, not a 0-dim bool tensor")
    layouts = _result_layouts(builder, node.meta["val"])
    true_gm, true_name = _subgraph(builder, true_attr)
    false_gm, false_name = _subgraph(builder, false_attr)
    true_program = nested_program(builder, true_gm, true_name, layouts)
    false_program = nested_program(builder, false_gm, false_name, layouts)
    _same_inputs(true_program, false_program)
    fakes = _result_fakes(node, layouts)
    values = _operands(builder, builder.value(operands), true_program.inputs, "torch.cond")
    outputs = _results(builder, fakes)
    builder.emit(Comment(f"{node.name}: {node.target}"))
    builder.emit(Conditional(predicate, values, true_program, false_program, outputs))
    for buf in outputs:
        builder.bind_layout(buf)
    builder.define(node, outputs)


def _while_loop(builder, node: torch.fx.Node) -> None:
    cond_attr, body_attr, carried, additional = node.args[:4]
    if len(node.args) > 4:
        raise NotExpressible(f"while_loop with {len(node.args)} positional arguments")
    _result_layouts(builder, node.meta["val"])  # every result a dense tensor
    cond_gm, cond_name = _subgraph(builder, cond_attr)
    body_gm, body_name = _subgraph(builder, body_attr)
    placeholders = [n for n in body_gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("val") for n in placeholders[:len(carried)]]
    if not all(isinstance(f, torch.Tensor) for f in fakes):
        raise NotExpressible("a carried value is not a tensor (a Python int counter)")
    # each iteration's results are the next one's inputs: the body returns them in the
    # layouts it takes them in
    layouts = [_layout(builder, fake, f"carried{i}") for i, fake in enumerate(fakes)]
    cond_program = nested_program(builder, cond_gm, cond_name, (None,))
    body_program = nested_program(builder, body_gm, body_name, layouts)
    _same_inputs(cond_program, body_program)
    fakes = _result_fakes(node, layouts)
    n = len(carried)
    carried_values = _operands(builder, builder.value(carried), body_program.inputs[:n], "while_loop")
    additional_values = _operands(builder, builder.value(additional), body_program.inputs[n:], "while_loop")
    outputs = _results(builder, fakes)
    builder.emit(Comment(f"{node.name}: {node.target}"))
    builder.emit(WhileLoop(carried_values, additional_values, cond_program, body_program, outputs,
                           tuple(sorted(node.kwargs.items()))))
    for buf in outputs:
        builder.bind_layout(buf)
    builder.define(node, outputs)
