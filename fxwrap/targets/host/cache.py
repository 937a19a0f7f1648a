"""On-disk cache of compiled kernels, safe under concurrent writers and crashes.

Layout under ``FXWRAP_CACHE_DIR`` (default ``~/.cache/fxwrap``)::

    cpu_cpp/3f/3f2a...e1.so     the shared object, keyed by sha256(source, flags, compiler)
    cpu_cpp/3f/3f2a...e1.cpp    the source it was built from (for humans)

An entry is produced in a unique temporary folder in the same directory (its files named
by the key alone, so that the binary, which records its source's file name, is the same
bytes from every build) and then ``os.replace``d onto its final name, which is atomic on POSIX: a reader sees either
no entry or a complete one.  Two processes building the same key race harmlessly
(the last rename wins, both files are complete); a crash leaves only a temporary
file, which later builds of that key sweep away once it is stale.
"""
from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fxwrap.runtime.cache_dir import cache_root

STALE_SECONDS = 3600.0


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a unique temporary file in the same directory
    and ``os.replace``: a reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass


def default_cache_dir() -> Path:
    """``$FXWRAP_CACHE_DIR`` (default ``~/.cache/fxwrap``); where it cannot be written, a
    temporary folder of this process, with a warning (``fxwrap.runtime.cache_dir``)."""
    return cache_root()


class KernelCache:
    """``KernelCache(root).get_or_build(key, source, build) -> Path`` of the ``.so``; the
    source is kept beside it as ``<key><source_suffix>`` (``.cpp``; a C compiler's ``.c``)."""

    def __init__(self, root: str | os.PathLike | None = None, namespace: str = "cpu_cpp",
                 source_suffix: str = ".cpp"):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.dir = self.root / namespace
        self.source_suffix = source_suffix

    def path(self, key: str, suffix: str = ".so") -> Path:
        return self.dir / key[:2] / f"{key}{suffix}"

    def lookup(self, key: str) -> Path | None:
        p = self.path(key)
        return p if p.is_file() else None

    def evict(self, key: str) -> None:
        """Drop an entry (e.g. one that fails to load); a later build recreates it."""
        for suffix in (".so", self.source_suffix):
            try:
                self.path(key, suffix).unlink()
            except FileNotFoundError:
                pass

    def get_or_build(self, key: str, source: str,
                     build: Callable[[Path, Path], None]) -> Path:
        """The entry for ``key``; ``build(src_path, out_path)`` writes ``out_path`` if missing."""
        final = self.path(key)
        if final.is_file():
            return final
        d = final.parent
        d.mkdir(parents=True, exist_ok=True)
        self._sweep(d, key)
        # a private folder per build, the files in it named by the key alone: the compiler
        # writes the source's file name into the binary, which must not depend on the build
        work = d / f".{key}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        work.mkdir()
        src_tmp, out_tmp = work / f"{key}{self.source_suffix}", work / f"{key}.so"
        try:
            src_tmp.write_text(source)
            build(src_tmp, out_tmp)
            if not out_tmp.is_file():
                raise RuntimeError(f"kernel build for {key} produced no {out_tmp.name}")
            os.replace(src_tmp, self.path(key, self.source_suffix))
            os.replace(out_tmp, final)  # the commit point
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final

    @staticmethod
    def _sweep(d: Path, key: str) -> None:
        """Remove temporaries of ``key`` left by crashed builds (older than an hour)."""
        now = time.time()
        for tmp in [*d.glob(f".{key}.*.tmp"), *d.glob(f"{key}.*.tmp.*")]:  # build folders; older files
            try:
                if now - tmp.stat().st_mtime > STALE_SECONDS:
                    if tmp.is_dir():
                        shutil.rmtree(tmp, ignore_errors=True)
                    else:
                        tmp.unlink()
            except FileNotFoundError:
                pass
