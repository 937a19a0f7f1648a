"""Triton compiles of a program's kernels in worker processes, begun as each kernel is rendered.

Triton's compile is mostly Python (the AST to Triton IR) and holds the interpreter lock, so
threads of one process compile one kernel at a time; ptxas alone runs beside them.  A cold
training compile of a convolutional network renders hundreds of kernels and autotunes dozens,
each of its configs a compile.  ``CompileWorkers`` keeps ``count`` processes
(``compile_worker.py``), each fed by a thread of the compiling process from one queue::

    workers = compile_workers(8)
    workers.submit(key, CompileUnit(text, "fxwrap_reduction_3", launch, ("torch.float32", ...)))
    ...                       # rendering goes on; a worker compiles into Triton's disk cache
    workers.claim(key)        # before binding: waits for the worker that began it
    bind_compiled(...)        # Triton finds the kernel in its cache: no compile here

``submit`` takes one job per key (kernels equal but for their names, the repeated layers of a
model, are keyed alike: ``emitter._launch_key``); urgent jobs (an autotuned kernel's configs,
about to be timed) go before the others.  Workers that fail every job (four, none compiled)
are given no more.  ``claim`` never waits for a job no worker has begun:
it takes it back (the caller compiles as without workers), so a slow start of the workers costs
nothing.  A worker that fails a job, or dies, only means the caller compiles that unit itself.

``FXWRAP_TRITON_COMPILE_WORKERS=N`` sets the count, ``auto`` one a core up to 16 on a GPU (the
cores shared by ``torchrun``'s processes on the host; none under the interpreter, where the worker
only imports the module); unset, none: the binding process compiles, in threads (opt-in for now:
``default_count`` says why).
"""
from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from pathlib import Path

from fxwrap.runtime.launch import TritonLaunch

log = logging.getLogger("fxwrap")

#: how long ``claim`` waits for a worker that began a job before compiling it again itself
CLAIM_TIMEOUT_S = 600.0
#: failed jobs, with none compiled, after which no more jobs are given to the workers
FAILURES_BEFORE_GIVING_UP = 4


#: what a compile reads from the environment that may change after the workers started (a
#: benchmark gives each model empty cache folders): taken at each submit, set in the worker
COMPILE_ENVIRONMENT = ("TRITON_CACHE_DIR", "FXWRAP_CACHE_DIR")


def _compile_environment() -> tuple[tuple[str, str | None], ...]:
    return tuple((name, os.environ.get(name)) for name in COMPILE_ENVIRONMENT)


@dataclasses.dataclass(frozen=True)
class CompileUnit:
    """One compile: the kernel module's ``text`` and the launch of its function ``symbol``
    (config, size symbols, interpreted or not), with the pointer arguments' dtypes, and the
    cache folders of the submitting process when it was made (``COMPILE_ENVIRONMENT``: the
    worker compiles into the Triton cache that process reads)."""

    text: str
    symbol: str
    launch: TritonLaunch
    pointer_dtypes: tuple[str, ...]
    environment: tuple[tuple[str, str | None], ...] = dataclasses.field(default_factory=_compile_environment)


def write_message(stream, value) -> None:
    """``value`` pickled, after its length (8 bytes, little-endian)."""
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def read_message(stream):
    """The next value ``write_message`` wrote on ``stream``; None at its end."""
    header = _read_exactly(stream, 8)
    if header is None:
        return None
    data = _read_exactly(stream, struct.unpack("<Q", header)[0])
    return None if data is None else pickle.loads(data)


