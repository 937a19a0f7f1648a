"""Precompiled functions: a new process runs a model with no dynamo trace, no AOTAutograd and
no lowering, through torch's AOT precompile (``torch._dynamo.aot_compile``, where ``torch.compile``'s result has ``.aot_compile``: 2.13, not 2.11).

    compiled = fxwrap.aot_compile(model, (x,))            # traces (fullgraph) and compiles now
    compiled.save("model.fxaot")                           # dynamo's guards + bytecode + fxwrap's programs
    # another process (any cache directory, empty or not):
    loaded = fxwrap.load_compiled("model.fxaot", model)    # no dynamo trace, no AOTAutograd, no lowering
    loaded(x)                                              # what model(x) returns

The same works straight through torch (the fxwrap backend answers torch's precompile with a
serializable result)::

    fn = torch.compile(model.forward, backend="fxwrap", fullgraph=True).aot_compile(((x,), {}))
    fn.save_compiled_function("model.fxaot")
    fn = torch.compiler.load_compiled_function(open("model.fxaot", "rb")); fn(model, x)

torch's precompile stores dynamo's side (the guards, serialized; the transformed bytecode)
and asks the backend's result for its own bytes (``SerializableCallable``).  fxwrap's
result is a ``PrecompiledGraph``: the warm-start cache's entry for the graph (the AOTAutograd
metadata the replay needs) and its programs, kernels' binaries inside (each emitter's
``saved_loader``), under the header a cache bundle carries (``fxwrap.programs.graph_cache``)::

    PrecompiledGraph bytes = pickle({"header": {fxwrap version and files, torch, Triton, Python,
                                                host CPU, device types},
                                     "target": "cpu", "options": CompileOptions(...),
                                     "graph": <graph entry bytes>, "programs": {<key>: <program entry bytes>},
                                     "launch": <the C launch binding's shared object (cpu), or None>})

Loading checks the header (``fxwrap.CacheBundleError`` names what differs: recompile there),
rebuilds the programs and the replay runner, puts the launch binding into the cache
directory where it lacks one, and compiles nothing.  Only graphs the
warm-start cache can store can be precompiled (plain AOTAutograd wrappers: see
docs/programs.md); another graph is a ``PrecompileError`` naming why, and
``torch.compile(model, backend="fxwrap")`` still compiles it.  A file is a pickle: load only
files you trust.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import replace
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from fxwrap.programs.graph_cache import GraphCompile, check_header, environment_header, replay
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.programs.program_cache import ProgramCache, decode
from fxwrap.targets.host.cache import write_sealed
from fxwrap.targets.host.trampoline import binding_file

#: torch's precompile turns these on around the backend call so that Inductor's AOTAutograd
#: result is cached and bundled; fxwrap's programs are not Inductor's ``OutputCode`` (AOTAutograd
#: would fail to cache them), so fxwrap's own AOTAutograd call runs with them at their defaults.
#: ``force_non_lazy_backward_lowering`` stays on: the backward program compiles now, and the
#: graph's entry (stored once both programs are) goes into the precompiled function
_PRECOMPILE_FLAGS = ("bundled_autograd_cache", "force_autograd_cache", "strict_autograd_cache",
                     "bypass_autograd_cache_key")
#: what this process loaded: "graphs" (PrecompiledGraph results rebuilt from bytes)
stats: dict[str, int] = {"graphs": 0}


class PrecompileError(RuntimeError):
    """A graph fxwrap cannot hand to torch's precompile (not storable by the warm-start cache,
    or the cache is off).  The message names the reason; ``torch.compile`` still compiles it."""


def has_aot_precompile() -> bool:
    """This torch's ``torch.compile`` result has ``.aot_compile`` (torch's AOT precompile of one
    whole graph) and ``torch.compiler.load_compiled_function``: ``fxwrap.aot_compile`` needs both
    (torch 2.11's compiled functions have no ``aot_compile``)."""
    return (hasattr(torch.compiler, "load_compiled_function")
            and hasattr(torch.compile(lambda x: x, backend="eager"), "aot_compile"))


def precompiling() -> bool:
    """Whether this backend call is made by torch's AOT precompile (``aot_compile_fullgraph``
    sets AOTAutograd's bundled, forced cache around it, in torch 2.11 and later)."""
    config = torch._functorch.config
    return bool(getattr(config, "bundled_autograd_cache", False) and getattr(config, "force_autograd_cache", False))


def plain_aot_autograd():
    """A context with the precompile's AOTAutograd cache flags at their defaults."""
    config = torch._functorch.config
    return config.patch({name: False for name in _PRECOMPILE_FLAGS if hasattr(config, name)})


class PrecompiledGraph(SerializableCallable):
    """A dynamo graph compiled by fxwrap, as torch's precompile saves it: called as dynamo
    calls a backend's result (``graph(*graph_inputs)`` -> outputs), and serialized as the
    graph's warm-start entry and program entries (module docstring)::

        PrecompiledGraph(target='cpu', kind='inference', programs=1)
    """

    def __init__(self, runner, state: dict):
        self.runner, self.state = runner, state

    @staticmethod
    def of(warm: GraphCompile, runner, options) -> "PrecompiledGraph":
        """The precompiled form of the graph ``warm`` just compiled (or loaded) to ``runner``."""
        path = warm.path()
        if not path.exists():
            why = warm.refusal or "its programs were not stored"
            raise PrecompileError(f"fxwrap cannot precompile this graph for target {warm.session.target.name!r}: "
                                  f"{why}. torch.compile(model, backend='fxwrap') compiles it (the "
                                  "program cache still serves its programs)")
        graph = path.read_bytes()
        entry = pickle.loads(graph)
        cache = ProgramCache()
        programs = {key: cache.path(key).read_bytes() for key in entry["programs"].values()}
        target = warm.session.target
        binding = binding_file() if entry["device_type"] == "cpu" else None
        state = {"header": environment_header({entry["device_type"]}, {target.name}), "target": target.name,
                 "options": replace(options, on_program=None, target=target.name),
                 "graph": graph, "programs": programs,
                 # the C launch binding of the C++ kernels, built once per host and cache directory
                 "launch": binding.read_bytes() if binding is not None and binding.is_file() else None}
        return PrecompiledGraph(runner, state)

    @classmethod
    def serialize_compile_artifacts(cls, fn: "PrecompiledGraph") -> bytes:
        return pickle.dumps(fn.state, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> "PrecompiledGraph":
        state = pickle.loads(data)
        check_header(state["header"], "this precompiled fxwrap function")
        manager = get_plugin_manager()
        session = manager.session(manager.target(state["target"])).configured(state["options"])
        if state.get("launch") is not None and not (binding := binding_file()).is_file():
            binding.parent.mkdir(parents=True, exist_ok=True)
            write_sealed(binding, state["launch"])  # the header checked the host and Python
        entry = pickle.loads(state["graph"])
        programs = {kind: decode(key, state["programs"][key], session) for kind, key in entry["programs"].items()}
        stats["graphs"] += 1
        return PrecompiledGraph(replay(entry, programs), state)

    def __call__(self, *args: Any) -> Any:
        return self.runner(*args)

    def __repr__(self) -> str:
        entry = pickle.loads(self.state["graph"])
        return (f"PrecompiledGraph(target={self.state['target']!r}, kind={entry['kind']!r}, "
                f"programs={len(entry['programs'])})")


class CompiledFunction:
    """What ``fxwrap.aot_compile`` returns and ``fxwrap.load_compiled`` loads: torch's
    precompiled function (``AOTCompiledFunction``) and the module it calls, if any::

        compiled = fxwrap.aot_compile(model, (x,)); compiled(x); compiled.save("model.fxaot")
    """

    def __init__(self, function, module: torch.nn.Module | None = None):
        self.function, self.module = function, module

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def save(self, path: str | os.PathLike) -> None:
        """Write the precompiled function to ``path`` (``fxwrap.load_compiled`` reads it)."""
        self.function.save_compiled_function(os.fspath(path), external_data=module_references(self.module))


def calling(module: torch.nn.Module):
    """A function that calls ``module`` (hooks included), for dynamo to trace: the module is
    a variable of its closure, which torch saves as a reference (``module_references``)."""
    def call_module(*args, **kwargs):
        return module(*args, **kwargs)
    return call_module


def module_references(module: torch.nn.Module | None) -> dict[str, torch.nn.Module]:
    """The module and its submodules by name (``"module"``, ``"module.0"``, ...): dynamo's
    saved bytecode may refer to them, and torch saves a module only as such a reference
    (``external_data``), given again at load."""
    if module is None:
        return {}
    return {f"module.{name}" if name else "module": sub for name, sub in module.named_modules(remove_duplicate=False)}
