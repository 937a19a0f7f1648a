"""The program's life after compilation: one layer, above the compiler and its plugins.

    assembly.py       ProgramAssembly: the pipeline's "program cache" and "program" stages ask it
    program.py        Program, TrainingPrograms: lines, GraphModule, memory plan, runner
    arguments.py      ArgumentMap, OutputMap: a lowered function's arguments and return value
    artifacts.py      program.save(path) / fxwrap.load(path): a program as a file
    cache_key.py      KeyHasher: the keys of the two caches below
    program_cache.py  ProgramCache: a compiled program saved across processes, by graph
    graph_cache.py    GraphCompile: the warm-start cache (no AOTAutograd, no lowering on a hit)
    precompile.py     fxwrap.aot_compile / load_compiled: torch's AOT precompile of a graph
    dump.py           ProgramDump: the debug dump of every program (options.debug_dir)

``fxwrap.api`` runs the session's pipeline on a graph with a ``ProgramAssembly`` handed
down in the ``Compilation`` (``fxwrap.core.pipeline``); nothing here is imported by the
compiler (``fxwrap.core``, ``fxwrap.wrapper_ir``, ``fxwrap.targets``, ``fxwrap.plugins``).
"""
