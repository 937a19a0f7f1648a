"""The C++ compiler driver: source text -> cached shared object.

    >>> CppCompiler().compile('extern "C" int fx_one(void) { return 1; }')
    PosixPath('.../cpu_cpp/.../....so')

The compiler is ``$CXX`` (default ``g++``; split as a shell would, so ``CXX="ccache g++"``
works).  Every compiler process runs within ``$FXWRAP_COMPILE_TIMEOUT`` seconds (default
600); one that hangs, fails or writes nothing is a ``CompileError`` naming the command, its
exit status and its stderr.  The cache key is the sha256 of the
source, the flags, the compiler's ``--version`` text and the host CPU (because of
``-march=native``), so a cache shared between machines or toolchains never hands out
a wrong binary.

A source that opens with an emitter's ``SharedPrelude`` (the helpers every kernel starts
with) is compiled with that prelude as a precompiled header, built once per prelude,
flags, compiler and host in the cache (``pch/``): the compiler then skips parsing it (and
``<immintrin.h>``) for every kernel::

    CppCompiler().compile(source_text, prelude=SharedPrelude(PRELUDE, extra="#include <immintrin.h>"))
    # g++ <flags> -include ~/.cache/fxwrap/cpu_cpp/pch/9c/9c41...e0/prelude.h kernel.cpp -o kernel.so
    #   (kernel.cpp: the source less the prelude; prelude.h.gch next to prelude.h)

The key and the cached ``.cpp`` are the full source's; the binary is the same code (a
precompiled header that does not fit the flags is ignored by the compiler, which then
reads ``prelude.h`` as text).  The header is sealed as a kernel binary is
(``prelude.h.gch.sha256``): one whose bytes do not give its seal, or whose ``prelude.h`` is
not the prelude, is a logged warning, removed and built again (a cut one made the compiler
fail on every kernel, which then compiled again without it; a changed one it might read).

A program's kernels, all known at once, compile in a few translation units rather than a
process each (``compile_many``): each unit opens with the prelude, each kernel in a
namespace of its own, and each kernel's entry is a hard link to the unit's shared object::

    CppCompiler().compile_many([source_0, ..., source_20], prelude, units=2)   # 2 g++, not 21
"""
from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import hashlib
import os
import platform
import secrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from fxwrap.targets.host.cache import (
    SEAL, STALE_SECONDS, KernelCache, default_cache_dir, file_digest, write_atomically,
)

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


@dataclasses.dataclass(frozen=True)
class SharedPrelude:
    """Code that kernel sources open with (after their ``//`` comment lines), compiled once
    into a precompiled header; ``extra``: more code precompiled after it (system headers
    some kernels include later, which their include guards then make free)::

        SharedPrelude("#include <cmath>\nstatic inline float fx_relu(float x) { ... }",
                      extra="#if defined(__x86_64__)\n#include <immintrin.h>\n#endif")
    """

    text: str
    extra: str = ""

    def split(self, source: str) -> str | None:
        """``source`` less the prelude where it opens with it (only comment lines and blank
        lines before it); None otherwise."""
        text = self.text.strip("\n")
        at = source.find(text)
        if not text or at < 0 or any(ln.strip() and not ln.lstrip().startswith("//")
                                     for ln in source[:at].split("\n")):
            return None
        return source[:at] + source[at + len(text):]

    def header(self) -> str:
        return f"{self.text.strip(chr(10))}\n{self.extra.strip(chr(10))}\n"


DEFAULT_TIMEOUT_SECONDS = 300.0
TIMEOUT_VARIABLE = "FXWRAP_COMPILE_TIMEOUT"
VERSION_TIMEOUT_SECONDS = 30.0  # ``$CXX --version`` answers at once; a hung one is not waited on for long
NOTICE_SECONDS = 30.0  # a compiler still running after this is named in a warning (``fxwrap.cache``)


def compile_timeout() -> float:
    """Seconds one compiler process may run (``$FXWRAP_COMPILE_TIMEOUT``, default 300): a
    compiler that hangs is killed and its kernel fails with a ``CompileError``."""
    text = os.environ.get(TIMEOUT_VARIABLE)
    if not text:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r}: give the seconds a compiler process may run, "
                         f"a positive number (default {DEFAULT_TIMEOUT_SECONDS:g})")
    return seconds


