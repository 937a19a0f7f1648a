"""The compile as data: the stages from a dynamo graph to the finished program, in one list.

Each ``Stage`` names what it reads of a ``Compilation`` (``takes``) and what it sets there
(``gives``); a stage that runs passes holds them (``passes``, a ``PassList`` of
``fxwrap.core.passes``), and the steps it takes inside are named (``steps``).  A target's
list is ``session.pipeline`` (fxwrap's, ``fxwrap.wrapper_ir.stages.default_pipeline``, as
each plugin's ``fxwrap_pipeline`` hook edits it); its ``repr`` is the list::

    >>> from fxwrap.wrapper_ir.stages import default_pipeline
    >>> default_pipeline()
    Pipeline(
      capture         dynamo graph -> graph: decompose, AOTAutograd
      aten passes     graph -> graph: [follow input layouts, constant folding, channels-last convolutions,
                                       matmul padding, convolution bias, patterns, grouped attention]
      program cache   graph -> program: a hit ends the run
      lowering        graph -> lowered: Lowerer, rules
      render          lowered -> built: fuse, combine, kernels, legalize, emit, compile, choose
      wrapper passes  built -> lines, memory: [overlap collectives, memory plan]
      fx              built, lines -> graph_module: GraphModule
      program         graph, built, lines, memory, graph_module -> program: Program, runner, cache store, dump
    )

``Backend`` runs ``capture`` (``Pipeline.capture``): AOTAutograd hands it every ATen graph,
and ``api.compile_aten_graph`` runs the rest on it (``Pipeline.run``).  A plugin inserts,
replaces or removes a stage or a pass at a named point::

    @fxwrap.hookimpl
    def fxwrap_pipeline(pipeline, target, options):
        pipeline.insert_after("matmul padding", GraphPass("fold my ops", fold_my_ops))
        pipeline.insert_before("memory plan", LinesPass("my pass", my_pass))
        pipeline.insert_after("render", Stage("count kernels", count, ("built",), ("built",)))

A stage may give the program early (the program cache's hit: the stages up to ``program``
are skipped) or run the pipeline again from an earlier stage (it raises ``RunAgain``: a
kernel the target cannot render is lowered again as extern calls).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from fxwrap.core.logs import PhaseTimer
from fxwrap.core.passes import MEMORY_PLAN, AtenGraph, GraphPass, LinesPass, PassList

# fxwrap's stages, by name (``fxwrap.wrapper_ir.stages`` declares them)
CAPTURE = "capture"
ATEN_PASSES = "aten passes"
PROGRAM_CACHE = "program cache"
LOWERING = "lowering"
RENDER = "render"
WRAPPER_PASSES = "wrapper passes"
FX = "fx"
PROGRAM = "program"

#: what a pipeline starts from (capture's input): the one name no stage gives
DYNAMO_GRAPH = "dynamo graph"


class ProgramAssembler(Protocol):
    """What the stages ``program cache`` and ``program`` ask of the layer above the compiler
    (``fxwrap.programs.assembly.ProgramAssembly``), handed down in the ``Compilation``."""

    def cached(self, compilation: "Compilation") -> Any | None:
        """The program the cache holds for the compilation's graph (after its ATen passes), or None."""

    def assemble(self, compilation: "Compilation") -> Any:
        """The finished ``Program`` of the compilation's lines and GraphModule."""


@dataclass
class Compilation:
    """One ATen graph on its way through the stages: what each stage gives, by name.

    ``graph``: the ``AtenGraph`` (its ``gm``, ``kind``, ``session`` ...); ``timer`` times the
    phases; ``label`` names the program in logs; ``assembly``: the ``ProgramAssembler``
    (None: the run stops before ``program``); ``settings``: how it is lowered
    (``wrapper_ir.lowered.LoweringSettings``; None: the top program's).  The stages fill
    ``program`` (a hit of the program cache), ``lowered``, ``built``, ``lines``, ``memory``,
    ``graph_module`` and ``program``."""

    graph: AtenGraph
    timer: PhaseTimer
    label: str = "program"
    assembly: ProgramAssembler | None = None
    settings: Any = None
    lowered: Any = None
    built: Any = None
    lines: list | None = None
    memory: Any = None
    graph_module: Any = None
    program: Any = None

    @property
    def session(self):
        return self.graph.session


