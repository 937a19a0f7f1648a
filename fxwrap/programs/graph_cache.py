"""The warm-start cache: a dynamo graph compiled once skips AOTAutograd and lowering next time.

The program cache (``fxwrap.programs.program_cache``) is keyed by the ATen graph, so a warm
process still runs AOTAutograd to make that graph.  This cache sits one level up, in
the backend dynamo calls: it is keyed by dynamo's graph and answers with the programs,
the shape guards their compile added (checked and installed again on a hit) and the little
AOTAutograd metadata needed to run them (``fxwrap.runtime.aot_replay``)::

    FXWRAP_CACHE_DIR/graphs/9c/9c41...d0.pkl        {"kind": "training", "layout": ReplayLayout(...),
                                                     "mutated": (3, 4),   # inputs written in place
                                                     "programs": {"forward": <program key>, ...}}
    FXWRAP_CACHE_DIR/programs/..                     the programs, in the program cache's format

    key = sha256(dynamo graph's code; every node's example value (sizes, strides, dtypes,
                 devices, requires_grad; symbolic sizes as expressions) and the shape
                 environment's guards, ranges and hints; tensor constants by value;
                 grad mode, autocast, deterministic algorithms; AOTAutograd's config;
                 the program cache's own environment (options, target, capabilities, host,
                 plugins, FXWRAP_* settings, versions, fxwrap's file hashes))

Only graphs whose AOTAutograd wrappers are plain are stored (input mutations only those
the program makes itself, as batch norm's running statistics: no metadata mutation, no data
mutation of an input that requires grad; no output aliasing an input or another output, no tensor subclass, no effect tokens or
functionalized RNG, only torch functions in the graph); any other graph compiles every time, as before.  A hit calls no AOTAutograd
and no lowering: ``stats`` counts hits, misses, stores and refusals.

Bundles: ``save_cache_artifacts(path)`` writes every entry this process stored or
loaded (graph entries and their programs, kernel binaries inside) to one file;
``load_cache_artifacts(path)`` puts them into this process's cache directory, after
checking the versions, the host and the devices (``CacheBundleError`` otherwise).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import sys
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import torch
from torch._functorch._aot_autograd.schemas import MutationType, OutputType, SubclassCreationMeta
from torch._guards import TracingContext
from torch.fx.experimental.sym_node import SymNode

from fxwrap.programs.artifacts import fxwrap_version, triton_version
from fxwrap.programs.cache_key import KeyHasher, describe, package_digest, shape_env_of, shape_env_state
from fxwrap.core.templates import retune_requested
from fxwrap.programs.program import log_program
from fxwrap.programs.program_cache import ProgramCache, cache_enabled
from fxwrap.runtime.aot_replay import InferenceReplay, ReplayLayout, TrainingReplay
from fxwrap.targets.host.cache import default_cache_dir, write_atomically
from fxwrap.targets.host.compiler import host_fingerprint

log = logging.getLogger("fxwrap")

FORMAT_VERSION = 3  # 3: its pickles name fxwrap.programs.* (the modules moved there); 2: entries and bundle headers name their target
BUNDLE_FORMAT = "fxwrap-cache-bundle"
#: what happened in this process: "hit", "miss", "stored", "uncacheable"
stats: Counter = Counter()
#: why each miss missed: "no entry", "unreadable entry", "shape guards fail", "a program is not cached",
#: "FXWRAP_RETUNE=1"
misses: Counter = Counter()
# cache files (relative to the cache directory) this process stored or loaded: a bundle's contents
_touched: dict[str, None] = {}
# what a bundle saved now would lack, for its warning: graph key -> why it is not stored yet
#: the programs an entry of each kind holds (a graph's or a program's kind: the step's whole set)
_WHOLE = {"inference": {"inference"}, "training": {"forward", "backward"},
          "forward": {"forward", "backward"}, "backward": {"forward", "backward"}}
_awaiting_backward: dict[str, str] = {}  # training graphs whose forward compiled, their backward not yet
_not_stored: dict[str, str] = {}  # graphs the cache refused
# modules whose functions a cacheable dynamo graph may call (anything else: user code, unkeyed)
_TORCH_MODULES = ("torch", "_operator", "operator", "builtins", "math", "_functools")


class CacheBundleError(RuntimeError):
    """A cache bundle cannot be used here: another fxwrap/torch/Triton/Python version, another
    host CPU, an absent device, or not a bundle.  The message says what to do."""


def _refusal(gm: torch.fx.GraphModule) -> str | None:
    """Why the dynamo graph ``gm`` is not keyable by its text, or None."""
    for node in gm.graph.nodes:
        if node.op == "call_module":
            return f"it calls submodule {node.target!r}"
        if node.op == "call_function":
            module = getattr(node.target, "__module__", None) or ""
            if not isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) \
                    and module.split(".")[0] not in _TORCH_MODULES:
                return f"it calls {getattr(node.target, '__qualname__', node.target)!r} of module {module!r}"
        if node.op == "get_attr" and not isinstance(getattr(gm, node.target, None), torch.Tensor):
            return f"it reads attribute {node.target!r}, not a tensor"
    return None


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False where torch has no autocast for it, or
    does not know the type: a PrivateUse1 backend not registered in this process)."""
    try:
        return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def graph_key(gm: torch.fx.GraphModule, example_inputs, session) -> str:
    """The warm-start key of dynamo graph ``gm`` compiled in ``session`` (module docstring;
    ``fxwrap.programs.cache_key`` encodes it)."""
    key = KeyHasher("fxwrap graph cache", FORMAT_VERSION)
    key.add_graph(gm, "example_value")
    key.add(tuple(describe(x) for x in example_inputs))
    key.add(shape_env_state(shape_env_of(gm, "example_value")))
    key.add(("grad", torch.is_grad_enabled()))
    key.add({d: str(torch.get_autocast_dtype(d)) for d in sorted({"cpu", session.target.device_type})
             if _autocast_on(d)})
    key.add_bytes(torch._functorch.config.save_config())
    key.add_session(session)
    return key.hexdigest()


