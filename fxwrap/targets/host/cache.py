"""On-disk cache of compiled kernels, safe under concurrent writers and crashes.

Layout under ``FXWRAP_CACHE_DIR`` (default ``~/.cache/fxwrap``)::

    cpu_cpp/3f/3f2a...e1.so     the shared object, keyed by sha256(source, flags, compiler)
    cpu_cpp/3f/3f2a...e1.sha256 the sha256 of that shared object's bytes (its seal)
    cpu_cpp/3f/3f2a...e1.cpp    the source it was built from (for humans)

A file read back is untrusted: an entry is used only when its binary's bytes still give its
seal.  A cut or changed binary (a full disk, a copy interrupted, a stray write) would crash
the process that loads it (a truncated ``.so`` faults with SIGBUS inside ``dlopen``); it is
a logged miss instead (logger ``fxwrap.cache``) and is built again.

An entry is produced in a unique temporary folder in the same directory (its files named
by the key alone, so that the binary, which records its source's file name, is the same
bytes from every build) and then ``os.replace``d onto its final name, which is atomic on POSIX: a reader sees either
no entry or a complete one.  Two processes building the same key race harmlessly
(the last rename wins, both files are complete); a crash leaves only a temporary
file, which later builds of that key sweep away once it is stale.
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from fxwrap.runtime.cache_dir import cache_root

STALE_SECONDS = 3600.0
SEAL = ".sha256"

log = logging.getLogger("fxwrap.cache")


def file_digest(path: Path) -> str:
    """The sha256 of the file's bytes: a cache entry's seal."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def write_sealed(path: Path, data: bytes) -> None:
    """``data`` written as the binary of a cache entry at ``path`` (a binary another process
    built, carried in a file): its seal first, then the binary, each atomically."""
    path = Path(path)
    write_atomically(path.with_suffix(SEAL), hashlib.sha256(data).hexdigest().encode())
    write_atomically(path, data)


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
        """The entry's binary when it is there and intact (its seal), else None."""
        p = self.path(key)
        return p if self.intact(key) else None

    def intact(self, key: str) -> bool:
        """Whether ``key``'s binary exists and its bytes give its seal; a damaged entry is
        evicted (logged), so the next build makes it again."""
        binary, seal = self.path(key), self.path(key, SEAL)
        try:
            expected = seal.read_text().strip()
            if file_digest(binary) == expected:
                return True
            reason = "its bytes do not match its seal"
        except FileNotFoundError:
            if not binary.exists():
                return False
            # written by an fxwrap that sealed nothing (or a crash between seal and rename):
            # not known to be good, built again without alarm
            log.debug("fxwrap: cache entry %s has no seal: building it again", binary)
            self.evict(key)
            return False
        except OSError as exc:
            reason = f"it cannot be read ({exc})"
        log.warning("fxwrap: cache entry %s is damaged (%s): building it again", binary, reason)
        self.evict(key)
        return False

    def commit(self, key: str, built: Path) -> Path:
        """Put ``built`` (a complete binary in this cache's directory tree) in place as
        ``key``'s entry, sealed: the seal first, then the binary's atomic rename."""
        final = self.path(key)
        write_atomically(self.path(key, SEAL), file_digest(built).encode())
        os.replace(built, final)  # the commit point
        return final

    def evict(self, key: str) -> None:
        """Drop an entry (e.g. one that fails to load); a later build recreates it."""
        for suffix in (".so", SEAL, self.source_suffix):
            try:
                self.path(key, suffix).unlink()
            except FileNotFoundError:
                pass

    def get_or_build(self, key: str, source: str,
                     build: Callable[[Path, Path], None]) -> Path:
        """The entry for ``key``; ``build(src_path, out_path)`` writes ``out_path`` if missing."""
        final = self.path(key)
        if self.intact(key):
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
            self.commit(key, out_tmp)
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
