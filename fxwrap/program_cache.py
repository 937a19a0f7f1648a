"""The whole-program cache: an ATen graph compiled once is loaded, not lowered, next time.

``compile_aten_graph`` (where an ATen graph becomes a ``Program``) asks the cache first.
An entry is the whole compiled program -- Wrapper IR lines, memory plan, GraphModule,
kernels with their binaries (the loaders ``program.save`` stores), constants -- pickled
under a key of everything the program depends on::

    FXWRAP_CACHE_DIR/programs/3f/3f2a...e1.pkl       (default ~/.cache/fxwrap, beside the kernel cache)

    key = sha256(the ATen graph's code; every node's meta["val"] (sizes, strides, storage
                 offsets, dtypes, devices; symbolic ones as expressions) and the shape
                 environment's guards, ranges and hints; the tensors of its get_attr
                 constants, by value; the program kind (inference/forward/backward);
                 the user Triton kernels it launches (sources, by Triton's cache_key;
                 configs; constant arguments); the compile options; the target's name,
                 device type, options and device capabilities; the host CPU; the loaded
                 plugins; $CXX and FXWRAP_* settings; torch.use_deterministic_algorithms
                 (the Triton target keeps long-row scans in a fixed combine order under it);
                 the versions of Python, torch, Triton and fxwrap, and the hash of every
                 file of the fxwrap package, so an edited checkout misses)

Dynamo and AOTAutograd still run (they make the ATen graph the key is taken from);
lowering, scheduling, code generation and the kernels' compiles are what a hit skips.
Entries are written to a temporary file and ``os.replace``d (atomic: concurrent
processes see a whole entry or none; the last writer of a key wins, with the same
contents); an entry that cannot be read is ignored (and rewritten).  Off with
``options={"cache": False}`` or ``FXWRAP_PROGRAM_CACHE=0``.  ``FXWRAP_RETUNE=1`` (measure the
template choices again, ``fxwrap.core.templates``) reads no entry and writes every program it
compiles under the key it has without that setting.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import sys
import types
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

from fxwrap.artifacts import FORMAT_VERSION, SavingPickler, fxwrap_version, pickled, triton_version
from fxwrap.core import logs
from fxwrap.core.templates import RETUNE_ENV, retune_requested
from fxwrap.program import Program, finish_program
from fxwrap.runtime.graph_records import kernels_of
from fxwrap.targets.host.cache import default_cache_dir, write_atomically
from fxwrap.targets.host.compiler import host_fingerprint
from fxwrap.wrapper_ir.build_user_kernels import user_kernel_key

log = logs.logger("cache")  # FXWRAP_LOG=cache shows the hits and misses

ENV_SWITCH = "FXWRAP_PROGRAM_CACHE"
# settings that change where files go or what is printed, not what is compiled; FXWRAP_RETUNE
# (measure the template choices again) compiles what the key names, and its programs replace
# the entries under that key
_ENV_IGNORED = frozenset({"FXWRAP_CACHE_DIR", "FXWRAP_LOG", ENV_SWITCH, RETUNE_ENV})


def cache_enabled(options) -> bool:
    """The ``cache`` option and ``FXWRAP_PROGRAM_CACHE`` (``0``/``false``/``off``: off)."""
    if not options.cache:
        return False
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    return default_cache_dir() / "programs"


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """sha256 of every file of the fxwrap package (sources, the Metal shim headers)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


#: a plugin's package larger than this is keyed by the plugin module's own file only
PLUGIN_FILES_MAX = 500