@dataclass(frozen=True)
class Stage:
    """One stage: ``run(compilation, stage)`` returns what it ``gives`` (one value, or a
    tuple of as many as it gives) and reads the ``Compilation`` fields it ``takes``.  A stage
    of passes holds them in ``passes`` (and runs them); ``steps`` names what it does inside.

        Stage("fx", to_fx, takes=("built", "lines"), gives=("graph_module",), steps=("GraphModule",))

    The ``capture`` stage alone runs per dynamo graph: ``run(compile_graph, session)``
    returns the dynamo backend that calls ``compile_graph(aten_gm, example_inputs, kind)``
    for every ATen graph (``Pipeline.capture``)."""

    name: str
    run: Callable[..., Any]
    takes: tuple[str, ...]
    gives: tuple[str, ...]
    passes: PassList | None = None
    steps: tuple[str, ...] = ()

    def __post_init__(self):
        if self.passes is not None and not isinstance(self.passes, PassList):
            object.__setattr__(self, "passes", PassList(self.passes))

    def describe(self) -> str:
        inside = f"[{', '.join(self.passes.names())}]" if self.passes is not None else ", ".join(self.steps)
        return f"{self.name:<15} {', '.join(self.takes)} -> {', '.join(self.gives)}: {inside}"


class RunAgain(Exception):
    """Raised by a stage to run the pipeline again from stage ``stage`` (after it changed
    what that stage reads: the render stage adds extern nodes to ``compilation.settings``)."""

    def __init__(self, stage: str, why: str = ""):
        super().__init__(f"run again from stage {stage!r}: {why}")
        self.stage = stage


