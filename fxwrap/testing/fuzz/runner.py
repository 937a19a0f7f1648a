"""Run many fuzz programs on one target and count what happened.

    summary = fuzz("cpu", programs=200, seed=0, out="fuzz-out")
    print(summary.report())

Program ``i`` is ``generate(seed + i)``.  Each is checked against eager
(``harness.check``); a failure is written as a reproducer under ``out``.  The file
``out/running_<target>.py`` holds the program being checked, so a crash that ends the
process (a kernel that segfaults) still leaves its reproducer behind.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fxwrap.testing.fuzz import harness
from fxwrap.testing.fuzz.bad_inputs import check_bad_inputs
from fxwrap.testing.fuzz.generator import generate, load
from fxwrap.testing.fuzz.reproducer import write_reproducer

# worst first: the order the summary lists failures in
STATUSES = ("mismatch", "runtime_error", "compile_error", "bad_input", "generator_error")


@dataclass
class Failure:
    """One program that did not pass: ``seed``, ``status`` (one of ``STATUSES``), the message
    and the reproducer written for it (None where no ``out`` was given)."""

    seed: int
    status: str
    message: str
    path: Path | None = None


@dataclass
class Summary:
    """The counts of one fuzz run on ``target``; ``seeds`` are those run (``first`` onwards:
    fewer than asked for where a time limit stopped the run)."""

    target: str
    first: int
    programs: int = 0
    seeds: list[int] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    bad_input_programs: int = 0
    bad_input_calls: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def report(self) -> str:
        seeds = sorted(self.seeds)
        span = f"seeds {seeds[0]}..{seeds[-1]}" if seeds else "no seeds"
        if seeds and len(seeds) != seeds[-1] - seeds[0] + 1:
            span = f"{len(seeds)} of {span} (the time limit stopped the rest)"
        lines = [f"fxwrap fuzz: target {self.target!r}, {span}, {self.programs} programs in {self.seconds:.0f} s",
                 f"  passed          {self.counts['pass']}",
                 f"  mismatches      {self.counts['mismatch']}   (wrong numbers: the worst)",
                 f"  runtime errors  {self.counts['runtime_error']}   (the compiled program raised)",
                 f"  compile errors  {self.counts['compile_error']}   (fxwrap raised while compiling)",
                 f"  bad inputs      {self.counts['bad_input']} failing of {self.bad_input_programs} programs, "
                 f"{self.bad_input_calls} calls (not eager's numbers and not an InputMismatchError)",
                 f"  torch errors    {self.counts['torch_error']}   (torch.compile fails, or differs from eager, without fxwrap too: "
                 "not counted as failures)",
                 f"  generator errors {self.counts['generator_error']}"]
        for failure in sorted(self.failures, key=lambda f: (STATUSES.index(f.status), f.seed)):
            where = f"  -> {failure.path}" if failure.path else ""
            lines.append(f"  FAIL seed {failure.seed} {failure.status}: {failure.message[:300]}{where}")
        return "\n".join(lines)


    def merge(self, other: "Summary") -> None:
        """Add the programs of ``other`` (a run over other seeds of the same target)."""
        self.programs += other.programs
        self.seeds += other.seeds
        self.counts.update(other.counts)
        self.failures += other.failures
        self.bad_input_programs += other.bad_input_programs
        self.bad_input_calls += other.bad_input_calls


def fuzz(target: str, programs: int = 100, seed: int = 0, out: str | Path | None = None,
         bad_inputs_every: int = 10, log=None, jobs: int = 1, stop_at: float | None = None,
         warnings_shown: bool = True) -> Summary:
    """Check ``programs`` programs from ``seed`` on ``target``; every ``bad_inputs_every``-th
    program (0: none) also goes through the bad-input fuzzer.  ``jobs`` > 1 runs them in that
    many worker processes, in chunks of seeds; ``stop_at`` (a ``time.time()``) starts no
    program after it; ``warnings_shown=False`` hides the Python warnings the programs give
    (eager's own deprecations and degrees-of-freedom warnings, ``fxwrap fuzz --quiet``)."""
    if jobs > 1:
        return _fuzz_in_workers(target, programs, seed, out, bad_inputs_every, log, jobs, stop_at, warnings_shown)
    with _expected_errors_unlogged(), warnings.catch_warnings():
        if not warnings_shown:
            warnings.simplefilter("ignore")
        return _fuzz(target, programs, seed, out, bad_inputs_every, log, stop_at)


# Loggers that report, with a traceback, each program eager itself rejects: a fuzzed program
# may be invalid (a bad broadcast), which the summary counts as a torch error; the 812 lines
# of fake-tensor tracebacks 200 passing programs printed said nothing more.
_EXPECTED_ERROR_LOGGERS = ("torch._subclasses.fake_tensor",)


@contextlib.contextmanager
def _expected_errors_unlogged():
    loggers = [logging.getLogger(name) for name in _EXPECTED_ERROR_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _fuzz(target, programs, seed, out, bad_inputs_every, log, stop_at) -> Summary:
    summary = Summary(target, seed)
    start = time.perf_counter()
    out = Path(out) if out is not None else None
    running = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        running = out / f"running_{target.replace('-', '_')}.py"
    for current in range(seed, seed + programs):
        if stop_at is not None and time.time() > stop_at:
            break
        summary.seeds.append(current)
        try:
            source = generate(current)
        except Exception as error:  # noqa: BLE001 - the generator's own bug, counted
            summary.programs += 1
            summary.counts["generator_error"] += 1
            summary.failures.append(Failure(current, "generator_error", f"{type(error).__name__}: {error}"))
            continue
        if running is not None:
            running.write_text(source)
        status, message = harness.check(load(source), target)
        results = [(status, message)]
        if bad_inputs_every and (current - seed) % bad_inputs_every == 0:
            problems, calls = check_bad_inputs(load(source), target)
            summary.bad_input_programs += 1
            summary.bad_input_calls += calls
            if problems:
                results.append(("bad_input", "; ".join(problems)))
        summary.programs += 1
        summary.counts[status] += 1
        for result, text in results:
            if result == "pass":
                continue
            if result == "bad_input":
                summary.counts["bad_input"] += 1
            path = write_reproducer(out, source, current, target, result, text) \
                if out is not None and result != "bad_input" else None
            if out is not None and result == "bad_input":
                path = out / f"bad_inputs_{target.replace('-', '_')}_seed_{current}.txt"
                path.write_text(f"{text}\n\n{source}")
            if result != "torch_error":
                summary.failures.append(Failure(current, result, text, path))
            if log is not None:
                log(f"seed {current}: {result}: {text[:300]}")
        if log is not None and (current - seed + 1) % 50 == 0:
            log(f"{current - seed + 1} programs, {len(summary.failures)} failures, "
                f"{time.perf_counter() - start:.0f} s")
    if running is not None and running.exists():
        running.unlink()
    summary.seconds = time.perf_counter() - start
    return summary


CHUNK = 10  # seeds per task of a worker


def _chunk(args) -> Summary:
    target, first, count, out, bad_inputs_every, stop_at, warnings_shown = args
    return fuzz(target, count, first, None if out is None else Path(out) / f"chunk_{first}", bad_inputs_every,
                stop_at=stop_at, warnings_shown=warnings_shown)


def _fuzz_in_workers(target, programs, seed, out, bad_inputs_every, log, jobs, stop_at, warnings_shown) -> Summary:
    """``fuzz`` over ``jobs`` spawned processes, ``CHUNK`` seeds per task, merged in seed order."""
    start = time.perf_counter()
    tasks = [(target, first, min(CHUNK, seed + programs - first), None if out is None else str(out),
              bad_inputs_every, stop_at, warnings_shown) for first in range(seed, seed + programs, CHUNK)]
    summary = Summary(target, seed)
    context = multiprocessing.get_context("spawn")  # a fresh torch per worker, no forked state
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for part in pool.map(_chunk, tasks):
            summary.merge(part)
            if log is not None:
                for failure in part.failures:
                    log(f"seed {failure.seed}: {failure.status}: {failure.message[:300]}")
                if summary.programs and summary.programs % 100 < CHUNK:
                    log(f"{summary.programs} programs, {len(summary.failures)} failures, "
                        f"{time.perf_counter() - start:.0f} s")
    summary.seconds = time.perf_counter() - start
    return summary
