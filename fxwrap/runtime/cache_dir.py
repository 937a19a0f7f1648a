"""Where fxwrap keeps its on-disk caches: ``$FXWRAP_CACHE_DIR``, default ``~/.cache/fxwrap``.

    >>> cache_root()          # $FXWRAP_CACHE_DIR, else ~/.cache/fxwrap (e.g. /home/me/.cache/fxwrap)
    PosixPath('...')

Every cache (compiled kernels, whole programs, the binaries of loaded programs, Triton
launchers, template timings) lives in a folder under this root.  A root fxwrap cannot
write (no permission, a file where the folder should be, a read-only disk) is not an
error: fxwrap warns once, naming the folder, the reason and what to do, and caches in a
fresh temporary folder of this process instead, so the program compiles and runs as it
would with an empty cache (nothing is shared with other processes)::

    UserWarning: fxwrap: FXWRAP_CACHE_DIR=/data/ro cannot be written (PermissionError: ...);
    caching in /tmp/fxwrap-cache-k2j1 for this process only; point FXWRAP_CACHE_DIR at a
    folder you can write

The check writes one probe file, once per process and root.  This module imports only
the standard library: a saved program needs it to write its kernels' binaries.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import warnings
from pathlib import Path

ENV = "FXWRAP_CACHE_DIR"

__all__ = ["ENV", "cache_root", "configured_root"]


def configured_root() -> Path:
    """The root the environment asks for (``$FXWRAP_CACHE_DIR``, else ``~/.cache/fxwrap``),
    whether or not it can be written."""
    root = os.environ.get(ENV)
    return Path(root) if root else Path.home() / ".cache" / "fxwrap"


def cache_root() -> Path:
    """The root to cache under: ``configured_root()`` where it can be written, else this
    process's temporary folder (with a warning, once per root)."""
    return _usable(str(configured_root()))


@functools.lru_cache(maxsize=None)
def _usable(root: str) -> Path:
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fxwrap-probe-"):
            pass
        return path
    except OSError as exc:
        fallback = Path(tempfile.mkdtemp(prefix="fxwrap-cache-"))
        atexit.register(shutil.rmtree, fallback, ignore_errors=True)
        source = f"{ENV}={root}" if os.environ.get(ENV) else f"the default cache folder {root}"
        warnings.warn(f"fxwrap: {source} cannot be written ({type(exc).__name__}: {exc}); caching in "
                      f"{fallback} for this process only; point {ENV} at a folder you can write",
                      stacklevel=3)
        return fallback