def _plain_refusal(meta) -> str | None:
    """Why AOTAutograd's runtime wrappers for ``meta`` (a ``ViewAndMutationMeta``) are not
    the plain ones ``aot_replay`` replays, or None."""
    if any(i.mutation_type == MutationType.MUTATED_OUT_GRAPH for i in meta.input_info):
        # in-graph mutations (data only, hidden from autograd or of an input that needs no
        # grad: batch norm's running statistics) the program makes itself; out-of-graph ones
        # (metadata, or data of an input that needs grad) AOTAutograd's wrappers make
        return "it mutates an input outside the graph (its metadata, or one that requires grad)"
    if any(o.output_type != OutputType.non_alias for o in meta.output_info):
        return "an output aliases an input or another output"
    if meta.num_intermediate_bases or meta.tokens or meta.is_rng_op_functionalized \
            or getattr(meta, "num_graphsafe_rng_states", 0) or getattr(meta, "num_backward_tokens", 0):
        return "it has intermediate bases, effect tokens or functionalized RNG"
    if getattr(meta, "num_opaque_objects_saved_for_bw", 0):
        return "it saves opaque objects for the backward"
    if any(isinstance(m, SubclassCreationMeta) for m in
           [*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta, *meta.subclass_tangent_meta]):
        return "it takes or makes tensor subclasses"
    return None


def _layout(meta) -> ReplayLayout | str:
    """The training replay's layout from ``meta``, or why there is none."""
    needs_grad = tuple(bool(o.requires_grad) for o in meta.output_info)
    if sum(needs_grad) != len(meta.traced_tangents) or len(meta.subclass_tangent_meta) != len(meta.traced_tangents):
        return "its tangents are not one per output that requires grad"
    layouts = []
    for m in meta.subclass_tangent_meta:
        known = getattr(m, "memory_format", None)
        fmt, stride = getattr(known, "memory_format", None), getattr(known, "stride", None)
        if fmt in (torch.contiguous_format, torch.channels_last):
            layouts.append("contiguous" if fmt == torch.contiguous_format else "channels_last")
        elif fmt is None and stride is not None and all(isinstance(s, int) for s in stride):
            layouts.append(tuple(stride))
        else:
            return "a tangent's traced layout is neither contiguous, channels-last nor static strides"
    return ReplayLayout(len(meta.output_info), meta.tensors_saved_for_backwards_slice,
                        meta.symints_saved_for_backwards_slice, needs_grad, tuple(layouts))


def replay(entry: dict, programs: dict):
    """The runner of graph ``entry`` over its loaded ``programs`` (kind -> ``Program``):
    an ``InferenceReplay`` or a ``TrainingReplay``."""
    mutated = entry.get("mutated", ())
    if entry["kind"] == "inference":
        return InferenceReplay(programs["inference"].runner, mutated)
    return TrainingReplay(programs["forward"].runner, programs["backward"].runner, entry["layout"], mutated)


