"""Control flow in the Wrapper IR: lines that run nested programs.

``torch.cond`` and ``while_loop`` reach fxwrap as higher-order ops whose branches and
bodies are ATen subgraphs.  Each subgraph is compiled on its own, by the same builder,
scheduler and memory planner as the program around it, into a ``NestedProgram``
(its own kernels, extern calls, allocations and frees), and the parent holds it in a
``Conditional`` or ``WhileLoop`` line.  ``program.code()`` prints the nested programs
as indented blocks under the line::

    # cond: cond
    (buf3,) = cond(buf1, (arg0, arg1))
        def true_graph_0(arg0, arg1):
            buf0 = empty_strided((4, 3), (3, 1), dtype=torch.float32, device='cpu')
            # kernel fxwrap_true_graph_0_pointwise_0 (cpu): arg0:input, arg1:input, buf0:output
            fxwrap_true_graph_0_pointwise_0(arg0, arg1, buf0)
            return (buf0,)
        def false_graph_0(arg0, arg1):
            ...

In FX each nested program is a GraphModule of its own (kernel launches, ``free``
calls, its own input check), a submodule of the parent read with ``get_attr`` and
passed to ``torch.ops.higher_order.cond`` / ``while_loop``, so the parent still runs,
and pickles, through the higher-order op.

This module is data, like ``lines``: the printer and the FX converter are passed in.
"""
from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.ir.lines import Buffer, Line, SizeInput, _exprs_in, buffers_in


@dataclass(frozen=True, eq=False)
class NestedProgram:
    """One branch or loop body, compiled: ``name`` (the subgraph's attribute name,
    ``true_graph_0``), its ``inputs`` (buffers and size symbols, in the higher-order op's
    operand order), its planned ``lines`` (ending in a ``Return``), the ``constants`` and
    ``fake_values`` its FX form needs, and ``peak_bytes``, its own memory plan's peak.

    Prints as ``def true_graph_0(arg0, arg1): ...`` under the line that runs it.
    """

    name: str
    inputs: tuple[Buffer | SizeInput, ...]
    lines: tuple[Line, ...]
    constants: Mapping[str, Any] = field(default_factory=dict)
    fake_values: Mapping[str, Any] = field(default_factory=dict)
    peak_bytes: int = 0

    def kernels(self) -> list:
        """Every kernel this program launches, its nested programs' included, in order."""
        found = []
        for line in self.lines:
            if line.kernel is not None and line.kernel not in found:
                found.append(line.kernel)
            for program in line.programs:
                found += [k for k in program.kernels() if k not in found]
        return found


class _NestedLine(Line):
    """What ``Conditional`` and ``WhileLoop`` share: operands read, fresh outputs defined."""

    outputs: tuple
    operands: tuple

    #: the host reads a device value to decide which program runs (a CUDA graph cannot)
    def host_readback(self):
        return f"{self.label} reads its predicate back to the CPU to choose what runs"

    @property
    def programs(self) -> tuple[NestedProgram, ...]:
        raise NotImplementedError

    def reads(self):
        return buffers_in(self.operands)

    def writes(self):
        return [b for b in self.outputs if isinstance(b, Buffer)]

    def defines(self):
        return [b for b in self.outputs if isinstance(b, Buffer)]

    def size_exprs(self):
        return _exprs_in(self.operands)

    def _outputs_text(self, printer) -> str:
        return printer.fmt(tuple(self.outputs))

    def _blocks(self, printer) -> str:
        return "".join("\n" + _indent(printer.nested(p)) for p in self.programs)

    def _bind_outputs(self, converter, node) -> None:
        for i, buf in enumerate(self.outputs):
            if isinstance(buf, Buffer):
                converter.bind(buf, converter.add(operator.getitem, (node, i), name=buf.name, buf=buf))


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else line for line in text.rstrip("\n").split("\n"))


@dataclass(frozen=True)
class Conditional(_NestedLine):
    """``torch.cond``: run ``true_program`` or ``false_program`` on ``operands`` as the
    0-dim bool ``predicate`` says; ``outputs`` are the chosen program's results, fresh
    buffers of exactly their layouts in both programs (no alias of an operand)::

        (buf3, buf4) = cond(buf1, (arg0, arg1, s0))
            def true_graph_0(arg0, arg1, s0):
                ...
                return (buf2, buf5)
            def false_graph_0(arg0, arg1, s0):
                ...

    FX: ``torch.ops.higher_order.cond(buf1, true_graph_0, false_graph_0, (arg0, arg1, s0))``
    with both programs ``get_attr`` submodules, then one ``getitem`` per output.
    """

    predicate: Buffer
    operands: tuple
    true_program: NestedProgram
    false_program: NestedProgram
    outputs: tuple

    @property
    def label(self):
        return "torch.cond"

    @property
    def programs(self):
        return (self.true_program, self.false_program)

    def reads(self):
        return [self.predicate, *buffers_in(self.operands)]

    def to_source(self, printer: LinePrinter):
        return (f"{self._outputs_text(printer)} = cond({self.predicate.name}, "
                f"{printer.fmt(tuple(self.operands))})" + self._blocks(printer))

    def to_fx(self, converter: LineConverter):
        true_gm = converter.subprogram(self.true_program)
        false_gm = converter.subprogram(self.false_program)
        node = converter.add(torch.ops.higher_order.cond,
                             (converter.node(self.predicate), true_gm, false_gm,
                              converter.arg(tuple(self.operands))), name="cond")
        self._bind_outputs(converter, node)


@dataclass(frozen=True)
class WhileLoop(_NestedLine):
    """``while_loop``: while ``cond_program(*carried, *additional)`` is true,
    ``carried = body_program(*carried, *additional)``; ``outputs`` are the last carried
    values.  The body returns each carried value in exactly the layout it takes it in,
    so one iteration's results are the next one's inputs as they are (no copy); with no
    iteration the op returns clones of the inputs::

        (buf2, buf3) = while_loop((buf1, arg0), (arg1,))
            def while_loop_cond_graph_0(arg0, arg1, arg2):
                ...
                return buf0
            def while_loop_body_graph_0(arg0, arg1, arg2):
                ...
                return (buf0, buf4)

    FX: ``torch.ops.higher_order.while_loop(cond_graph, body_graph, (buf1, arg0), (arg1,))``
    with both programs ``get_attr`` submodules, then one ``getitem`` per output.
    """

    carried: tuple
    additional: tuple
    cond_program: NestedProgram
    body_program: NestedProgram
    outputs: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self):
        return "while_loop"

    @property
    def may_return_alias(self):
        """With no iteration the op returns the carried inputs (torch 2.13 clones them; older
        releases may return them as they are): their storage is never handed on after the line."""
        return True

    @property
    def operands(self):
        return (*self.carried, *self.additional)

    @property
    def programs(self):
        return (self.cond_program, self.body_program)

    def to_source(self, printer: LinePrinter):
        extra = "".join(f", {k}={printer.fmt(v)}" for k, v in self.kwargs)
        return (f"{self._outputs_text(printer)} = while_loop({printer.fmt(tuple(self.carried))}, "
                f"{printer.fmt(tuple(self.additional))}{extra})" + self._blocks(printer))

    def to_fx(self, converter: LineConverter):
        cond_gm = converter.subprogram(self.cond_program)
        body_gm = converter.subprogram(self.body_program)
        node = converter.add(torch.ops.higher_order.while_loop,
                             (cond_gm, body_gm, converter.arg(tuple(self.carried)),
                              converter.arg(tuple(self.additional))), dict(self.kwargs), name="while_loop")
        self._bind_outputs(converter, node)
