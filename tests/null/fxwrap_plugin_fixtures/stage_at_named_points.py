"""Extends target ``cpu``'s pipeline at named points through the one hook
(``fxwrap_pipeline``): a stage after ``render``, a stage replacing ``fx`` (it calls fxwrap's),
a stage after ``program``, an ATen-graph pass after ``matmul padding`` and a Wrapper-IR pass
before ``memory plan``.
Each records, when it runs, what the stages before it gave."""
from fxwrap import hookimpl
from fxwrap.core.passes import GraphPass, LinesPass
from fxwrap.core.pipeline import Stage
from fxwrap.ir.lines import Free

seen = []  # (what ran, what it saw), in the order they ran


def after_render(compilation, stage):
    seen.append((stage.name, compilation.lowered is not None, compilation.built is not None,
                 compilation.lines is None))
    return compilation.built


def after_program(compilation, stage):
    seen.append((stage.name, compilation.program.kind))
    return compilation.program


def after_padding(graph):
    seen.append(("after padding", graph.kind))


def before_plan(lines, program):
    seen.append(("before plan", sum(isinstance(line, Free) for line in lines), program.memory is None))
    return lines


@hookimpl
def fxwrap_pipeline(pipeline, target, options):
    if target.name != "cpu":
        return
    pipeline.insert_after("render", Stage("count kernels", after_render, ("lowered", "built"), ("built",)))
    fxwrap_fx = pipeline.stage("fx")

    def fx_recorded(compilation, stage):
        seen.append(("fx replaced", compilation.memory is not None))
        return fxwrap_fx.run(compilation, stage)

    pipeline.replace("fx", Stage("fx", fx_recorded, fxwrap_fx.takes, fxwrap_fx.gives, steps=("recorded",)))
    pipeline.insert_after("program", Stage("after program", after_program, ("program",), ("program",)))
    pipeline.insert_after("matmul padding", GraphPass("after padding", after_padding))
    pipeline.insert_before("memory plan", LinesPass("before plan", before_plan))
