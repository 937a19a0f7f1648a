"""Cache keys: the one encoder of values into key bytes, and the parts every key covers.

Both caches key with it: the program cache (``fxwrap.programs.program_cache``: an ATen graph,
``node.meta["val"]``) and the warm-start cache (``fxwrap.programs.graph_cache``: dynamo's graph,
``node.meta["example_value"]``)::

    key = KeyHasher("fxwrap program cache", kind)      # KEY_VERSION is written first
    key.add_graph(gm, "val")                           # code, every node's value, constants by bytes
    key.add(shape_env_state(shape_env_of(gm, "val")))
    key.add_session(session)                           # options, target, host, plugins, versions...
    key.hexdigest()

``encode`` writes a value as bytes that depend on the value alone, never on the process:
type-tagged and length-prefixed (``("a", "b")`` and ``("a,b",)`` differ), dicts and sets in
sorted order (no hash order), floats exactly (``float.hex``), dataclasses field by field, and
no ``repr`` of an object (an address would make every process miss).  A value of another type is
a ``TypeError`` naming it, not a key that silently covers less.  ``describe`` turns a node's
value (a fake tensor, a SymInt, ...) into such plain data.  Change what either writes and bump
``KEY_VERSION`` (old entries are then never read; they stay where they are until cleared).

    >>> encode(("a", 1)) == encode(("a", 1)) != encode(("a", "1"))
    True
    >>> encode({"b": 2, "a": 1}) == encode({"a": 1, "b": 2})
    True
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import os
import platform
import sys
import types
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

from fxwrap.programs.artifacts import fxwrap_version, triton_version
from fxwrap.core.templates import RETUNE_ENV
from fxwrap.targets.host.compiler import host_fingerprint
from fxwrap.wrapper_ir.build_user_kernels import user_kernel_key

#: the encoding; 2: one encoder for both caches (1: ``repr`` of each part, an encoder in each cache)
KEY_VERSION = 2
#: the program cache's on/off switch (``fxwrap.programs.program_cache.cache_enabled``)
ENV_SWITCH = "FXWRAP_PROGRAM_CACHE"
# settings that change where files go or what is printed, not what is compiled; FXWRAP_RETUNE
# (measure the template choices again) compiles what the key names, and its programs replace
# the entries under that key
ENV_IGNORED = frozenset({"FXWRAP_CACHE_DIR", "FXWRAP_LOG", ENV_SWITCH, RETUNE_ENV})
# torch values written by their name
_TORCH_NAMED = (torch.dtype, torch.device, torch.memory_format, torch.layout)


def _sized(tag: bytes, data: bytes) -> bytes:
    return tag + str(len(data)).encode() + b":" + data


def encode(value) -> bytes:
    """``value`` as bytes that are equal for equal values in any process (module docstring)."""
    if value is None:
        return b"N"
    if value is True or value is False:
        return b"T" if value else b"F"
    if isinstance(value, enum.Enum):  # IntEnum and StrEnum too: before int and str
        return _sized(b"E", f"{type(value).__module__}.{type(value).__qualname__}.{value.name}".encode())
    if isinstance(value, int):
        return _sized(b"i", str(int(value)).encode())
    if isinstance(value, float):
        return _sized(b"f", float(value).hex().encode())
    if isinstance(value, str):
        return _sized(b"s", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray)):
        return _sized(b"b", bytes(value))
    if isinstance(value, tuple):
        return _sized(b"t", b"".join(encode(v) for v in value))
    if isinstance(value, list):
        return _sized(b"l", b"".join(encode(v) for v in value))
    if isinstance(value, dict):
        return _sized(b"d", b"".join(sorted(encode(k) + encode(v) for k, v in value.items())))
    if isinstance(value, (set, frozenset)):
        return _sized(b"S", b"".join(sorted(encode(v) for v in value)))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        return _sized(b"D", encode(kind) + b"".join(encode((f.name, getattr(value, f.name)))
                                                    for f in dataclasses.fields(value)))
    if isinstance(value, _TORCH_NAMED):
        return _sized(b"p", f"{type(value).__name__}:{value}".encode())
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return encode(describe(value))
    raise TypeError(f"fxwrap cache key: cannot encode a {type(value).__module__}.{type(value).__qualname__} "
                    f"({value!r:.80}); key on plain data (None, bool, int, float, str, bytes, tuple, list, "
                    "dict, set, a dataclass, an enum, a torch dtype/device)")


def describe(value) -> object:
    """A graph node's value as plain data: a tensor's layout, dtype, device, requires_grad and
    type (not its numbers); a symbolic value's expression; anything else unknown, its type."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(str(s) for s in value.shape), tuple(str(s) for s in value.stride()),
                str(value.storage_offset()), str(value.dtype), str(value.device), value.requires_grad,
                type(value).__name__)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("sym", str(value))
    if isinstance(value, (list, tuple)):
        return tuple(describe(v) for v in value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, _TORCH_NAMED):
        return str(value)
    return ("object", f"{type(value).__module__}.{type(value).__qualname__}")


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a real constant of a graph (``torch.tensor([...])`` in the user's code).
    A key is computed while AOTAutograd's fake mode may be active, which would take the constant
    for a tensor it forgot to fake: the copy runs with it unset.  A fake tensor has no bytes
    (its description is keyed)."""
    if is_fake(t):
        return b"fake"
    with unset_fake_temporarily():
        t = t.detach().to("cpu").contiguous()
        return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def shape_env_of(gm: torch.fx.GraphModule, meta_key: str):
    """The ShapeEnv of the fake values in ``node.meta[meta_key]``, or None (static shapes)."""
    for node in gm.graph.nodes:
        env = getattr(getattr(node.meta.get(meta_key), "fake_mode", None), "shape_env", None)
        if env is not None:
            return env
    return None


def shape_env_state(env) -> object:
    """A ShapeEnv's guards, ranges, example sizes (hints) and replacements, as sorted text."""
    if env is None:
        return None
    # the example sizes: backed_var_to_val from torch 2.13, var_to_val before
    hints = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val
    return (sorted(str(g.expr) for g in env.guards),
            sorted((str(k), str(v)) for k, v in env.var_to_range.items()),
            sorted((str(k), str(v)) for k, v in hints.items()),
            sorted((str(k), str(v)) for k, v in env.replacements.items()))


def options_state(options) -> list:
    """The compile options that change what is compiled (not ``on_program``, not ``cache``);
    a ``Target`` by its name."""
    return [(f.name, getattr(getattr(options, f.name), "name", getattr(options, f.name)))
            for f in dataclasses.fields(options) if f.name not in ("on_program", "cache")]


@functools.lru_cache(maxsize=None)
def package_digest() -> str:
    """sha256 of every file of the fxwrap package (sources, the Metal shim headers)."""
    root = Path(__file__).resolve().parent.parent  # fxwrap/, this file being fxwrap/programs/cache_key.py
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


class KeyHasher:
    """A sha256 fed with ``encode``d parts: ``KeyHasher(*header)``, ``add(value)``,
    ``add_bytes(data)``, ``add_graph(gm, meta_key)``, ``add_session(session)``, ``hexdigest()``."""

    def __init__(self, *header):
        self._h = hashlib.sha256()
        self.add(("fxwrap cache key", KEY_VERSION, *header))

    def add(self, value) -> None:
        self._h.update(encode(value))

    def add_bytes(self, data: bytes) -> None:
        self._h.update(_sized(b"b", data))

    def add_graph(self, gm: torch.fx.GraphModule, meta_key: str) -> None:
        """The graph's code, every node's ``meta[meta_key]`` described, the tensors of its
        ``get_attr`` constants by value, and the user Triton kernels it launches (the graph names
        them by a per-process index: the key names each by digest)."""
        self.add(gm.code)
        self.add(user_kernel_key(gm))
        for node in gm.graph.nodes:
            self.add((node.op, node.name, describe(node.meta.get(meta_key))))
            if node.op == "get_attr":
                value = getattr(gm, node.target, None)
                if isinstance(value, torch.Tensor):
                    self.add(describe(value))
                    self.add_bytes(tensor_bytes(value))

    def add_session(self, session) -> None:
        """What a program compiled in ``session`` depends on besides its graph: the options,
        the target (name, device type, options), the device's capabilities, the intrinsics its
        emitter declares (``fxwrap.Intrinsic``: targets declaring other intrinsics never share
        a program), the host CPU, the plugins and their sources, the pass lists, deterministic
        algorithms, $CXX and FXWRAP_* settings, the versions of Python, torch, Triton and
        fxwrap and fxwrap's files."""
        target = session.target
        self.add(options_state(session.options))
        self.add((target.name, target.device_type, dict(target.options)))
        self.add(session.capabilities)
        self.add(session.intrinsics)
        self.add(host_fingerprint())
        self.add(tuple(session.plugins.plugins))
        self.add(plugin_digest(session.plugins.plugin_objects))
        self.add(session.pipeline.names())
        self.add(("deterministic algorithms", torch.are_deterministic_algorithms_enabled()))
        self.add({k: v for k, v in os.environ.items()
                  if (k.startswith("FXWRAP_") and k not in ENV_IGNORED) or k == "CXX"})
        self.add((sys.version, platform.machine(), torch.__version__, triton_version(), fxwrap_version(),
                  package_digest()))

    def hexdigest(self) -> str:
        return self._h.hexdigest()
