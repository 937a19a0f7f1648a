"""fxwrap's stages, declared: ``default_pipeline()`` is the list every target starts from.

    capture         dynamo graph -> ATen graphs (core.capture: decompositions, AOTAutograd)
    aten passes     the ATen graph rewritten in place (core.passes.default_aten_passes)
    program cache   a program compiled before for the same graph: the run ends with it
    lowering        ATen graph -> LoweredProgram (lowerer.Lowerer through the session's rules)
    render          LoweredProgram -> BuiltProgram (render.Renderer: fuse, combine, kernels, legalize,
                    emit, compile, choose); a kernel the target cannot render: its ATen nodes
                    become extern calls and the run goes back to ``lowering``
    wrapper passes  lines -> lines and the memory plan (core.passes.default_wrapper_passes)
    fx              lines -> torch.fx.GraphModule (fx.to_graph_module)
    program         the Program and its runner (the ``ProgramAssembler`` the caller hands down)

A target without kernels (or ``kernels=False``) lowers every node to an extern call and
``render`` keeps the lowerer's lines.  Nested programs (a ``torch.cond`` branch, a loop body)
run ``lowering`` through ``render`` of the same pipeline (``build.build_kernel_program``).
"""
from __future__ import annotations

from fxwrap.core import logs
from fxwrap.core.capture import capture_backend
from fxwrap.core.memory import describe_plan
from fxwrap.core.passes import WrapperProgram, default_aten_passes, default_wrapper_passes, run_wrapper_passes
from fxwrap.core.pipeline import (ATEN_PASSES, CAPTURE, DYNAMO_GRAPH, FX, LOWERING, PROGRAM, PROGRAM_CACHE, RENDER,
                                  WRAPPER_PASSES, Compilation, Pipeline, RunAgain, Stage)
from fxwrap.wrapper_ir.build import kernel_lowerer, lines_program, plain_lowerer, top_settings, with_externs
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.wrapper_ir.render import Renderer, RenderFailed


def _capture(compile_graph, session):
    """The dynamo backend: the session's decompositions, AOTAutograd (its partition option)."""
    return capture_backend(compile_graph, session.decompositions(), session.options.partition)


def _aten_passes(compilation: Compilation, stage: Stage):
    for p in stage.passes:
        with compilation.timer.phase(p.phase):
            p.run(compilation.graph)
    return compilation.graph


def _program_cache(compilation: Compilation, stage: Stage):
    return None if compilation.assembly is None else compilation.assembly.cached(compilation)


def _lowering(compilation: Compilation, stage: Stage):
    graph, session = compilation.graph, compilation.session
    settings = compilation.settings if compilation.settings is not None else top_settings(session)
    with compilation.timer.phase("lowering"):
        if graph.makes_kernels:
            return kernel_lowerer(graph.gm, session, settings).lower()
        return plain_lowerer(graph.gm, settings).lower()


def _render(compilation: Compilation, stage: Stage):
    lowered = compilation.lowered
    if not compilation.graph.makes_kernels:
        return lines_program(lowered)
    try:
        return Renderer(lowered, compilation.session, compilation.timer, compilation.label).render()
    except RenderFailed as failed:
        compilation.settings = with_externs(compilation.graph.gm, lowered.settings, failed, compilation.session)
        raise RunAgain(LOWERING, f"{', '.join(failed.nodes)} become extern calls") from None


def _wrapper_passes(compilation: Compilation, stage: Stage):
    built = compilation.built
    lines, plan = run_wrapper_passes(stage.passes, built.lines,
                                     WrapperProgram(built.hints, compilation.session.options.reuse), compilation.timer)
    if logs.enabled("memory"):
        logs.logger("memory").debug("%s: %s", compilation.label, describe_plan(plan, built.hints))
    return lines, plan


def _fx(compilation: Compilation, stage: Stage):
    built = compilation.built
    with compilation.timer.phase("fx"):
        return to_graph_module(built.inputs, compilation.lines, built.constants, built.fake_values,
                               size_assumptions=built.size_assumptions)


def _program(compilation: Compilation, stage: Stage):
    if compilation.assembly is None:
        raise ValueError(f"{compilation.label}: stage {PROGRAM!r} needs a ProgramAssembler in the Compilation "
                         "(fxwrap.api.compile_aten_graph hands one down); run the pipeline with last='fx' for "
                         "the GraphModule alone")
    return compilation.assembly.assemble(compilation)


def default_pipeline() -> Pipeline:
    """fxwrap's stages, before any plugin edits them (see the module docstring)."""
    return Pipeline([
        Stage(CAPTURE, _capture, (DYNAMO_GRAPH,), ("graph",), steps=("decompose", "AOTAutograd")),
        Stage(ATEN_PASSES, _aten_passes, ("graph",), ("graph",), passes=default_aten_passes()),
        Stage(PROGRAM_CACHE, _program_cache, ("graph",), ("program",), steps=("a hit ends the run",)),
        Stage(LOWERING, _lowering, ("graph",), ("lowered",), steps=("Lowerer", "rules")),
        Stage(RENDER, _render, ("lowered",), ("built",),
              steps=("fuse", "combine", "kernels", "legalize", "emit", "compile", "choose")),
        Stage(WRAPPER_PASSES, _wrapper_passes, ("built",), ("lines", "memory"), passes=default_wrapper_passes()),
        Stage(FX, _fx, ("built", "lines"), ("graph_module",), steps=("GraphModule",)),
        Stage(PROGRAM, _program, ("graph", "built", "lines", "memory", "graph_module"), ("program",),
              steps=("Program", "runner", "cache store", "dump")),
    ])
