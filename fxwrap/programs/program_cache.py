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

import os
import pickle
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from fxwrap.programs.artifacts import FORMAT_VERSION, SavingPickler, pickled
from fxwrap.programs.cache_key import (  # noqa: F401  (package_digest, plugin_digest: read here by older callers)
    ENV_SWITCH, KeyHasher, package_digest, plugin_digest, shape_env_of, shape_env_state,
)
from fxwrap.core import logs
from fxwrap.core.templates import retune_requested
from fxwrap.programs.program import Program, finish_program
from fxwrap.runtime.graph_records import kernels_of
from fxwrap.targets.host.cache import default_cache_dir, write_atomically

log = logs.logger("cache")  # FXWRAP_LOG=cache shows the hits and misses



def cache_enabled(options) -> bool:
    """The ``cache`` option and ``FXWRAP_PROGRAM_CACHE`` (``0``/``false``/``off``: off)."""
    if not options.cache:
        return False
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def cache_dir() -> Path:
    return default_cache_dir() / "programs"


def program_key(gm: torch.fx.GraphModule, session, kind: str) -> str:
    """The cache key of compiling ``gm`` (an ATen graph) as a ``kind`` program in ``session``
    (see the module docstring for what it covers; ``fxwrap.programs.cache_key`` encodes it)."""
    key = KeyHasher("fxwrap program cache", FORMAT_VERSION, kind)
    key.add_graph(gm, "val")
    key.add(shape_env_state(shape_env_of(gm, "val")))
    key.add_session(session)
    return key.hexdigest()


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
