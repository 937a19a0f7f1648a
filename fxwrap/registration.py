"""``torch.compile(backend="fxwrap")``: the name registered with dynamo, race-free.

torch finds a backend named by a string in its registry
(``torch._dynamo.backends.registry``); an installed package's backend is registered by
torch itself on its first lookup, from the ``torch_dynamo_backends`` entry point, with a
check-then-register that asserts ``duplicate name`` when several threads look it up at
once (3 of 4 threads calling ``torch.compile(backend="fxwrap")`` for the first time failed).

``import fxwrap`` registers the name before any lookup can race:

* if torch's registry is not loaded yet (``import torch`` does not load dynamo), the moment
  it loads (under Python's import lock, in whichever thread imports it first) fxwrap's
  backend is registered into it: no lookup ever takes the entry-point path;
* if it is loaded and no lookup has discovered the entry point yet, now, under a lock;
* if a lookup already discovered it (``torch.compile(backend="fxwrap")`` ran before fxwrap
  was imported, and may be importing fxwrap this moment), torch registers it itself.

So a program that compiles from several threads imports fxwrap first; one that compiles
from one thread needs no import.  The backend registered is ``dynamo_backend`` below, the
entry point's object too, which loads the compiler on its first call: ``import fxwrap``
stays cheap and loads no dynamo.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading

NAME = "fxwrap"
REGISTRY = "torch._dynamo.backends.registry"

_LOCK = threading.Lock()


def dynamo_backend(gm, example_inputs, options: dict | None = None, mode: str | None = None):
    """What torch calls for ``backend="fxwrap"``: ``fxwrap.api.dynamo_backend``, loaded now."""
    return importlib.import_module("fxwrap.api").dynamo_backend(gm, example_inputs, options=options, mode=mode)


def _register(registry) -> None:
    with _LOCK:
        if NAME not in registry._COMPILER_FNS:
            registry.register_backend(compiler_fn=dynamo_backend, name=NAME)


class _RegisterOnLoad(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds torch's registry module through the other finders and registers fxwrap's backend
    right after the module runs."""

    def __init__(self):
        self.loader = None

    def find_spec(self, fullname, path, target=None):
        if fullname != REGISTRY or self.loader is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        try:
            self.loader.exec_module(module)
        finally:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        _register(module)


def install() -> None:
    """Register fxwrap's backend now, or the moment torch's registry loads (see the module)."""
    registry = sys.modules.get(REGISTRY)
    if registry is None:
        with _LOCK:
            if not any(isinstance(f, _RegisterOnLoad) for f in sys.meta_path):
                sys.meta_path.insert(0, _RegisterOnLoad())
        return
    if NAME not in getattr(registry, "_BACKENDS", {NAME: None}):
        _register(registry)