def cache_dir() -> Path:
    return default_cache_dir()


class GraphCompile:
    """One dynamo graph's trip through the cache: ``load()`` a hit, or watch the compile
    (``compiled(kind, program)`` for each program) and store it when it is whole."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs, session):
        self.session = session
        self.key = graph_key(gm, example_inputs, session)
        self.env = shape_env_of(gm, "example_value")
        self.guards = len(self.env.guards) if self.env is not None else 0
        self.graph_inputs = len(example_inputs)  # what dynamo passes the runner a call
        self.layout: ReplayLayout | None = None
        self.programs: dict = {}
        self.refused = False
        self.refusal: str | None = None  # why the graph is not stored (the first reason)
        self.mutated: tuple[int, ...] = ()

    @staticmethod
    def unstorable(gm: torch.fx.GraphModule, session) -> str:
        """Why ``start`` gave no record for ``gm`` (the cache is off, or ``gm`` not keyable)."""
        if not cache_enabled(session.options):
            return ("fxwrap's caches are off (options={'cache': False} or FXWRAP_PROGRAM_CACHE=0); "
                    "turn them on")
        return _refusal(gm) or "it is not keyable"

    @staticmethod
    def start(gm: torch.fx.GraphModule, example_inputs, session) -> "GraphCompile | None":
        """None where the cache is off or ``gm`` is not keyable (logged)."""
        if not cache_enabled(session.options):
            return None
        reason = _refusal(gm)
        if reason is not None:
            stats["uncacheable"] += 1
            log.info("fxwrap warm-start cache: graph not cached: %s", reason)
            return None
        return GraphCompile(gm, example_inputs, session)

    def path(self) -> Path:
        return cache_dir() / "graphs" / self.key[:2] / f"{self.key}.pkl"

    def _program_key(self, kind: str) -> str:
        return hashlib.sha256(f"{self.key} {kind}".encode()).hexdigest()

    def load(self, on_program=None):
        """The runner of a cached graph (``InferenceReplay`` / ``TrainingReplay``), or None
        (always under ``FXWRAP_RETUNE=1``: its programs hold template choices to measure again)."""
        if retune_requested():
            return self._miss("FXWRAP_RETUNE=1")
        try:
            entry = pickle.loads(self.path().read_bytes())
        except FileNotFoundError:
            return self._miss("no entry")
        except Exception as exc:  # noqa: BLE001 - a bad entry is a miss
            log.warning("fxwrap warm-start cache: ignoring entry %s (%s)", self.path(), exc)
            return self._miss("unreadable entry")
        if entry.get("key") != self.key:
            return self._miss("unreadable entry")
        if not self._guards_hold(entry.get("guards", ())):
            return self._miss("shape guards fail")
        if not isinstance(entry.get("programs"), dict) or not _WHOLE.get(entry.get("kind"), {None}) <= entry["programs"].keys():
            return self._miss("an entry without every program of its kind")
        cache = ProgramCache()
        programs = {kind: cache.load(key, self.session) for kind, key in entry["programs"].items()}
        if any(p is None for p in programs.values()):
            return self._miss("a program is not cached")
        stats["hit"] += 1
        self._touch(entry["programs"].values())
        for kind, program in programs.items():
            log_program(program, f" (from the warm-start cache, entry {self.path()}; program "
                                 f"{ProgramCache().path(entry['programs'][kind])})")
        if on_program is not None:
            for program in programs.values():
                on_program(program)
        return replay(entry, programs)

    def _miss(self, reason: str) -> None:
        stats["miss"] += 1
        misses[reason] += 1
        log.debug("fxwrap warm-start cache: miss %s (%s)", self.key, reason)
        return None

    def _guards_hold(self, guards) -> bool:
        """Whether the shape guards the cold compile added hold at this graph's sizes; if they
        do, they become guards of this compile (dynamo checks them before each call)."""
        if not guards:
            return True
        if self.env is None:
            return False
        hints = self.env.backed_var_to_val if hasattr(self.env, "backed_var_to_val") else self.env.var_to_val
        if not all(bool(expr.xreplace(hints)) for expr in guards):
            log.info("fxwrap warm-start cache: an entry's shape guards fail at these sizes; compiling")
            return False
        for expr in guards:
            bool(torch.SymBool(SymNode(expr, self.env, bool, True)))  # records the guard
        return True

    def _touch(self, program_keys) -> None:
        _touched[str(self.path().relative_to(cache_dir()))] = None
        for key in program_keys:
            _touched[str(ProgramCache().path(key).relative_to(cache_dir()))] = None

    def _refuse(self, reason: str) -> None:
        _awaiting_backward.pop(self.key, None)
        _not_stored[self.key] = reason
        self.refusal = self.refusal or reason
        if not self.refused:
            stats["uncacheable"] += 1
            log.info("fxwrap warm-start cache: graph not cached: %s", reason)
        self.refused = True

    def compiled(self, kind: str, program) -> None:
        """Record ``program`` (just compiled, or loaded from the program cache) as the
        graph's ``kind`` program; store the entry once it holds every program."""
        if self.refused:
            return
        if kind in ("inference", "forward"):
            context = TracingContext.try_get()
            meta = getattr(context, "fw_metadata", None)
            if meta is None:
                return self._refuse("no AOTAutograd metadata")
            reason = _plain_refusal(meta)
            if reason is None and len(program.inputs) != self.graph_inputs:
                # inputs that alias one another, one of them written: AOTAutograd passes the
                # program their base (a synthetic base) and its wrapper makes it a call; a
                # replay would call the program with dynamo's inputs (issue 37, item 5)
                reason = (f"its program takes {len(program.inputs)} inputs where dynamo passes "
                          f"{self.graph_inputs} (aliased inputs merged into a synthetic base)")
            if reason is None and kind == "forward":
                layout = _layout(meta)
                reason, self.layout = (layout, None) if isinstance(layout, str) else (None, layout)
            if reason is not None:
                return self._refuse(reason)
            # inputs the program writes that autograd sees: their version counters go up a call
            self.mutated = tuple(meta.mutated_graph_handled_indices_seen_by_autograd)
        self.programs[kind] = program
        if kind == "forward" and "backward" not in self.programs:
            _awaiting_backward[self.key] = "its forward compiled, its backward has not run yet"
        if not _WHOLE[kind] <= self.programs.keys():
            return  # stored once the step's other program compiles (a backward alone replays nothing)
        cache, keys = ProgramCache(), {}
        for name, prog in self.programs.items():
            keys[name] = prog.cache_key  # the program cache holds it already: no second copy
            if keys[name] is None or not cache.path(keys[name]).exists():
                keys[name] = self._program_key(name)
                cache.store(keys[name], prog)
            if not cache.path(keys[name]).exists():
                return self._refuse(f"its {name} program does not pickle")
        # shape guards AOTAutograd and the lowering added (a tiling for sizes below a bound):
        # a hit checks them at the sizes it is asked for and installs them for dynamo
        added = [g.expr for g in self.env.guards[self.guards:]] if self.env is not None else []
        entry = {"key": self.key, "guards": added, "kind": "inference" if kind == "inference" else "training",
                 "layout": self.layout, "mutated": self.mutated, "programs": keys, "device_type": self.session.target.device_type,
                 "target": self.session.target.name}
        self.path().parent.mkdir(parents=True, exist_ok=True)
        try:
            data = pickle.dumps(entry)
        except Exception as exc:  # noqa: BLE001 - a guard that does not pickle: compiled every time
            return self._refuse(f"its shape guards do not pickle ({exc})")
        write_atomically(self.path(), data)  # the commit point
        _awaiting_backward.pop(self.key, None)
        stats["stored"] += 1
        self._touch(keys.values())
        self.programs = {}