_RUNNING: set[subprocess.Popen] = set()  # compiler processes under way (the process groups they lead)
_RUNNING_LOCK = threading.Lock()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_running_compilers() -> None:
    """At exit, no compiler outlives the process: a precompiled header still building in
    its background thread would go on writing into the cache after the process ended (a
    test that then removes the cache raced it)."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill_group(proc)


CXX_REMEDY = "install g++ or point CXX at a C++17 compiler with OpenMP"


def run_compiler(cmd: list[str], language: str = "C++", remedy: str = CXX_REMEDY,
                 timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a compiler process) to its end, within ``timeout`` seconds (default
    ``compile_timeout()``).  One still running after ``NOTICE_SECONDS`` (or a quarter of the
    timeout, if less) is named in a warning, so a long wait is never silent.

    Raises ``CompileError`` naming the command where it cannot start or runs past the
    timeout (then it is killed); the caller reads the exit status and stderr of the rest.
    """
    timeout = compile_timeout() if timeout is None else timeout
    try:
        # a session of its own: a timeout kills the compiler's whole process group (g++'s
        # cc1plus and as, ccache's compiler), not only the driver
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        raise CompileError(f"the {language} compiler cannot run: {exc}\ncommand: {shlex.join(cmd)}\n"
                           f"{remedy}") from exc
    with _RUNNING_LOCK:
        _RUNNING.add(proc)
    notice = min(NOTICE_SECONDS, timeout / 4)
    try:
        try:
            stdout, stderr = proc.communicate(timeout=notice)
        except subprocess.TimeoutExpired:
            _CACHE_LOG.warning("fxwrap: the %s compiler has run %g s and is still running; it is killed after "
                               "%g s (%s): %s", language, notice, timeout, TIMEOUT_VARIABLE, shlex.join(cmd)[:300])
            stdout, stderr = proc.communicate(timeout=timeout - notice)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        _, stderr = proc.communicate()
        raise CompileError(f"the {language} compiler ran past {timeout:g} s and was killed\ncommand: {shlex.join(cmd)}"
                           f"\nstderr: {stderr[-4000:] or '(empty)'}\nraise {TIMEOUT_VARIABLE} (seconds) "
                           f"if it is only slow, or use a compiler that finishes ({remedy})") from exc
    except BaseException:  # interrupted: leave no compiler running
        _kill_group(proc)
        proc.wait()
        raise
    finally:
        with _RUNNING_LOCK:
            _RUNNING.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


class CompilerCrash(CompileError):
    """The compiler crashed on a kernel (``internal compiler error``, or killed by a signal):
    the kernel builder runs that kernel's ops as ATen externs.  It says so through
    ``compiler_crashed`` (``core.errors.compiler_crashed``): a loaded program imports this
    module, and it imports nothing of the compiler."""

    compiler_crashed = True


def compiler_error(cmd: list[str], proc: subprocess.CompletedProcess, what: str,
                   language: str = "C++") -> CompileError:
    """The error for a compiler process that ended without doing its work: ``what`` it
    should have done, the command, its exit status and its stderr (a ``CompilerCrash`` where
    the compiler itself crashed)."""
    crashed = proc.returncode < 0 or "internal compiler error" in (proc.stderr or "")
    return (CompilerCrash if crashed else CompileError)(
        f"the {language} compiler {what} (exit status {proc.returncode})\n"
        f"command: {shlex.join(cmd)}\nstderr: {proc.stderr[-8000:] or '(empty)'}")