def plugin_digest(plugins) -> str:
    """sha256 of the sources of every plugin object in ``plugins`` (what a plugin manager
    registered: ``CompileSession.plugins.plugin_objects``) outside fxwrap (its module's
    package directory, ``*.py``): a vendor editing its lowering rules or passes misses the
    cache, instead of running programs compiled with the old ones."""
    files: set[Path] = set()
    for plugin in plugins:
        name = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if not name or name == "fxwrap" or name.startswith("fxwrap.") or path is None:
            continue  # fxwrap's own files are in package_digest
        path = Path(path).resolve()
        package = path.parent if "." in name or path.name == "__init__.py" else None
        found = sorted(package.rglob("*.py")) if package is not None else [path]
        files.update(found if len(found) <= PLUGIN_FILES_MAX else [path])
    h = hashlib.sha256()
    for path in sorted(files):
        if "__pycache__" not in path.parts and path.is_file():
            h.update(str(path).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _describe(value) -> object:
    """A node's ``meta["val"]`` as comparable text: layout of tensors, expressions of SymInts."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(str(s) for s in value.shape), tuple(str(s) for s in value.stride()),
                str(value.storage_offset()), str(value.dtype), str(value.device), value.requires_grad)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(value))
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a real constant of the graph (``torch.tensor([...])`` in the user's
    code).  The key is computed while AOTAutograd's fake mode is active, which would take
    the constant for a tensor it forgot to fake: the copy runs with it unset."""
    if is_fake(t):  # no bytes to read: its description (layout, dtype) is in the key
        return b"fake"
    with unset_fake_temporarily():
        t = t.detach().to("cpu").contiguous()
        return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _shape_env_state(gm: torch.fx.GraphModule) -> object:
    for node in gm.graph.nodes:
        fake_mode = getattr(node.meta.get("val"), "fake_mode", None)
        env = getattr(fake_mode, "shape_env", None)
        if env is not None:
            return (sorted(str(g.expr) for g in env.guards),
                    sorted((str(k), str(v)) for k, v in env.var_to_range.items()),
                    # the example sizes (hints); backed_var_to_val from torch 2.13, var_to_val before
                    sorted((str(k), str(v)) for k, v in
                           (env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val).items()))
    return None


def _options_state(options) -> object:
    from dataclasses import fields
    state = []
    for f in fields(options):
        if f.name in ("on_program", "cache"):
            continue
        value = getattr(options, f.name)
        state.append((f.name, getattr(value, "name", value)))
    return state


def program_key(gm: torch.fx.GraphModule, session, kind: str) -> str:
    """The cache key of compiling ``gm`` (an ATen graph) as a ``kind`` program in ``session``
    (see the module docstring for what it covers)."""
    h = hashlib.sha256()

    def add(value) -> None:
        h.update(repr(value).encode())
        h.update(b"\0")

    target = session.target
    add(("fxwrap program cache", FORMAT_VERSION, kind))
    add(gm.code)
    add(user_kernel_key(gm))  # user Triton kernels: the graph names them by a per-process index
    for node in gm.graph.nodes:
        add((node.op, node.name, _describe(node.meta.get("val"))))
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor):
                add(_describe(value))
                h.update(_tensor_bytes(value))
    add(_shape_env_state(gm))
    add(_options_state(session.options))
    add((target.name, target.device_type, sorted(target.options.items(), key=repr)))
    add(session.capabilities)
    add(host_fingerprint())
    add(session.plugins.plugins)
    add(plugin_digest(session.plugins.plugin_objects))
    add(session.pipeline.names())
    add(("deterministic algorithms", torch.are_deterministic_algorithms_enabled()))
    add(sorted((k, v) for k, v in os.environ.items()
               if (k.startswith("FXWRAP_") and k not in _ENV_IGNORED) or k == "CXX"))
    add((sys.version, platform.machine(), torch.__version__, triton_version(), fxwrap_version(), package_digest()))
    return h.hexdigest()


class ProgramCache:
    """``ProgramCache(root).load(key, session)`` -> a ``Program`` or None; ``store(key, program)``."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pkl"

    def load(self, key: str, session, static_inputs: tuple[int, ...] = ()):
        """The program saved under ``key``, finished for ``session`` (``static_inputs``: the
        positions of the inputs AOTAutograd calls static in this compile), or None."""
        path = self.path(key)
        if retune_requested():
            log.debug("fxwrap program cache: not read (FXWRAP_RETUNE=1: its template choices are measured again); "
                      "compiling %s", path)
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            log.debug("fxwrap program cache: miss %s (%s program), compiling", path, session.target.name)
            return None
        try:
            program = decode(key, data, session, static_inputs)
        except Exception as exc:  # noqa: BLE001 - a bad entry is a miss, never an error
            log.warning("fxwrap program cache: ignoring entry %s (%s: %s); compiling", path, type(exc).__name__, exc)
            return None
        log.debug("fxwrap program cache: hit %s (%s program on %s)", path, program.kind, session.target.name)
        return program

    def store(self, key: str, program) -> None:
        state = {"key": key, "kind": program.kind, "inputs": program.inputs, "lines": program.lines,
                 "graph_module": program.graph_module, "memory": program.memory, "constants": program.constants,
                 "hints": program.hints}
        try:
            # the compile runs under AOTAutograd's fake mode: a constant pickled there keeps
            # no bytes (it loaded as a tensor of null data and the kernel reading it crashed)
            with unset_fake_temporarily():
                data, _ = pickled(state, SavingPickler)
        except Exception as exc:  # noqa: BLE001 - an unpicklable program is compiled every time
            log.info("fxwrap program cache: %s program not cached (%s: %s)", program.kind, type(exc).__name__, exc)
            return
        path = self.path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, data)  # the commit point
            log.debug("fxwrap program cache: stored %s (%s program)", path, program.kind)
        except OSError as exc:  # a full or read-only disk: the program runs, uncached
            log.warning("fxwrap program cache: cannot write %s (%s: %s); the %s program is not cached",
                        path, type(exc).__name__, exc, program.kind)


def decode(key: str, data: bytes, session, static_inputs: tuple[int, ...] = ()) -> Program:
    """The program in ``data`` (the bytes of the entry stored under ``key``), finished for
    ``session``; raises where the bytes are not that entry."""
    with unset_fake_temporarily():  # constants come back as real tensors
        entry = pickle.loads(data)
    if entry.get("key") != key:
        raise ValueError("the entry holds another key")
    return _program_from_entry(entry, session, static_inputs)


def _program_from_entry(entry: dict, session, static_inputs: tuple[int, ...] = ()):
    gm = entry["graph_module"]
    for kernel in kernels_of(gm):
        kernel.launcher()  # bind now, as a compile does
    program = Program(entry["kind"], session.target, entry["inputs"], entry["lines"], gm, entry["memory"],
                      runner=None, constants=entry["constants"], hints=entry["hints"],
                      static_inputs=static_inputs)
    return finish_program(program, session)
