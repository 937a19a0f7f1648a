"""The C++ compiler driver: source text -> cached shared object.

    >>> CppCompiler().compile(source_text)
    PosixPath('/home/me/.cache/fxwrap/cpu_cpp/3f/3f2a...e1.so')

The compiler is ``$CXX`` (default ``g++``).  The cache key is the sha256 of the
source, the flags, the compiler's ``--version`` text and the host CPU (because of
``-march=native``), so a cache shared between machines or toolchains never hands out
a wrong binary.
"""
from __future__ import annotations

import functools
import logging
import hashlib
import os
import platform
import shlex
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path

from fxwrap.targets.host.cache import KernelCache, default_cache_dir

# the ``cache`` stage's logger (``fxwrap.core.logs``), by name: a saved program loads this
# module without the compiler's modules
_CACHE_LOG = logging.getLogger("fxwrap.cache")

# -fwrapv: integer overflow wraps like eager PyTorch; -ffp-contract=off: no fused
# multiply-add, every op rounds like its eager kernel; -fno-math-errno: libm calls
# need not set errno (lets sqrt & co. inline and vectorize; results are unchanged).
DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                 "-fwrapv", "-ffp-contract=off", "-fno-math-errno")


class CompileError(RuntimeError):
    """The C++ compiler rejected a kernel; carries the command, its output and the source path."""


@functools.lru_cache(maxsize=None)
def _version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CompileError(f"C++ compiler {cxx!r} (from $CXX, default g++) cannot run: {exc}; "
                           "install g++ or point CXX at a C++17 compiler with OpenMP") from exc
    return out.stdout


@functools.lru_cache(maxsize=None)
def host_fingerprint() -> str:
    """What -march=native depends on: the machine and the CPU's model and feature flags."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                if line.strip() == "":  # first processor is enough
                    break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def _kernel_title(source: str) -> str:
    first = source.split("\n", 1)[0]
    return first[2:].strip() if first.startswith("//") else "no header"


def without_header(source: str) -> str:
    """``source`` less the kernel header it opens with (``targets.base.kernel_header``: the
    ``//`` lines from ``// fxwrap kernel ...`` on); any other source as it is."""
    if not source.startswith("// fxwrap kernel "):
        return source
    lines = source.split("\n")
    start = 0
    while start < len(lines) and lines[start].startswith("//"):
        start += 1
    return "\n".join(lines[start:])


class CppCompiler:
    """Compiles kernel sources to shared objects through a ``KernelCache``.  Threads may
    call ``compile`` at once: a source being compiled by one thread is waited for by the
    others (one ``g++`` per distinct source in a process; processes race through the cache)."""

    def __init__(self, cxx: str | None = None, flags=None, cache_dir=None):
        self.cxx = cxx or os.environ.get("CXX") or "g++"
        self.flags = tuple(flags) if flags is not None else DEFAULT_FLAGS
        self.cache = KernelCache(cache_dir if cache_dir is not None else default_cache_dir())
        self._lock = threading.Lock()
        self._building: dict[str, Future] = {}  # key -> the shared object's path, being built

    @property
    def version(self) -> str:
        return _version(self.cxx)

    def key(self, source: str, extra_flags=()) -> str:
        """sha256 of the source without its opening comment lines (the kernel header:
        name and provenance, ``targets.base.kernel_header``), the flags, the compiler
        and the host: one binary for the same kernel from any source line."""
        h = hashlib.sha256()
        for part in (without_header(source), " ".join(self.flags + tuple(extra_flags)), self.cxx, self.version,
                     host_fingerprint()):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def command(self, src: Path, out: Path, extra_flags=()) -> list[str]:
        return [*shlex.split(self.cxx), *self.flags, *extra_flags, str(src), "-o", str(out)]

    def compile(self, source: str, extra_flags=()) -> Path:
        """The cached shared object for ``source``, compiling it if needed."""
        key = self.key(source, extra_flags)

        def build(src: Path, out: Path) -> None:
            cmd = self.command(src, out, extra_flags)
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                keep = src.with_name(f"{key}.failed.cpp")
                keep.write_text(source)
                raise CompileError(f"{self.cxx} failed (exit {proc.returncode}) on the kernel saved "
                                   f"at {keep}\ncommand: {shlex.join(cmd)}\n{proc.stderr[-8000:]}")

        with self._lock:
            building = self._building.get(key)
            if building is None:
                building = self._building[key] = Future()
                owner = True
            else:
                owner = False
        if not owner:  # another thread compiles this source now: its result
            return building.result()
        try:
            if _CACHE_LOG.isEnabledFor(logging.DEBUG):
                hit = self.cache.lookup(key) is not None
                _CACHE_LOG.debug("%s %s (%s)", "hit" if hit else "miss, compiling", self.cache.path(key),
                                 _kernel_title(source))
            path = self.cache.get_or_build(key, source, build)
        except BaseException as exc:
            building.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._building[key]
        building.set_result(path)
        return path


_DEFAULTS: dict[tuple, CppCompiler] = {}


def default_compiler() -> CppCompiler:
    """The compiler for the current ``$CXX`` and ``$FXWRAP_CACHE_DIR`` (one per pair)."""
    env = (os.environ.get("CXX") or "g++", str(default_cache_dir()))
    comp = _DEFAULTS.get(env)
    if comp is None:
        comp = _DEFAULTS[env] = CppCompiler(cxx=env[0], cache_dir=env[1])
    return comp