@functools.lru_cache(maxsize=None)
def _version(cxx: str, language: str = "C++", remedy: str = CXX_REMEDY) -> str:
    """``$CXX --version``'s output (``CXX`` split as a shell would: ``ccache g++``)."""
    cmd = [*shlex.split(cxx), "--version"]
    proc = run_compiler(cmd, language, remedy, timeout=min(VERSION_TIMEOUT_SECONDS, compile_timeout()))
    if proc.returncode != 0:
        raise compiler_error(cmd, proc, f"{cxx!r} cannot report its version; {remedy}", language)
    return proc.stdout


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
    others (one ``g++`` per distinct source in a process; processes race through the cache).
    The language is a few class attributes (``CCompiler`` sets them for C)."""

    language = "C++"               # in errors: "the C++ compiler failed ..."
    source_suffix = ".cpp"         # the cached source's file (the compiler reads the language off it)
    header_language = "c++-header"  # ``-x`` of the precompiled prelude
    compiler_variable, default_command = "CXX", "g++"
    remedy = CXX_REMEDY
    default_flags = DEFAULT_FLAGS

    def __init__(self, cxx: str | None = None, flags=None, cache_dir=None):
        self.cxx = cxx or os.environ.get(self.compiler_variable) or self.default_command
        self.flags = tuple(flags) if flags is not None else self.default_flags
        self.cache = KernelCache(cache_dir if cache_dir is not None else default_cache_dir(),
                                 source_suffix=self.source_suffix)
        self._lock = threading.Lock()
        self._building: dict[str, Future] = {}  # key -> the shared object's path, being built
        self._preludes: dict[tuple, Path | None] = {}  # (prelude, extra flags) -> its header (None: none)
        self._prelude_lock = threading.Lock()
        self._prelude_builds: dict[tuple, threading.Thread] = {}  # headers being built

    @property
    def version(self) -> str:
        return _version(self.cxx, self.language, self.remedy)

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

    def compile(self, source: str, extra_flags=(), prelude: SharedPrelude | None = None) -> Path:
        """The cached shared object for ``source``, compiling it if needed (with ``prelude``
        precompiled where ``source`` opens with it)."""
        key = self.key(source, extra_flags)

        def build(src: Path, out: Path) -> None:
            rest = prelude.split(source) if prelude is not None else None
            self._build(src, out, key, source, rest, prelude, extra_flags)

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

    def compile_many(self, sources: list[str], prelude: SharedPrelude, units: int) -> None:
        """Fill the cache for every source of ``sources`` not in it yet, in at most ``units``
        compiler processes at once (one translation unit each) rather than one per source: a
        compiler process costs a start, the prelude's parse (or its precompiled header's load)
        and a link whatever it compiles, which for most kernels is more than their own code.

        A unit opens with ``prelude`` and holds each source less it in a namespace of its own
        (the sources' ``extern "C"`` symbols must differ: ``loader.shared_source`` names them
        by their code); every source's entry is then a hard link to the unit's shared object::

            g++ <flags> unit.cpp -o unit.so       # unit.cpp: prelude, then
                                                  # namespace fxwrap_unit_0 { <source 0 less the prelude> }
                                                  # namespace fxwrap_unit_1 { <source 1 less the prelude> } ...
            cpu_cpp/3f/3f2a...e1.so -> unit.so    # each source's entry (and its own .cpp)

        Sources that do not open with the prelude, and every source of a unit that does not
        build, are left to ``compile`` (one process each, which reports the failing kernel)."""
        keys: dict[str, str] = {}  # key -> source: each distinct source once, in order
        for source in sources:
            key = self.key(source)
            if key not in keys and prelude.split(source) is not None and self.cache.lookup(key) is None:
                keys[key] = source
        if len(keys) < 2:
            return
        groups = _balanced([(key, prelude.split(source)) for key, source in keys.items()], units)
        if len(groups) == 1:
            self._compile_unit(groups[0], keys, prelude)
            return
        with ThreadPoolExecutor(len(groups), thread_name_prefix="fxwrap-unit") as pool:
            list(pool.map(lambda group: self._compile_unit(group, keys, prelude), groups))

    def _compile_unit(self, group: list[tuple[str, str]], sources: dict[str, str], prelude: SharedPrelude) -> None:
        """Build one translation unit of ``group`` (``(key, source less the prelude)``) and
        link each key's cache entry to it; a unit that fails leaves its keys uncached."""
        unit_key = hashlib.sha256("\0".join(key for key, _ in group).encode()).hexdigest()
        text = prelude.text.strip("\n") + "\n" + prelude.extra.strip("\n") + "\n" + "".join(
            f"namespace fxwrap_unit_{i} {{\n{rest.strip(chr(10))}\n}}  // namespace fxwrap_unit_{i}\n"
            for i, (_, rest) in enumerate(group))

        # a private folder, its files named by the unit's key: the binary records its source's name
        work = self.cache.dir / "units" / f".{unit_key}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
        try:
            work.mkdir(parents=True)
            src, out = work / f"{unit_key}.cpp", work / f"{unit_key}.so"
            src.write_text(text)
            # the precompiled prelude where it is built already; a unit parses the prelude once
            # anyway, and building the header would take the cores its compilers need
            self._build(src, out, unit_key, text, prelude.split(text), prelude, keep_failed=False, start_header=False)
            for key, _ in group:  # each entry: its own source (for humans), its binary a link to the unit's
                final = self.cache.path(key)
                final.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(self.cache.path(key, ".cpp"), sources[key].encode())
                link = work / f"{key}.so"
                try:
                    os.link(out, link)
                except OSError:  # a file system without hard links: a copy
                    shutil.copyfile(out, link)
                self.cache.commit(key, link)  # the entry's commit point
        except (CompileError, OSError) as exc:  # each kernel compiles alone, naming the one that fails
            _CACHE_LOG.debug("a unit of %d kernels did not build; they compile one by one: %s", len(group), exc)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _build(self, src: Path, out: Path, key: str, source: str, rest: str | None, prelude: SharedPrelude | None,
               extra_flags=(), keep_failed: bool = True, start_header: bool = True) -> None:
        """Compile ``src`` (holding ``source``) to ``out``: ``rest`` (``source`` less the
        prelude) with the prelude's precompiled header where it is ready (``start_header``:
        its build starts if it has not), else the whole source; a failure is a
        ``CompileError`` (the source kept beside the entry: ``keep_failed``)."""
        header = self.precompiled_header(prelude, extra_flags, start=start_header) if rest is not None else None
        if header is not None:
            short = src.parent / "pch" / src.name  # the same file name: the same binary
            try:
                short.parent.mkdir(exist_ok=True)
                short.write_text(rest)
                cmd = [*shlex.split(self.cxx), *self.flags, *extra_flags, "-include", str(header), str(short),
                       "-o", str(out)]
                if run_compiler(cmd, self.language, self.remedy).returncode == 0 and out.is_file():
                    return
            finally:  # a failure with the header: compile the whole source, which reports it
                short.unlink(missing_ok=True)
        cmd = self.command(src, out, extra_flags)
        proc = run_compiler(cmd, self.language, self.remedy)
        if header is not None and proc.returncode == 0:
            # the kernel builds without the header and not with it: the next compile checks the
            # header on disk again (damaged since this process checked it: built again)
            with self._prelude_lock:
                if self._preludes.get((prelude, tuple(extra_flags))) == header:
                    del self._preludes[(prelude, tuple(extra_flags))]
        if proc.returncode != 0 or not out.is_file():
            what = "failed" if proc.returncode != 0 else f"exited 0 but wrote no {out.name}"
            if keep_failed:
                keep = self.cache.path(key, ".failed" + self.source_suffix)  # beside the entry: the build folder goes
                keep.write_text(source)
                what += f" on the kernel saved at {keep}"
            raise compiler_error(cmd, proc, what, self.language)

    def precompiled_header(self, prelude: SharedPrelude, extra_flags=(), wait: bool = False,
                           start: bool = True) -> Path | None:
        """``prelude.h`` (with ``prelude.h.gch`` beside it) in the cache; None while it is
        being built (on first use, in a thread of its own: the kernels compile meanwhile
        without it, so a small program never waits for it; ``wait``: until it is built), where
        it is not built and not to be (``start`` False) and where the compiler cannot
        precompile it.  Processes race harmlessly: each file is renamed into place."""
        wanted = (prelude, tuple(extra_flags))
        with self._prelude_lock:
            if wanted in self._preludes:
                ready, build = self._preludes[wanted], None
            else:
                h = hashlib.sha256()
                for part in ("fxwrap precompiled prelude", prelude.header(),
                             " ".join(self.flags + tuple(extra_flags)), self.cxx, self.version, host_fingerprint()):
                    h.update(part.encode())
                    h.update(b"\0")
                key = h.hexdigest()
                folder = self.cache.dir / "pch" / key[:2] / key
                header = folder / "prelude.h"
                if _header_intact(folder, prelude):
                    ready = self._preludes[wanted] = header
                    build = None
                elif not start:
                    return None
                else:
                    ready = self._preludes[wanted] = None
                    build = threading.Thread(target=self._build_header, name="fxwrap-pch", daemon=True,
                                             args=(wanted, prelude, extra_flags, folder))
                    self._prelude_builds[wanted] = build
                    build.start()
            pending = self._prelude_builds.get(wanted)
        if wait and pending is not None:
            pending.join()
            with self._prelude_lock:
                ready = self._preludes[wanted]
        return ready

    def _build_header(self, wanted, prelude: SharedPrelude, extra_flags, folder: Path) -> None:
        header, gch = folder / "prelude.h", folder / "prelude.h.gch"
        tmp = folder / f".prelude.{os.getpid()}.{threading.get_ident()}.gch.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _sweep_stale(folder)
            write_atomically(header, prelude.header().encode())
            flags = [f for f in (*self.flags, *extra_flags) if f != "-shared"]
            proc = run_compiler([*shlex.split(self.cxx), *flags, "-x", self.header_language, str(header), "-o", str(tmp)],
                                self.language, self.remedy)
            if proc.returncode == 0 and tmp.is_file():
                # sealed as a kernel binary is (its seal first, then the header: the commit point)
                write_atomically(gch.with_name(gch.name + SEAL), file_digest(tmp).encode())
                os.replace(tmp, gch)
            else:
                _CACHE_LOG.debug("no precompiled prelude (%s): %s", self.cxx, proc.stderr[-2000:])
        except (OSError, ValueError, CompileError) as exc:  # kernels compile without it
            _CACHE_LOG.debug("no precompiled prelude: %s", exc)
        finally:
            tmp.unlink(missing_ok=True)
        with self._prelude_lock:
            self._preludes[wanted] = header if gch.is_file() else None
            self._prelude_builds.pop(wanted, None)