def _read_exactly(stream, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _Job:
    """A submitted unit: ``queued`` -> ``running`` (a worker has it) -> ``done``, or ``taken``
    (claimed before any worker began it)."""

    __slots__ = ("unit", "state", "finished", "ok")

    def __init__(self, unit: CompileUnit):
        self.unit, self.state, self.finished, self.ok = unit, "queued", threading.Event(), False


class CompileWorkers:
    """``count`` compile worker processes and their feeding threads (see the module doc)."""

    def __init__(self, count: int):
        self.count = count
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._jobs: dict[tuple, _Job] = {}
        self._lock = threading.Lock()
        self._order = itertools.count()
        self.submitted = 0   # jobs taken (one per key)
        self.compiled = 0    # jobs a worker compiled
        self.failed = 0      # jobs a worker failed (their callers compile them)
        self.taken_back = 0  # jobs claimed before a worker began them
        self.ready = threading.Semaphore(0)  # released once by each worker that started
        self.given_up = False  # every job failed so far: the workers cannot compile here
        root = str(Path(__file__).resolve().parents[3])  # the folder fxwrap is imported from
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self._processes = [subprocess.Popen([sys.executable, "-m", "fxwrap.targets.cuda_triton.compile_worker"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
                           for _ in range(count)]
        self._threads = [threading.Thread(target=self._feed, args=(p,), daemon=True,
                                          name=f"fxwrap-compile-worker-{i}")
                         for i, p in enumerate(self._processes)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: tuple, unit: CompileUnit, urgent: bool = False) -> bool:
        """Queue ``unit`` under ``key`` unless a job of that key was submitted before; True if queued."""
        with self._lock:
            if key in self._jobs or self.given_up:
                return False
            self._jobs[key] = _Job(unit)
            self.submitted += 1
        self._queue.put((0 if urgent else 1, next(self._order), key))
        return True

    def claim(self, key: tuple) -> None:
        """Before the caller compiles the unit of ``key``: wait for the worker that began it
        (it is then in Triton's disk cache); a job no worker has begun is taken back."""
        with self._lock:
            job = self._jobs.get(key)
            if job is None:
                return
            if job.state == "queued":
                job.state = "taken"
                self.taken_back += 1
                return
        if not job.finished.wait(CLAIM_TIMEOUT_S):
            log.warning("fxwrap: the Triton compile worker has not finished %s in %.0f s: compiling it here",
                        job.unit.symbol, CLAIM_TIMEOUT_S)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until one more worker has started (its imports done); False after ``timeout`` s."""
        return self.ready.acquire(timeout=timeout)

    def _feed(self, process: subprocess.Popen) -> None:
        try:  # no job is given to a worker still importing: claim takes queued jobs back
            started = read_message(process.stdout)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError) as error:
            started = f"{type(error).__name__}: {error}"
        if not (isinstance(started, tuple) and started[0] == "ready"):
            log.warning("fxwrap: a Triton compile worker did not start (%s); kernels compile in this process",
                        started if started is not None else f"exit code {process.wait()}")
            return
        self.ready.release()
        while True:
            _, _, key = self._queue.get()
            if key is None:
                return
            with self._lock:
                job = self._jobs[key]
                if job.state != "queued":
                    continue
                job.state = "running"
            answer = None
            try:
                write_message(process.stdin, job.unit)
                answer = read_message(process.stdout)
            except (OSError, ValueError, EOFError, pickle.UnpicklingError) as error:
                log.debug("fxwrap: Triton compile worker %d: %s", process.pid, error)
            with self._lock:
                job.state, job.ok = "done", bool(answer and answer[0])
                if job.ok:
                    self.compiled += 1
                else:
                    self.failed += 1
                give_up = not self.given_up and not self.compiled and self.failed >= FAILURES_BEFORE_GIVING_UP
                self.given_up = self.given_up or give_up
            job.finished.set()
            if give_up:
                log.warning("fxwrap: the Triton compile workers failed %d jobs and compiled none (the last: %s); "
                            "kernels compile in this process (FXWRAP_TRITON_COMPILE_WORKERS=0 starts no workers)",
                            self.failed, answer[1] if answer else "the worker ended")
            if answer is None:  # the worker is gone: its queue share goes to the others
                log.debug("fxwrap: Triton compile worker %d ended (code %s)", process.pid, process.poll())
                return
            if not job.ok:
                log.debug("fxwrap: Triton compile worker: %s failed: %s", job.unit.symbol, answer[1])

    def close(self) -> None:
        """End the workers (their input closed: each exits after its job)."""
        for _ in self._threads:
            self._queue.put((2, next(self._order), None))
        for process in self._processes:
            try:
                process.stdin.close()
            except OSError:
                pass


_WORKERS: CompileWorkers | None = None
_WORKERS_LOCK = threading.Lock()


def compile_workers(count: int) -> CompileWorkers | None:
    """The process's compile workers, started by the first call with ``count`` > 0 (later
    counts are not looked at); None for a count of 0."""
    global _WORKERS
    if count <= 0:
        return None
    with _WORKERS_LOCK:
        if _WORKERS is None:
            _WORKERS = CompileWorkers(count)
            atexit.register(_WORKERS.close)
        return _WORKERS


def default_count(interpret: bool) -> int:
    """``FXWRAP_TRITON_COMPILE_WORKERS``: a count, or ``auto`` (none under the interpreter, on a
    GPU one a core, at most 16, the cores shared among the processes ``torchrun`` started on the
    host: ``LOCAL_WORLD_SIZE``); unset: none, for now.  The one cold-compile measurement with
    workers (H200, 2026-11-29, `benchmarks/models.py --kernel-caches cold`, llama and hf_qwen2 AMP
    training) was slower than the compiling thread's earlier figures (41 s vs 15-18 s for
    llama; the host loaded by killed benchmarks), and their tests have not run on a GPU: until
    both are shown, the workers are opt-in."""
    given = os.environ.get("FXWRAP_TRITON_COMPILE_WORKERS")
    if given is None:
        return 0
    if given.strip() != "auto":
        if not given.strip().isdigit():
            raise ValueError(f"FXWRAP_TRITON_COMPILE_WORKERS={given!r}: expected the number of Triton compile "
                             "worker processes (0: compile in the compiling process) or 'auto' (one a core)")
        return int(given)
    if interpret:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(min(cores // max(int(ranks) if ranks.isdigit() else 1, 1), 16), 1)