@dataclass
class Pipeline:
    """fxwrap's stages of one target, in order (see the module docstring)."""

    stages: list[Stage] = field(default_factory=list)

    # -- finding -----------------------------------------------------------------------
    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage named {name!r}; the stages are {[s.name for s in self.stages]}")

    def _holding(self, name: str) -> Stage | None:
        """The stage whose passes include pass ``name``, or None."""
        return next((s for s in self.stages if s.passes is not None and name in s.passes.names()), None)

    @property
    def aten(self) -> PassList:
        """The ATen-graph passes (the ``aten passes`` stage's list)."""
        return self.stage(ATEN_PASSES).passes

    @property
    def wrapper(self) -> PassList:
        """The Wrapper-IR passes (the ``wrapper passes`` stage's list)."""
        return self.stage(WRAPPER_PASSES).passes

    # -- editing at named points ---------------------------------------------------------
    def insert_before(self, name: str, new: Stage | GraphPass | LinesPass) -> None:
        """``new`` just before the stage or pass named ``name`` (a stage next to a stage, a
        pass next to a pass)."""
        self._insert(name, new, 0)

    def insert_after(self, name: str, new: Stage | GraphPass | LinesPass) -> None:
        self._insert(name, new, 1)

    def replace(self, name: str, new: Stage | GraphPass | LinesPass) -> None:
        """The stage or pass named ``name`` replaced by ``new``."""
        self._insert(name, new, 1)
        self.remove(name)

    def remove(self, name: str) -> Stage | GraphPass | LinesPass:
        """Take out the stage or pass named ``name`` (and return it)."""
        holder = self._holding(name)
        if holder is not None:
            return holder.passes.remove_named(name)
        removed = self.stage(name)
        self.stages.remove(removed)
        return removed

    def _insert(self, name: str, new, offset: int) -> None:
        if isinstance(new, Stage):
            at = self.stages.index(self.stage(name))
            self.stages.insert(at + offset, new)
            return
        holder = self._holding(name)
        if holder is None:
            raise KeyError(f"no pass named {name!r} to put {new.name!r} next to; the passes "
                           f"are {[(s.name, s.passes.names()) for s in self.stages if s.passes is not None]} "
                           "(a stage goes next to a stage: give a Stage)")
        at = holder.passes.index_of(name)
        holder.passes.insert(at + offset, new)

    # -- checking and running -------------------------------------------------------------
    def names(self) -> tuple:
        """Every stage's name with the names of its passes, in order (the program cache keys on it)."""
        return tuple((s.name, tuple(s.passes.names()) if s.passes is not None else ()) for s in self.stages)

    def copy(self) -> "Pipeline":
        return Pipeline([dataclasses.replace(s, passes=PassList(s.passes)) if s.passes is not None else s
                         for s in self.stages])

    def check(self, target_name: str) -> None:
        """Every entry a ``Stage``, every name once, each stage's ``takes`` given before it,
        the pass lists of the right kind and the Wrapper-IR list keeping the memory plan."""
        given, seen = {DYNAMO_GRAPH}, set()
        for s in self.stages:
            if not isinstance(s, Stage):
                raise TypeError(f"target {target_name!r}: the pipeline holds {s!r}, not a fxwrap.core.pipeline.Stage")
            missing = [t for t in s.takes if t not in given]
            if missing:
                raise ValueError(f"target {target_name!r}: stage {s.name!r} takes {missing}, which no stage "
                                 f"before it gives (the stages: {[x.name for x in self.stages]})")
            given.update(s.gives)
            for name in (s.name, *(s.passes.names() if s.passes is not None else ())):
                if name in seen:
                    raise ValueError(f"target {target_name!r}: the pipeline names {name!r} twice")
                seen.add(name)
        for name, kind in ((ATEN_PASSES, GraphPass), (WRAPPER_PASSES, LinesPass)):
            for p in self.stage(name).passes:
                if not isinstance(p, kind):
                    raise TypeError(f"target {target_name!r}: stage {name!r} holds {p!r}, not a "
                                    f"fxwrap.core.passes.{kind.__name__}")
        if MEMORY_PLAN not in self.wrapper.names():
            raise ValueError(f"target {target_name!r}: the Wrapper-IR pass list {self.wrapper.names()} lacks "
                             f"{MEMORY_PLAN!r} (it gives every program its memory plan; move it, do not remove it)")

    def capture(self, compile_graph: Callable, session) -> Callable:
        """The dynamo backend of stage ``capture``: it calls ``compile_graph(aten_gm,
        example_inputs, kind)`` for each ATen graph (which runs ``run`` on it)."""
        return self.stage(CAPTURE).run(compile_graph, session)

    def run(self, compilation: Compilation, first: str | None = None, last: str | None = None) -> Compilation:
        """Run the stages from ``first`` (default: the one after ``capture``) through ``last``
        (default: the end) on ``compilation``.  A stage before ``program`` that gives the
        program (the program cache's hit) skips the stages up to ``program``; those after it run."""
        names = [s.name for s in self.stages]
        start = names.index(first) if first is not None else names.index(CAPTURE) + 1
        stop = names.index(last) + 1 if last is not None else len(names)
        made = names.index(PROGRAM) if PROGRAM in names else len(names) - 1
        at = start
        while at < stop:
            stage = self.stages[at]
            try:
                given = stage.run(compilation, stage)
            except RunAgain as again:
                at = names.index(again.stage)
                continue
            values = given if len(stage.gives) > 1 else (given,)
            for name, value in zip(stage.gives, values, strict=True):
                setattr(compilation, name, value)
            at = made + 1 if compilation.program is not None and at < made else at + 1
        return compilation

    def __repr__(self) -> str:
        return "Pipeline(\n" + "".join(f"  {s.describe()}\n" for s in self.stages) + ")"