def _header_intact(folder: Path, prelude: SharedPrelude) -> bool:
    """Whether ``folder`` holds the precompiled ``prelude`` whole: ``prelude.h`` with the
    prelude's text and ``prelude.h.gch`` whose bytes give its seal.  A damaged one is removed
    (a warning; one without a seal, from an fxwrap that sealed none, silently) so that it is
    built again: the compiler fails on a cut header ("cannot read PCH file", and every kernel
    then compiled twice, the second time without it), and a changed one it may read as code.
    Costs a sha256 of the header (tens of MB) once per process and prelude."""
    header, gch = folder / "prelude.h", folder / "prelude.h.gch"
    seal = gch.with_name(gch.name + SEAL)
    if not gch.is_file() or not header.is_file():
        return False
    try:
        expected = seal.read_text().strip() if seal.is_file() else None
        if expected is None:
            reason = None
        elif header.read_bytes() != prelude.header().encode():
            reason = "its prelude.h is not the prelude's text"
        elif file_digest(gch) != expected:
            reason = "its bytes do not match its seal"
        else:
            return True
    except OSError as exc:
        reason = f"it cannot be read ({exc})"
    if reason is None:  # written by an fxwrap that sealed none: not known to be good
        _CACHE_LOG.debug("precompiled header %s has no seal: building it again", gch)
    else:
        _CACHE_LOG.warning("fxwrap: precompiled header %s is damaged (%s): building it again; kernels compile "
                           "without it meanwhile", gch, reason)
    for path in (seal, gch):
        path.unlink(missing_ok=True)
    return False


