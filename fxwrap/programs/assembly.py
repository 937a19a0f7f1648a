"""What the pipeline hands a compiled graph to: the program cache, the ``Program`` record and
its runner, the logs and the debug dump (``fxwrap.core.pipeline.ProgramAssembler``).

``api.compile_aten_graph`` makes one per ATen graph, before the ATen passes run (the debug
dump shows the graph as captured), and puts it in the ``Compilation``; the stage ``program
cache`` asks ``cached`` (after the ATen passes: the key is the rewritten graph) and the
stage ``program`` calls ``assemble``::

    assembly = ProgramAssembly(AtenGraph.of(gm, "inference", session))
    assembly.cached(compilation)     # the program stored for this graph, or None
    assembly.assemble(compilation)   # Program(kind, target, inputs, lines, graph_module, ...)
"""
from __future__ import annotations

from fxwrap.core import logs
from fxwrap.core.capture import aten_graph_text, static_input_indices
from fxwrap.core.passes import AtenGraph
from fxwrap.core.pipeline import Compilation
from fxwrap.programs.dump import ProgramDump, debug_dir
from fxwrap.programs.program import Program, finish_program, log_program
from fxwrap.programs.program_cache import ProgramCache, cache_enabled, program_key


class ProgramAssembly:
    """The program cache, the ``Program`` and the debug dump of one ATen graph ``graph``."""

    def __init__(self, graph: AtenGraph):
        options = graph.session.options
        self.kind = graph.kind
        self.cache = ProgramCache() if cache_enabled(options) else None
        self.static_inputs = static_input_indices(graph.gm, graph.kind)
        self.graph_text = aten_graph_text(graph.gm) if debug_dir(options.debug_dir) is not None else None
        self.key: str | None = None
        self.dump: ProgramDump | None = None

    def cached(self, compilation: Compilation) -> Program | None:
        """The program the cache holds for the graph (after its ATen passes); on a miss the
        debug dump starts (None unless one was asked for)."""
        graph, session = compilation.graph, compilation.session
        if self.cache is not None:
            saved = graph.saved_outputs
            # which forward outputs keep the channels-last layout is no part of the graph's text
            key_kind = self.kind if saved is None else f"{self.kind} saving {saved.start}:{saved.stop}"
            self.key = program_key(graph.gm, session, key_kind)
            program = self.cache.load(self.key, session, self.static_inputs)
            if program is not None:
                program.cache_key = self.key
                log_program(program, f" (from the program cache, entry {self.cache.path(self.key)})")
                return program
        self.dump = ProgramDump.start(session.options.debug_dir, graph.gm, self.kind, self.graph_text)
        return None

    def assemble(self, compilation: Compilation) -> Program:
        """The ``Program`` of the compilation's lines, GraphModule and memory plan, with its
        runner; logged, dumped and stored in the cache."""
        built, session, timer = compilation.built, compilation.session, compilation.timer
        with timer.phase("wrapper"):
            program = finish_program(Program(self.kind, session.target, built.inputs, compilation.lines,
                                             compilation.graph_module, compilation.memory, None, built.constants,
                                             built.hints, static_inputs=self.static_inputs), session)
        log_program(program, "")
        if logs.enabled("timing"):
            logs.logger("timing").debug("%s", timer.summary())
        if self.dump is not None:
            self.dump.write(program, built, timer)
        if self.cache is not None:
            self.cache.store(self.key, program)
            program.cache_key = self.key
        return program