# ------------------------------------------------------------------------------ bundles
def environment_header(device_types, targets=()) -> dict:
    """What a bundle's (or a precompiled function's) programs need of the process that runs
    them: fxwrap's version and files, torch, Triton, Python, the host CPU, ``device_types``,
    and the ``targets`` that compiled them (their plugins and devices)."""
    return {"format": BUNDLE_FORMAT, "format_version": FORMAT_VERSION, "fxwrap_version": fxwrap_version(),
            "fxwrap_files": package_digest(), "torch_version": torch.__version__, "triton_version": triton_version(),
            "python": sys.version.split()[0], "host": hashlib.sha256(host_fingerprint().encode()).hexdigest(),
            "device_types": sorted(device_types), "targets": sorted(targets)}


def save_cache_artifacts(path: str | os.PathLike) -> int:
    """Write every warm-start entry this process compiled or loaded (the graphs, their
    programs, the kernel binaries inside them) into the one file ``path``; returns how many
    graphs it holds.  ``load_cache_artifacts(path)`` in another process (another cache
    directory, another machine with the same host CPU, devices and versions) makes those
    graphs compile with no AOTAutograd and no lowering.  A bundle is a pickle: load only
    bundles you trust."""
    root, files, devices, targets = cache_dir(), {}, set(), set()
    for name in list(_touched):  # a copy: other threads' compiles add to it meanwhile
        try:
            files[name] = (root / name).read_bytes()
        except FileNotFoundError:
            continue
    for name, data in files.items():
        if name.startswith("graphs"):
            entry = pickle.loads(data)
            devices.add(entry["device_type"])
            targets.add(entry["target"])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("header.json", json.dumps(environment_header(devices, targets), indent=1))
        for name in sorted(files):
            archive.writestr(name, files[name])
    write_atomically(Path(path), buffer.getvalue())
    graphs = sum(name.startswith("graphs") for name in files)
    _warn_if_partial(path, graphs)
    return graphs


