"""Differential sweep of PyTorch's OpInfo database through fxwrap.

For every OpInfo in ``op_db`` that supports float32 on the CPU and whose results are
well defined (see ``excluded_reason``), the first ``samples_per_op`` samples of
``op.sample_inputs("cpu", torch.float32)`` are run three ways:

* eager (the reference),
* ``torch.compile(fn, backend="fxwrap")``,
* ``torch.compile(fn, backend="aot_eager")`` (how far PyTorch's own stack gets),

where ``fn(*tensors)`` calls ``op.op`` with the sample's input, args and kwargs: every
tensor leaf of those becomes a compiled-function input, everything else is closed
over.  fxwrap's outputs, and the state of every tensor input after the call (ops may
mutate them), are compared with eager's.

Filter, decided per op before any compile:

* ``float32`` not in ``op.supported_dtypes("cpu")``: not an op on this dtype;
* ``op.has_nondeterministic_output``: OpInfo's own flag for ops whose results are
  not defined by their inputs (``empty``, ``empty_like``, ``new_empty``, ...
  return uninitialised memory);
* random ops: while eager runs each sample, a dispatch mode records every ATen op;
  any op tagged ``torch.Tag.nondeterministic_seeded`` (``rand*``, ``normal``,
  ``bernoulli``, ``uniform_``, ``multinomial``, ``native_dropout``, ``rrelu`` in
  training, ``fractional_max_pool``'s samples, ...) excludes the whole OpInfo.  The
  tag is PyTorch's own marking of "result depends on the RNG state", so nothing is
  filtered by name.

Samples whose eager reference raises are not samples of the op (OpInfo keeps a few
that only some backends accept) and are dropped, as are samples with sparse tensor
inputs (fxwrap compiles strided tensors); an op left with no sample is listed as
excluded with the reason.

Outputs are compared with ``torch.testing.assert_close(..., equal_nan=True)`` at its
float32 defaults (rtol 1.3e-6, atol 1e-5), the tolerances OpInfo tests use; integer
and bool results, and non-tensor results (Python scalars, sizes), must be equal.

Run it from the command line::

    python tests/models/opinfo_sweep.py                  # every op, in this process
    python tests/models/opinfo_sweep.py --jobs 2         # every op, 2 worker processes
    python tests/models/opinfo_sweep.py --extern mm sort # options={"kernels": False}
    python tests/models/opinfo_sweep.py --grad softmax   # compare input gradients too
    python tests/models/opinfo_sweep.py --device cuda --dtype bfloat16 --jobs 8
                                       # samples made on cuda in bf16 (assert_close's bf16 tolerances)
    python tests/models/opinfo_sweep.py --aot failures   # aot_eager only where fxwrap fails
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

# One sample as a compiled function, compared with eager: shared with the conformance kit.
from fxwrap.testing.opinfo import (  # noqa: F401  (Case, compare, ...: this module's API too)
    DEVICE, DTYPE, Case, Outcome, all_ops, compare, dynamo_settings, eager_cases, excluded_reason, is_random,
    op_id, returns_uninitialised, run_backend, samples, select_ops,
)

SAMPLES_PER_OP = 2


# -- the sweep -----------------------------------------------------------------------

@dataclass
class SweepResult:
    ops: int = 0  # OpInfos with at least one compared sample
    samples: int = 0
    mismatches: list[tuple[str, int, str]] = field(default_factory=list)
    fxwrap_errors: list[tuple[str, int, str]] = field(default_factory=list)
    aot_errors: list[tuple[str, int, str]] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)
    through_fxwrap: int = 0  # samples where at least one fxwrap program ran
    seconds: float = 0.0
    # OpInfo name -> "kernels" (every passing sample ran in generated kernels only),
    # "externs" (ATen calls only), "mixed"
    execution: dict[str, str] = field(default_factory=dict)
    # low-precision samples outside eager's tolerance but as close to the float64 result
    # as eager's (fxwrap computes in float32 where eager rounds between steps)
    arbitrated: list[tuple[str, int, str]] = field(default_factory=list)

    def summary(self) -> str:
        kinds = list(self.execution.values())
        return (f"opinfo sweep: {self.ops} ops, {self.samples} samples, "
                f"{len(self.mismatches)} mismatches, {len(self.fxwrap_errors)} fxwrap errors, "
                f"{len(self.aot_errors)} aot_eager errors, "
                f"{len(self.arbitrated)} low-precision samples judged against float64 "
                f"({self.through_fxwrap} samples ran fxwrap programs, {len(self.excluded)} ops "
                f"excluded, {self.seconds:.0f}s); ops by execution: {kinds.count('kernels')} "
                f"generated kernels only, {kinds.count('mixed')} kernels and ATen externs, "
                f"{kinds.count('externs')} ATen externs only")

    def report(self, excluded: bool = False) -> str:
        lines = [self.summary()]
        if excluded:
            lines += [f"  EXCLUDED {name}: {why}" for name, why in sorted(self.excluded.items())]
        for title, rows in (("MISMATCH", self.mismatches), ("FXWRAP ERROR", self.fxwrap_errors),
                            ("AOT_EAGER ERROR", self.aot_errors), ("CLOSER TO FLOAT64", self.arbitrated)):
            for name, index, detail in rows:
                lines.append(f"  {title} {name} sample {index}: {detail.splitlines()[0] if detail else ''}")
        return "\n".join(lines)

    def merge(self, other: "SweepResult") -> None:
        self.ops += other.ops
        self.samples += other.samples
        self.mismatches += other.mismatches
        self.fxwrap_errors += other.fxwrap_errors
        self.aot_errors += other.aot_errors
        self.excluded.update(other.excluded)
        self.through_fxwrap += other.through_fxwrap
        self.seconds += other.seconds
        self.execution.update(other.execution)
        self.arbitrated += other.arbitrated


def sweep_op(op, samples_per_op: int = SAMPLES_PER_OP, options=None, grad: bool = False,
             aot_every_sample: bool = True, device: str = DEVICE, dtype: torch.dtype = DTYPE) -> SweepResult:
    """Sweep one OpInfo (see module docstring); ``aot_every_sample=False``: aot_eager runs
    only the samples fxwrap fails (all its verdict needs: which fxwrap errors PyTorch's own
    stack shares), not every sample (the full sweep's statistic)."""
    result = SweepResult()
    start = time.perf_counter()
    name = op_id(op)
    reason = excluded_reason(op, device, dtype)
    sample_list, why = samples(op, samples_per_op, grad, device, dtype) if reason is None else ([], None)
    reason = reason or why
    if reason is None and grad and not op.supports_autograd:
        reason = "grad sweep: no autograd support"
    if reason is not None:
        result.excluded[name] = reason
        return result
    cases, dropped, seen = eager_cases(op, sample_list, grad)
    if is_random(seen):
        result.excluded[name] = "random (an ATen op tagged nondeterministic_seeded ran)"
        return result
    if returns_uninitialised(seen):
        result.excluded[name] = "uninitialised output (eager ran only aten.empty* allocations)"
        return result
    kernels = externs = 0
    for index, case, expected, expected_inputs in cases:
        result.samples += 1
        fx = run_backend(case, "fxwrap", expected, expected_inputs, options)
        kernels, externs = kernels + fx.kernels, externs + fx.externs
        aot = run_backend(case, "aot_eager", expected, expected_inputs) \
            if aot_every_sample or fx.status != "ok" else None
        if fx.arbitrated:
            result.arbitrated.append((name, index, fx.arbitrated))
        if fx.status == "mismatch":
            result.mismatches.append((name, index, fx.detail))
        elif fx.status == "error":
            result.fxwrap_errors.append((name, index, fx.detail))
        if fx.programs:
            result.through_fxwrap += 1
        if aot is not None and aot.status == "error":
            result.aot_errors.append((name, index, aot.detail))
    if cases:
        result.ops = 1
        if kernels or externs:
            result.execution[name] = "mixed" if kernels and externs else "kernels" if kernels else "externs"
    else:
        result.excluded[name] = "no usable sample: " + "; ".join(dropped)
    result.seconds = time.perf_counter() - start
    return result


def sweep(ops, samples_per_op: int = SAMPLES_PER_OP, progress=None, options=None,
          grad: bool = False, aot_every_sample: bool = True, device: str = DEVICE,
          dtype: torch.dtype = DTYPE) -> SweepResult:
    """Sweep ``ops`` in this process; ``progress(line)`` hears each op as it starts.

    ``options`` go to the fxwrap backend (``{"kernels": False}``: every op an extern);
    ``grad=True`` also compares input gradients (forward and backward programs);
    ``device``/``dtype``: where and in what the samples are made (default cpu, float32;
    results compare at ``assert_close``'s defaults for the dtype).
    """
    total = SweepResult()
    start = time.perf_counter()
    for op in ops:
        if progress is not None:
            progress(f"# {op_id(op)}")
        with dynamo_settings():
            r = sweep_op(op, samples_per_op, options, grad, aot_every_sample, device, dtype)
        if progress is not None and (r.mismatches or r.fxwrap_errors):
            progress(r.report())
        total.merge(r)
    total.seconds = time.perf_counter() - start
    return total


# -- in parallel, one process per shard ----------------------------------------------
# Each shard runs ``python opinfo_sweep.py --worker --json OUT NAME...``.  A shard that
# dies (a segfault in some op) is reported as a crash of the op it was running, and
# the rest of its ops run in a fresh process.

def _to_json(result: SweepResult, done: list[str]) -> dict:
    return {"ops": result.ops, "samples": result.samples, "mismatches": result.mismatches,
            "fxwrap_errors": result.fxwrap_errors, "aot_errors": result.aot_errors,
            "excluded": result.excluded, "through_fxwrap": result.through_fxwrap,
            "seconds": result.seconds, "execution": result.execution, "arbitrated": result.arbitrated,
            "done": done}


def _from_json(data: dict) -> tuple[SweepResult, list[str]]:
    r = SweepResult(data["ops"], data["samples"], [tuple(x) for x in data["mismatches"]],
                    [tuple(x) for x in data["fxwrap_errors"]], [tuple(x) for x in data["aot_errors"]],
                    dict(data["excluded"]), data["through_fxwrap"], data["seconds"],
                    dict(data.get("execution", {})), [tuple(x) for x in data.get("arbitrated", [])])
    return r, list(data["done"])


OP_TIMEOUT_S = 300.0  # an op whose samples take longer than this hangs (a kernel that never returns)


def _run_shard(names: list[str], op_timeout: float = OP_TIMEOUT_S,
               flags: tuple[str, ...] = ()) -> tuple[SweepResult, list[tuple[str, str]]]:
    import json
    import os
    import subprocess
    import tempfile

    total, crashes = SweepResult(), []
    remaining = list(names)
    while remaining:
        with tempfile.TemporaryDirectory() as tmp:
            out, log, err_path = (os.path.join(tmp, n) for n in ("result.json", "progress.txt", "stderr.txt"))
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--json", out, "--log", log,
                   *flags, *remaining]
            with open(err_path, "w") as err_file:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file)
                last_count, last_change, code = -1, time.monotonic(), None
                while code is None:
                    try:
                        code = proc.wait(timeout=2.0)
                    except subprocess.TimeoutExpired:
                        count = os.path.getsize(log) if os.path.exists(log) else 0
                        if count != last_count:
                            last_count, last_change = count, time.monotonic()
                        elif time.monotonic() - last_change > op_timeout:
                            proc.kill()
                            proc.wait()
                            code = f"killed after {op_timeout:.0f}s without progress"
            done: list[str] = []
            if os.path.exists(out):
                with open(out) as f:
                    result, done = _from_json(json.load(f))
                total.merge(result)
            if code == 0:
                return total, crashes
            started = []
            if os.path.exists(log):
                with open(log) as f:
                    started = [line[2:].strip() for line in f if line.startswith("# ")]
            with open(err_path) as f:
                tail = " | ".join(f.read().strip().splitlines()[-4:])[:600]
            culprit = next((n for n in started if n not in done), None)
            crashes.append((culprit or "(after its last op)", f"worker exited with {code}: {tail}"))
            finished = set(done) | ({culprit} if culprit else set(started))
            remaining = [n for n in remaining if n not in finished]
    return total, crashes