def _sweep_stale(folder: Path) -> None:
    """Remove temporaries of header builds that died (older than an hour)."""
    now = time.time()
    for tmp in folder.glob(".prelude.*.gch.tmp"):
        try:
            if now - tmp.stat().st_mtime > STALE_SECONDS:
                tmp.unlink()
        except FileNotFoundError:
            pass


def _balanced(items: list[tuple[str, str]], units: int) -> list[list[tuple[str, str]]]:
    """``items`` (``(key, text)``) in at most ``units`` groups of about equal text (largest
    first, each to the group with the least so far; ties by order): the same groups for the
    same items, each group in the items' order."""
    count = max(1, min(units, len(items)))
    sizes, groups = [0] * count, [[] for _ in range(count)]
    for index in sorted(range(len(items)), key=lambda i: (-len(items[i][1]), i)):
        g = min(range(count), key=lambda j: (sizes[j], j))
        sizes[g] += len(items[index][1])
        groups[g].append(index)
    return [[items[i] for i in sorted(group)] for group in groups if group]


class CCompiler(CppCompiler):
    """The host C compiler (``$CC``, default ``cc``), for a dialect that writes C: the same
    driver and cache as ``CppCompiler``, the source cached as ``<key>.c``, errors saying
    "the C compiler failed"::

        CCompiler(flags=("-std=c99", "-O2", "-shared", "-fPIC")).compile(c_source)  # -> .../<key>.so

    ``compile_many`` (translation units in C++ namespaces) is C++ only."""

    language = "C"
    source_suffix = ".c"
    header_language = "c-header"
    compiler_variable, default_command = "CC", "cc"
    remedy = "install a C compiler (cc) or point CC at one"
    default_flags = ("-std=c99", "-O2", "-shared", "-fPIC")

    def compile_many(self, sources, prelude, units) -> None:
        raise NotImplementedError(f"{type(self).__name__}: translation units of several kernels are C++ only "
                                  "(namespaces); compile each source with compile()")


_DEFAULTS: dict[tuple, CppCompiler] = {}


def default_compiler() -> CppCompiler:
    """The compiler for the current ``$CXX`` and ``$FXWRAP_CACHE_DIR`` (one per pair)."""
    env = (os.environ.get("CXX") or "g++", str(default_cache_dir()))
    comp = _DEFAULTS.get(env)
    if comp is None:
        comp = _DEFAULTS[env] = CppCompiler(cxx=env[0], cache_dir=env[1])
    return comp
