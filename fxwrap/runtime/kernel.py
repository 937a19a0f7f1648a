"""The ``Kernel`` object: the call target of every kernel launch in an FX graph.

In a GraphModule produced by fxwrap a launch reads::

    fxwrap_kernel_0 = fxwrap.runtime.kernel.fxwrap_kernel_0_3f2a...  # a Kernel
    fxwrap_kernel_0(buf0, arg0_1, 1024)

A consumer finds every launch with ``isinstance(node.target, fxwrap.Kernel)`` and
reads ``name``, ``source``, ``target`` (device type), ``signature`` and ``launch``.

Under ``torch.profiler`` each launch is a ``record_function`` range named after the
kernel (``fxwrap_pointwise_0``), on every target; with no profiler running a launch
pays one read of ``torch.autograd.profiler._is_profiler_enabled`` (a module flag the
Python profilers set; measured: docs/debugging.md).
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.autograd.profiler as _autograd_profiler
import torch.fx

from fxwrap.runtime.launch import KernelLaunch

ROLES = ("input", "output", "inout", "workspace", "size")  # workspace: scratch the kernel writes and no one reads

# Kernels alive in this process, by key: lets FX's import block of a pickled
# GraphModule name a kernel as ``fxwrap.runtime.kernel.<key>``.
_LIVE: "weakref.WeakValueDictionary[str, Kernel]" = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class KernelArg:
    """One kernel parameter: ``KernelArg("in_ptr0", "input")``."""

    name: str
    role: str

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"kernel argument {self.name!r}: role {self.role!r} is not one of {ROLES}")


class Kernel:
    """A compiled kernel, callable as ``kernel(*args)``; writes its output args.

    ``loader`` is a picklable callable (a module-level function or class) with
    ``loader(kernel) -> launcher``; it is called once, on the first launch, so an
    unpickled GraphModule recompiles (or loads from cache) lazily.  Example::

        k = Kernel("add_one", source, target="cpu",
                   signature=(KernelArg("x", "input"), KernelArg("y", "output")),
                   launch=KernelLaunch(symbol="add_one", pointers=2), loader=my_loader)
        k(x, y)

    ``launch`` is a ``KernelLaunch`` (``fxwrap.runtime.launch``; a dict is converted, its
    keys checked).
    """

    __module__ = "fxwrap.runtime.kernel"

    def __init__(self, name: str, source: str, target: str, signature, launch=None,
                 loader: Callable[["Kernel"], Callable] | None = None):
        self.name = name
        self.source = source
        self.target = target
        self.signature = tuple(signature)
        self.launch = KernelLaunch.of(launch).copy()
        self.loader = loader
        self.key = kernel_key(name, source, target, self.signature, self.launch, loader)
        self._launcher: Callable = self._first_call
        self._loading = threading.Lock()  # held while loader(self) runs (launcher())
        _LIVE[self.key] = self

    @property
    def __name__(self) -> str:  # FX names the global after this
        return self.key

    def __call__(self, *args):
        if _autograd_profiler._is_profiler_enabled:  # a profiler is on: name the launch in its trace
            with _autograd_profiler.record_function(self.name):
                return self._launcher(*args)
        return self._launcher(*args)

    # Every kernel hashes alike and equals ``_ANY_KERNEL`` (below), the one entry FX's
    # set of side-effectful functions holds for all of them: a launch node survives
    # dead-code elimination (it writes its outputs and returns nothing), and the set
    # keeps no kernel alive (one entry per kernel would, for the life of the process).
    def __hash__(self) -> int:
        return _KERNEL_HASH

    def _first_call(self, *args):
        if any(isinstance(a, torch.fx.Proxy) for a in args):  # FX re-tracing on unpickle
            tracer = next(a for a in args if isinstance(a, torch.fx.Proxy)).tracer
            return tracer.create_proxy("call_function", self, args, {})
        return self.launcher()(*args)

    def launcher(self) -> Callable:
        """The launcher calls go to, loaded through ``loader`` now if no call has loaded it
        yet (saving a program reads the binary a launcher was built from)."""
        if getattr(self._launcher, "__func__", None) is Kernel._first_call:
            # Threads whose first launches race load once: a second launcher would be
            # dropped while its launches may still run (a CUDA one unloads its module then).
            with self._loading:
                if getattr(self._launcher, "__func__", None) is Kernel._first_call:
                    if self.loader is None:
                        raise RuntimeError(f"kernel {self.name} (target {self.target}) has no loader: "
                                           "build it with a KernelEmitter or pass loader=")
                    self._launcher = self.loader(self)
        return self._launcher

    def bind(self, launcher: Callable) -> None:
        """Pre-bind the launcher (done at compile time by emitters)."""
        self._launcher = launcher

    # A kernel is immutable once built: copies share it (and its bound launcher).
    def __copy__(self) -> "Kernel":
        return self

    def __deepcopy__(self, memo) -> "Kernel":
        return self

    # FX's importer asks __reduce__ for a global name; pickle uses __reduce_ex__.
    def __reduce__(self) -> str:
        return self.key

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self.name, self.source, self.target, self.signature,
                           self.launch, self.loader, self.key))

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, target={self.target!r})"


_KERNEL_HASH = hash("fxwrap.runtime.kernel.Kernel")


class _AnyKernel:
    """Equal to every ``Kernel`` (and hashed alike): ``kernel in _side_effectful_functions``
    holds for each kernel through this single entry (see ``Kernel.__hash__``)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return _KERNEL_HASH

    def __eq__(self, other) -> bool:
        return isinstance(other, Kernel)

    def __repr__(self) -> str:
        return "<every fxwrap Kernel>"


_ANY_KERNEL = _AnyKernel()
torch.fx.node.has_side_effect(_ANY_KERNEL)


def kernel_key(name: str, source: str, target: str, signature, launch, loader) -> str:
    """``<name>_<digest>``: the digest of everything a kernel is built from (a pickled kernel
    carries it, so a damaged source is noticed when it is loaded)."""
    loader_name = (f"{getattr(loader, '__module__', '')}."
                   f"{getattr(loader, '__qualname__', type(loader).__qualname__)}")
    digest = hashlib.sha256(repr((name, source, target, tuple(signature),
                                  type(KernelLaunch.of(launch)).__name__,
                                  sorted(KernelLaunch.of(launch).as_dict().items(), key=repr),
                                  loader_name)).encode()).hexdigest()[:16]
    return f"{name}_{digest}"


class DamagedKernelError(ValueError):
    """A pickled kernel's parts no longer give the digest it was saved with: its source (or
    signature, launch record) changed after it was written."""


def _rebuild(name, source, target, signature, launch, loader, key: str | None = None) -> Kernel:
    kernel = Kernel(name, source, target, signature, launch, loader)
    if key is not None and kernel.key != key:  # the digest covers name, source, signature, launch
        raise DamagedKernelError(f"kernel {name} (target {target}) is damaged: its stored source or launch "
                                 f"record does not match the digest it was saved with ({key})")
    return kernel


def __getattr__(key: str) -> Any:
    try:
        return _LIVE[key]
    except KeyError:
        raise AttributeError(key) from None