def _warn_if_partial(path, graphs: int) -> None:
    """A bundle missing graphs this process compiled (a training step saved before its first
    backward, a graph the cache refused) warns, saying which and why: it would hold only
    ``header.json`` and a later process would compile everything anyway."""
    missing = [f"{len(_awaiting_backward)} training graph(s) whose forward compiled but whose backward has not "
               "run yet (call loss.backward() once before saving)"] if _awaiting_backward else []
    if _not_stored:
        reasons = sorted(set(_not_stored.values()))
        missing.append(f"{len(_not_stored)} graph(s) the warm-start cache does not store ({'; '.join(reasons)[:500]})")
    if missing or not graphs:
        what = f"holds {graphs} graph(s)" if graphs else "holds no graph (only header.json)"
        because = "; it lacks " + " and ".join(missing) if missing else \
            "; nothing compiled in this process was stored (is the cache off: FXWRAP_PROGRAM_CACHE=0 or options={'cache': False}?)"
        warnings.warn(f"fxwrap: cache bundle {os.fspath(path)!r} {what}{because}", stacklevel=3)


def load_cache_artifacts(path: str | os.PathLike) -> int:
    """Put the entries of bundle ``path`` (``save_cache_artifacts``) into this process's cache
    directory; returns how many graphs it held.  Raises ``CacheBundleError`` where the bundle
    was made with another fxwrap (version or files), torch, Triton or Python, on another host
    CPU, or for a device this machine lacks: recompile the model here (and save a bundle)."""
    origin = f"cache bundle {os.fspath(path)!r}"
    try:
        archive = zipfile.ZipFile(path)
        header = json.loads(archive.read("header.json"))
    except (OSError, KeyError, zipfile.BadZipFile, ValueError) as exc:
        raise CacheBundleError(f"{origin} is not an fxwrap cache bundle ({exc}); make one with "
                               "fxwrap.save_cache_artifacts(path)") from exc
    check_header(header, origin)
    root, count = cache_dir(), 0
    with archive:
        for name in archive.namelist():
            if name == "header.json":
                continue
            target = (root / name).resolve()
            if root.resolve() not in target.parents:
                raise CacheBundleError(f"{origin} names a file outside the cache directory: {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(target, archive.read(name))
            count += name.startswith("graphs")
    return count


def check_header(header: dict, origin: str) -> None:
    """Raise ``CacheBundleError`` unless the programs of a bundle (or a precompiled artifact)
    with ``header`` run here: same fxwrap (version and files), torch, Triton, Python and host
    CPU, and a device of each type it holds programs for."""
    here = environment_header(header.get("device_types", ()))
    for field_name, what in (("format", "format"), ("format_version", "format version"),
                             ("fxwrap_version", "fxwrap version"), ("fxwrap_files", "fxwrap source files"),
                             ("torch_version", "torch version"), ("triton_version", "Triton version"),
                             ("python", "Python version"), ("host", "host CPU (model and features)")):
        if header.get(field_name) != here[field_name]:
            raise CacheBundleError(f"{origin} was made with another {what} ({header.get(field_name)!r}; here "
                                   f"{here[field_name]!r}): its programs cannot run here. Compile the model "
                                   "in this environment (torch.compile(..., backend='fxwrap')) and save a "
                                   "bundle here")
    from fxwrap.plugins.manager import get_plugin_manager
    for target in header.get("targets", ()):
        why = get_plugin_manager().missing_device(target)
        if why is not None:
            raise CacheBundleError(f"{origin} holds programs of target {target!r}, which cannot run here: {why}. "
                                   "Load it where the target's plugin and device are")
