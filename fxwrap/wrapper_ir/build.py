"""ATen FX graph -> ``BuiltProgram`` (``built.py``): the entry points of the compiler's middle.

``build_kernel_program`` (targets that render kernels) lowers the graph (``lowerer.Lowerer``
with the kernel rules: a frozen ``LoweredProgram``) and renders it (``render.Renderer``);
a kernel the target cannot render makes its ATen nodes extern calls, and the graph is
lowered again.  ``build_lines`` (``kernels=False``) lowers every node to an extern call.
Given the ATen graph of ``lambda x, w: torch.relu(x @ w)``::

    mm = aten.mm.default(arg0_1, arg1_1)
    relu = aten.relu.default(mm)
    return (relu,)

``build_lines`` gives::

    buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
    # mm (model.py:3 in f)
    aten.mm.out(arg0, arg1, out=buf0)
    # relu (model.py:3 in f)
    buf1 = aten.relu.default(buf0)
    return (buf1,)

and ``build_kernel_program`` (target ``reference``)::

    buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
    # mm (model.py:3 in f)
    aten.mm.out(arg0, arg1, out=buf0)
    buf1 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
    # kernel fxwrap_pointwise_0 (reference): buf0:input, buf1:output
    # relu (model.py:3 in f)
    fxwrap_pointwise_0(buf0, buf1)
    return (buf1,)

The Wrapper-IR passes come after (``core.passes``: collectives overlapped, frees and reuse).
"""
from __future__ import annotations

import dataclasses
import logging

import sympy
import torch

from fxwrap.core import logs
from fxwrap.core.errors import compiler_crashed
from fxwrap.core.passes import AtenGraph, default_wrapper_passes
from fxwrap.core.pipeline import LOWERING, RENDER, Compilation
from fxwrap.ir.lines import Line, SizeInput
from fxwrap.wrapper_ir.built import BuiltProgram
from fxwrap.wrapper_ir.lowered import LoweredProgram, LoweringSettings
from fxwrap.wrapper_ir.lowerer import Lowerer, UnsupportedNode
from fxwrap.wrapper_ir.render import RenderFailed
from fxwrap.wrapper_ir.rule_lowering import RuleLowering

__all__ = ["BuiltProgram", "UnsupportedNode", "build_kernel_program", "build_lines", "kernel_lowerer", "lines_program",
           "plain_lowerer", "top_settings", "with_externs"]

log = logging.getLogger("fxwrap.schedule")


def kernel_lowerer(gm: torch.fx.GraphModule, session, settings: LoweringSettings | None = None) -> Lowerer:
    """A ``Lowerer`` of ``gm`` with the session's rules (its nested programs built by
    ``build_kernel_program``); ``settings`` default: the top program's."""
    settings = settings if settings is not None else top_settings(session)

    def compile_subprogram(sub_gm, sub_settings):
        return build_kernel_program(sub_gm, session, settings=sub_settings)

    return Lowerer(gm, settings, compile_subprogram, lambda lowerer: RuleLowering(lowerer, session))


def plain_lowerer(gm: torch.fx.GraphModule, settings: LoweringSettings) -> Lowerer:
    """A ``Lowerer`` of ``gm`` without rules: every op an extern call or a view (its nested
    programs built by ``build_lines``)."""

    def compile_subprogram(sub_gm, sub_settings):
        return build_lines(sub_gm, settings=sub_settings)

    return Lowerer(gm, settings, compile_subprogram)


def build_kernel_program(gm: torch.fx.GraphModule, session, timer: logs.PhaseTimer | None = None,
                         label: str = "program", settings: LoweringSettings | None = None) -> BuiltProgram:
    """Lower ``gm`` through the session's rules and render it: the stages ``lowering``
    through ``render`` of the session's pipeline (``stages.default_pipeline``), which a
    nested program runs as its top program does; a kernel the emitter cannot render
    (``EmitError``) or the host compiler crashes on is rebuilt with its source nodes as
    ATen extern calls (``with_externs``), until every kernel renders."""
    compilation = Compilation(AtenGraph(gm, "nested", session), timer if timer is not None else logs.PhaseTimer(label),
                              label, settings=settings)
    return session.pipeline.run(compilation, first=LOWERING, last=RENDER).built


def with_externs(gm: torch.fx.GraphModule, settings: LoweringSettings, failed: RenderFailed,
                 session) -> LoweringSettings:
    """``settings`` with the ATen nodes of the kernel that ``failed`` to render kept as
    extern calls (logged); ``failed.error`` raised again when there is none to add."""
    extern = set(settings.extern_nodes)
    new = set(failed.nodes) - extern
    if not new:
        # the kernel is named by nodes that are externs already: it copies one
        # for a node that writes into the copy (scatter_add of a zeros extern)
        new = {user.name for node in gm.graph.nodes if node.name in failed.nodes
               for user in node.users if user.op == "call_function"} - extern
    if not new:
        raise failed.error
    what = "its compiler crashed on" if compiler_crashed(failed.error) else "cannot render"
    (log.warning if compiler_crashed(failed.error) else logs.logger("schedule").info)(
        "fxwrap: target %s %s the kernel of %s (%s); they run as ATen extern calls",
        session.target.name, what, ", ".join(sorted(new)), str(failed.error).splitlines()[0])
    return dataclasses.replace(settings, extern_nodes=frozenset(extern | new))


def top_settings(session) -> LoweringSettings:
    """How the session lowers a top program (its memory plan's reuse, its wrapper passes)."""
    return LoweringSettings(session.target.name, reuse=session.options.reuse,
                            wrapper_passes=tuple(session.lines_passes))


def build_lines(gm: torch.fx.GraphModule, target_name: str = "cpu", reuse: bool = True,
                wrapper_passes=(), settings: LoweringSettings | None = None) -> BuiltProgram:
    """Lines for an ATen graph; every op an extern call or a view (see module doc).
    ``reuse`` and ``wrapper_passes`` (``core.passes.LinesPass``; default: fxwrap's
    ``default_wrapper_passes``): how the nested programs of control-flow ops are planned,
    as the caller plans the top program."""
    if settings is None:
        settings = LoweringSettings(target_name, reuse=reuse,
                                    wrapper_passes=tuple(wrapper_passes) or tuple(default_wrapper_passes()))
    return lines_program(plain_lowerer(gm, settings).lower())


def lines_program(lowered: LoweredProgram) -> BuiltProgram:
    """The ``BuiltProgram`` of a graph lowered without rules: its items are lines already."""
    lines = list(lowered.items)
    _check_symbols_defined(lowered.inputs, lines, lowered.settings.target_name)
    return BuiltProgram(list(lowered.inputs), lines, dict(lowered.constants), dict(lowered.fake_values),
                        dict(lowered.symbol_hints), size_assumptions=list(lowered.size_assumptions))


def _check_symbols_defined(inputs, lines: list[Line], target_name: str) -> None:
    """Every size symbol a line uses is a program input or defined by an earlier line."""
    defined = {i.name for i in inputs if isinstance(i, SizeInput)}
    for line in lines:
        for expr in line.size_exprs():
            missing = sorted(s.name for s in sympy.sympify(expr).free_symbols if s.name not in defined)
            if missing:
                raise UnsupportedNode(
                    f"size symbol(s) {missing} used by {line!r} have no value in the program: "
                    f"they are neither inputs nor sizes of an input tensor (target {target_name})")
        defined.update(line.defines_values())
        defined.update(s.name for s in line.defines_symbols())