def sweep_parallel(names: list[str] | None = None, jobs: int | None = None,
                   op_timeout: float = OP_TIMEOUT_S, extern: bool = False, grad: bool = False,
                   device: str = DEVICE, dtype: torch.dtype = DTYPE, aot: str = "every",
                   ) -> tuple[SweepResult, list[tuple[str, str]]]:
    """The sweep over ``names`` (default: every OpInfo) in ``jobs`` worker processes.

    Returns the merged result and the ops whose worker crashed or timed out.
    ``extern=True`` compiles with ``options={"kernels": False}`` (every op an extern);
    ``grad=True`` compares input gradients too.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    names = names if names is not None else [op_id(op) for op in all_ops()]
    jobs = jobs or int(os.environ.get("FXWRAP_SWEEP_JOBS", 0)) or os.cpu_count() or 1
    shards = [names[i::jobs] for i in range(jobs) if names[i::jobs]]
    flags = tuple(f for f, on in (("--extern", extern), ("--grad", grad)) if on)
    flags += ("--device", device, "--dtype", str(dtype).removeprefix("torch."), "--aot", aot)
    start = time.perf_counter()
    total, crashes = SweepResult(), []
    with ThreadPoolExecutor(len(shards)) as pool:
        for result, crashed in pool.map(lambda shard: _run_shard(shard, op_timeout, flags), shards):
            total.merge(result)
            crashes += crashed
    total.seconds = time.perf_counter() - start
    return total, crashes


def main(argv: list[str]) -> int:
    import argparse
    import faulthandler
    import json
    import os

    faulthandler.enable()
    parser = argparse.ArgumentParser(description="Sweep OpInfo samples through fxwrap vs eager.")
    parser.add_argument("names", nargs="*", help="OpInfo names or name.variant (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1: in this process)")
    parser.add_argument("--extern", action="store_true",
                        help='compile with options={"kernels": False}: every op an extern call')
    parser.add_argument("--grad", action="store_true", help="compare input gradients too")
    parser.add_argument("--device", default=DEVICE, help="where samples are made (default cpu)")
    parser.add_argument("--dtype", default="float32", help="samples' dtype (default float32)")
    parser.add_argument("--aot", choices=("every", "failures"), default="every",
                        help="run aot_eager on every sample (default) or only where fxwrap fails")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the result as JSON here")
    parser.add_argument("--log", help="append progress lines here")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    if args.jobs > 1:
        names = [op_id(op) for op in select_ops(args.names)]
        result, crashes = sweep_parallel(names, args.jobs, extern=args.extern, grad=args.grad,
                                         device=args.device, dtype=dtype, aot=args.aot)
        print(result.report(excluded=True))
        for name, why in crashes:
            print(f"  CRASH {name}: {why}")
        return 0 if not (result.mismatches or crashes) else 1

    log = open(args.log, "a") if args.log else None
    options = {"kernels": False} if args.extern else None

    def progress(line: str) -> None:
        for stream in ((log,) if log else ()) + (() if args.worker else (sys.stdout,)):
            stream.write(line + "\n")
            stream.flush()

    ops = [op for op in all_ops() if op_id(op) in set(args.names)] if args.worker else select_ops(args.names)
    result, done = SweepResult(), []
    start = time.perf_counter()
    for op in ops:  # one op at a time, the result so far on disk after each
        result.merge(sweep(ops=[op], progress=progress, options=options, grad=args.grad,
                           aot_every_sample=args.aot == "every", device=args.device, dtype=dtype))
        result.seconds = time.perf_counter() - start
        done.append(op_id(op))
        if args.json:
            with open(args.json + ".tmp", "w") as f:
                json.dump(_to_json(result, done), f)
            os.replace(args.json + ".tmp", args.json)
    if not args.worker:
        print(result.report(excluded=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
