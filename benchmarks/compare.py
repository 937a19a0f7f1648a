#!/usr/bin/env python
"""Side-by-side timing: eager PyTorch, torch.compile(Inductor), torch.compile(fxwrap).

    python benchmarks/compare.py [--device cpu|cuda] [--workloads a,b] [--quick] [--json out.json]

For every workload, in one process and on the same inputs, this runs eager PyTorch,
``torch.compile`` with Inductor and ``torch.compile`` with ``fxwrap.Backend``, and prints
one table per workload and a summary with geometric means:

* time: median over repeats of the mean time per call.  Each repeat runs the callable
  ``inner`` times back to back (``inner`` chosen so that one repeat lasts long enough
  to time); CPU timing uses ``time.perf_counter``, CUDA timing uses CUDA events around
  the repeat (then synchronizes).  Warmup calls come first and are not counted.  The
  variants' repeats are interleaved round-robin, so that load from other processes on a
  shared machine falls on all of them alike.
* GB/s (memory-bound workloads only): bytes / median time, where
  bytes = sum of the bytes of every input tensor (read once) + bytes of every output
  tensor (written once).  That is the minimum traffic, so it is a lower bound on
  what the implementation really moved.
* cold compile: wall time of the first call (dynamo trace + AOTAutograd + backend
  compile + one execution; for the training step also the backward compile), after
  ``torch._dynamo.reset()``, Inductor's and fxwrap's in-memory caches cleared, fresh temporary
  TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR / FXWRAP_CACHE_DIR, and Inductor's FX graph
  cache, AOTAutograd cache and autotune caches turned off.  One-off process costs
  (imports, Inductor's compile-worker pool) are paid by an unmeasured warm-up compile
  of a tiny function at start-up.  Since a dynamo reset drops every compiled function,
  the timed callables are compiled a second time after all cold compiles of a workload
  (untimed, same cache dirs) so that they can be timed side by side.
* kernels: fxwrap: over every ``fxwrap.Program`` handed to ``on_program`` during the
  cold compile, the ``call_function`` nodes of ``program.graph_module`` whose target is
  an ``fxwrap.Kernel`` (launches) and the other ``call_function`` nodes that call an op
  (externs; allocation, views, ``free``, ``getitem`` and size arithmetic are not
  counted).  Inductor: the output code of every graph compiled during the cold compile
  is captured (``GraphLowering.save_output_code``, as ``run_and_get_code`` does); in
  its ``call()`` we count the call sites of the kernels it defines through
  ``async_compile.triton/cpp/cpp_pybinding`` (launches) and the calls to
  ``extern_kernels.*`` and to ATen fallbacks (externs).  ``metrics.generated_kernel_count``
  is not used: on CPU it also counts the inner kernels of one C++ kernel group.
* check: outputs (for the training step: the loss and every parameter gradient) against
  eager with ``torch.testing.assert_close`` at the workload's tolerance; OK/MISMATCH.

The exit status is non-zero when any output mismatches eager or a required variant
fails to compile or run.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import math
import operator
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch._inductor.graph import GraphLowering

import fxwrap
from fxwrap.runtime.guards import check_inputs

BYTES_FORMULA = "bytes = sum(input tensor bytes) + sum(output tensor bytes); GB/s = bytes / median time / 1e9"


# --------------------------------------------------------------------------- workloads


@dataclass
class Case:
    """What one workload runs: ``fn(*inputs)``; for training, a step over ``params``."""

    fn: Callable
    inputs: tuple
    shapes: str
    rtol: float
    atol: float
    memory_bound: bool = False
    params: list | None = None  # training: loss.backward() fills these grads

    def run(self, f: Callable) -> tuple:
        """One call (inference) or one whole training step; returns the outputs to check."""
        if self.params is None:
            out = f(*self.inputs)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)
        for p in self.params:
            p.grad = None
        loss = f(*self.inputs)
        loss.backward()
        return (loss.detach(), *[p.grad for p in self.params])

    def min_bytes(self, outputs: tuple) -> int:
        tensors = [t for t in self.inputs if isinstance(t, torch.Tensor)] + list(outputs)
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Variant:
    name: str
    kind: str  # "eager" | "inductor" | "fxwrap"
    mode: str | None = None  # torch.compile(mode=...) for inductor
    options: dict = field(default_factory=dict)  # fxwrap.Backend options
    optional: bool = False  # a failure skips the row with a note instead of failing the run


BASE_VARIANTS = [Variant("eager", "eager"), Variant("inductor", "inductor"), Variant("fxwrap", "fxwrap")]


@dataclass
class Workload:
    name: str
    description: str
    make: Callable[[str, str], Case]  # (device, size) -> Case; size in {"quick", "cpu", "cuda"}
    cuda_only: bool = False
    variants: list[Variant] = field(default_factory=lambda: list(BASE_VARIANTS))


def _pick(size: str, quick, cpu, cuda):
    return {"quick": quick, "cpu": cpu, "cuda": cuda}[size]


def _shape(*tensors) -> str:
    parts = []
    for t in tensors:
        dtype = str(t.dtype).replace("torch.", "")
        parts.append(f"{dtype}{list(t.shape)}")
    return " ".join(parts)


def pointwise_fn(x, y):
    return (x * torch.sigmoid(x) + torch.exp(y) - 1) * 0.5


def make_pointwise(device, size):
    shape = _pick(size, (256, 512), (4096, 4096), (16384, 8192))
    x = torch.randn(shape, device=device)
    y = torch.randn(shape, device=device)
    return Case(pointwise_fn, (x, y), _shape(x, y), rtol=1e-5, atol=1e-5, memory_bound=True)


def softmax_fn(x):
    return torch.softmax(x, dim=-1)


def make_softmax(device, size):
    shape = _pick(size, (256, 512), (4096, 4096), (32768, 4096))
    x = torch.randn(shape, device=device) * 3
    return Case(softmax_fn, (x,), _shape(x), rtol=1e-5, atol=1e-6, memory_bound=True)


def layer_norm_fn(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def make_layer_norm(dtype):
    def make(device, size):
        rows, cols = _pick(size, (256, 512), (4096, 4096) if dtype == torch.float32 else (8192, 4096),
                           (32768, 4096))
        x = (torch.randn(rows, cols, device=device) * 2 + 0.5).to(dtype)
        w = torch.randn(cols, device=device).to(dtype)
        b = torch.randn(cols, device=device).to(dtype)
        rtol, atol = (1e-4, 1e-4) if dtype == torch.float32 else (1.6e-2, 2e-2)
        return Case(layer_norm_fn, (x, w, b), _shape(x, w, b), rtol, atol, memory_bound=True)
    return make


def rmsnorm_residual_fn(x, residual, weight):
    h = x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (normed * weight.float()).to(x.dtype), h


def make_rmsnorm(device, size):
    rows, cols = _pick(size, (256, 512), (8192, 4096), (32768, 4096))
    x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
    r = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
    w = torch.randn(cols, device=device, dtype=torch.bfloat16)
    return Case(rmsnorm_residual_fn, (x, r, w), _shape(x, r, w), rtol=1.6e-2, atol=2e-2, memory_bound=True)


def colsum_fn(x):
    return x.sum(0)


def make_colsum(device, size):
    shape = _pick(size, (256, 512), (4096, 4096), (32768, 4096))
    x = torch.randn(shape, device=device)
    # |sum| ~ sqrt(rows); summation order differs between implementations
    return Case(colsum_fn, (x,), _shape(x), rtol=1e-4, atol=1e-3, memory_bound=True)


def argmax_rows_fn(x):
    return x.argmax(-1)


def make_argmax_rows(device, size):
    """Greedy decoding's argmax over logits: bf16 rows of a 32000-token vocabulary on the GPU."""
    rows, cols = _pick(size, (64, 1000), (512, 32000), (4096, 32000))
    x = torch.randn(rows, cols, device=device).to(torch.bfloat16 if device == "cuda" else torch.float32)
    return Case(argmax_rows_fn, (x,), _shape(x), rtol=0, atol=0, memory_bound=True)


def gelu_mlp_fn(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def make_gelu_mlp(device, size):
    tokens, d, hidden = _pick(size, (64, 128, 512), (1024, 1024, 4096), (8192, 4096, 16384))
    x = torch.randn(tokens, d, device=device)
    w1 = torch.randn(hidden, d, device=device) / math.sqrt(d)
    b1 = torch.randn(hidden, device=device) * 0.1
    w2 = torch.randn(d, hidden, device=device) / math.sqrt(hidden)
    b2 = torch.randn(d, device=device) * 0.1
    return Case(gelu_mlp_fn, (x, w1, b1, w2, b2), _shape(x, w1, b1, w2, b2), rtol=1e-4, atol=1e-4)


def attention_fn(q, k, v):
    d = q.shape[-1]
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1) @ v


def make_attention(device, size):
    bh, seq, d = _pick(size, (2, 128, 32), (16, 1024, 64), (32, 4096, 128))
    q, k, v = (torch.randn(bh, seq, d, device=device) for _ in range(3))
    return Case(attention_fn, (q, k, v), _shape(q, k, v), rtol=1e-4, atol=1e-4)


def make_mlp_train(device, size):
    batch, d, hidden = _pick(size, (64, 128, 256), (1024, 1024, 2048), (8192, 4096, 16384))
    model = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(),
                                torch.nn.Linear(hidden, d)).to(device)
    x = torch.randn(batch, d, device=device)
    target = torch.randn(batch, d, device=device)

    def mlp_loss(x, target):
        return F.mse_loss(model(x), target)

    return Case(mlp_loss, (x, target), f"{_shape(x)} Linear({d},{hidden})-GELU-Linear({hidden},{d})",
                rtol=1e-4, atol=1e-5, params=list(model.parameters()))


def launch_chain_fn(x, w):
    for _ in range(8):
        x = torch.relu(x @ w) + x.mean()
    return x


def make_launch(device, size):
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device) / 8
    return Case(launch_chain_fn, (x, w), _shape(x, w), rtol=1e-4, atol=1e-4)


WORKLOADS = [
    Workload("pointwise", "(x*sigmoid(x)+exp(y)-1)*0.5", make_pointwise),
    Workload("softmax", "softmax(x, dim=-1)", make_softmax),
    Workload("layer_norm_fp32", "layer_norm(x, w, b) fp32", make_layer_norm(torch.float32)),
    Workload("layer_norm_bf16", "layer_norm(x, w, b) bf16", make_layer_norm(torch.bfloat16)),
    Workload("rmsnorm_residual_bf16", "h=x+r; (rmsnorm(h)*w, h) bf16, fp32 math", make_rmsnorm),
    Workload("colsum", "x.sum(0)", make_colsum),
    Workload("argmax_rows", "x.argmax(-1) of logits (bf16 on cuda)", make_argmax_rows),
    Workload("gelu_mlp", "linear -> gelu -> linear", make_gelu_mlp),
    Workload("attention", "softmax(q@k^T/sqrt(d))@v, written out", make_attention),
    Workload("mlp_train", "MLP forward + mse loss + backward (whole step)", make_mlp_train),
    Workload("launch_overhead", "8x (x = relu(x@w) + x.mean()), 64x64 fp32, per call", make_launch,
             cuda_only=True,
             variants=[Variant("eager", "eager"), Variant("inductor", "inductor"),
                       Variant("inductor-reduce-overhead", "inductor", mode="reduce-overhead"),
                       Variant("fxwrap", "fxwrap"),
                       Variant("fxwrap-cudagraphs", "fxwrap", options={"mode": "cudagraphs"},
                               optional=True)]),
]


# --------------------------------------------------------------------------- compilers


def configure_cold_compiles() -> None:
    """No persistent cache may make a compile warm."""
    settings = [(torch._inductor.config, name) for name in (
        "fx_graph_cache", "fx_graph_remote_cache", "autotune_local_cache", "autotune_remote_cache",
        "bundled_autotune_remote_cache")]
    settings += [(torch._functorch.config, name) for name in (
        "enable_autograd_cache", "enable_remote_autograd_cache")]
    for config, name in settings:
        if hasattr(config, name):  # older torch lacks some of them
            setattr(config, name, False)


def use_cache_dir(d: str) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(d, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "triton")
    os.environ["FXWRAP_CACHE_DIR"] = os.path.join(d, "fxwrap")


def fresh_caches(root: str) -> str:
    """New empty on-disk cache dirs, dynamo reset, Inductor's and fxwrap's in-memory caches cleared."""
    d = tempfile.mkdtemp(dir=root)
    use_cache_dir(d)
    torch._dynamo.reset()
    clear = getattr(torch._inductor.utils, "clear_caches", None) or torch._inductor.utils.clear_inductor_caches
    clear()
    try:  # fxwrap's in-process Triton caches (modules, launchers, autotune results)
        from fxwrap.targets.cuda_triton.emitter import clear_caches as clear_fxwrap_triton
    except ImportError:  # pragma: no cover - triton not installed
        pass
    else:
        clear_fxwrap_triton()
    return d


def fresh_function(fn: Callable) -> Callable:
    """A copy of ``fn`` with its own code object, hence its own dynamo cache entry."""
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def make_compiled(fn: Callable, variant: Variant, programs: list):
    if variant.kind == "eager":
        return fn
    fn = fresh_function(fn)
    if variant.kind == "inductor":
        return torch.compile(fn, backend="inductor", mode=variant.mode)
    if variant.kind == "fxwrap":
        options = dict(variant.options)
        options["on_program"] = programs.append
        return torch.compile(fn, backend=fxwrap.Backend(None, options))
    raise ValueError(variant.kind)


# What an fxwrap graph calls that is not an op: allocation, views, free, getitem.
# the input guard (fxwrap.runtime.guards.check_inputs, the first node of every program) is
# bookkeeping too: Inductor's own guards run in dynamo, outside its output code
_BOOKKEEPING = {torch.empty_strided, torch.empty, torch.as_strided, fxwrap.free, operator.getitem,
                check_inputs}


def _is_bookkeeping(target) -> bool:
    if target in _BOOKKEEPING:
        return True
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", "") or ""
    # DefineSymbol lines become plain arithmetic over size symbols
    return module in ("_operator", "operator", "math", "builtins") or name.startswith("sym_")


def count_fxwrap(programs: list) -> dict:
    kernels = externs = 0
    for program in programs:
        for node in program.graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if isinstance(node.target, fxwrap.Kernel):
                kernels += 1
            elif not _is_bookkeeping(node.target):
                externs += 1
    targets = sorted({p.target.name for p in programs})
    return {"kernels": kernels, "externs": externs, "graphs": len(programs),
            "programs": [p.kind for p in programs], "target": ",".join(targets)}


def _call_body(code: str) -> str:
    """The part of Inductor's output code that runs per call: ``call()`` and, with graph
    partitions (cudagraphs), the partition functions it calls; kernel definitions excluded."""
    starts = [i for i in (code.find("async_compile.wait(globals())"), code.find("def partition_0("),
                          code.find("def call(")) if i >= 0]
    if not starts:
        return ""
    start = min(starts)
    ends = [i for i in (code.find("\ndef get_args", start), code.find("\ndef benchmark_compiled_module", start))
            if i >= 0]
    return code[start:min(ends) if ends else len(code)]


def count_inductor(codes: list[str]) -> dict:
    kernels = externs = 0
    for code in codes:
        names = re.findall(r"^(\w+) = async_compile\.(?:triton|cpp_pybinding|cpp|cuda|halide)\(", code, re.M)
        body = _call_body(code)
        for name in names:
            kernels += len(re.findall(rf"(?<![\w.]){re.escape(name)}(?:\.run)?\(", body))
        externs += len(re.findall(r"(?<![\w.])extern_kernels\.\w+\(", body))
        externs += len(re.findall(r"(?<![\w.])torch\.ops\.\w+\.\w+(?:\.\w+)?\(", body))
        externs += len(re.findall(r"(?<![\w.])aten\.\w+(?:\.\w+)?\(", body))
    return {"kernels": kernels, "externs": externs, "graphs": len(codes)}


# --------------------------------------------------------------------------- timing


class Timer:
    """Times several callables against each other, interleaved.

    Each callable is warmed up, then calibrated: ``inner`` calls make one repeat of at
    least ``min_repeat_s``.  The repeats run round-robin (eager, inductor, fxwrap,
    eager, ... with the order rotated every round), so that load from other processes
    on a shared machine falls on every variant alike.  A variant's time is the median
    over its repeats of (repeat time / inner).
    """

    def __init__(self, device: str, quick: bool, repeats: int | None):
        self.cuda = device == "cuda"
        self.repeats = repeats or (5 if quick else 21)
        self.min_repeats = min(self.repeats, 3 if quick else 7)
        self.min_repeat_s = 0.005 if quick else 0.05
        self.budget_s = 0.5 if quick else 15.0  # per workload, all variants together
        self.warmup_s = 0.02 if quick else 0.3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def _warm_and_calibrate(self, call: Callable[[], Any]) -> tuple[int, float]:
        start = time.perf_counter()
        n = 0
        while n < 3 or (time.perf_counter() - start < self.warmup_s and n < 1000):
            call()
            n += 1
        self.sync()
        t0 = time.perf_counter()
        call()
        self.sync()
        once = max(time.perf_counter() - t0, 1e-7)
        return max(1, math.ceil(self.min_repeat_s / once)), once

    def _one_repeat(self, call: Callable[[], Any], inner: int) -> float:
        if self.cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                call()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) / 1e3 / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            call()
        return (time.perf_counter() - t0) / inner

    def measure(self, calls: dict[str, Callable[[], Any]]) -> dict[str, dict]:
        plan = {name: self._warm_and_calibrate(call) for name, call in calls.items()}
        round_s = sum(inner * once for inner, once in plan.values())
        repeats = min(self.repeats, max(self.min_repeats, int(self.budget_s / max(round_s, 1e-9))))
        times: dict[str, list[float]] = {name: [] for name in calls}
        names = list(calls)
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for r in range(repeats):
                k = r % len(names)
                for name in names[k:] + names[:k]:
                    times[name].append(self._one_repeat(calls[name], plan[name][0]))
        finally:
            if gc_was_enabled:
                gc.enable()
        out = {}
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
            out[name] = {"median_s": statistics.median(ts), "p25_s": q[0], "p75_s": q[2],
                         "repeats": repeats, "inner": plan[name][0]}
        return out


# --------------------------------------------------------------------------- running


def _clone_outputs(outputs: tuple) -> tuple:
    return tuple(o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs)


def check_outputs(actual: tuple, expected: tuple, rtol: float, atol: float) -> tuple[bool, str]:
    if len(actual) != len(expected):
        return False, f"{len(actual)} outputs, eager has {len(expected)}"
    worst = 0.0
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return False, f"output {i}: " + "; ".join(lines[:3])
        if a.numel():
            worst = max(worst, (a.double() - e.double()).abs().max().item())
    return True, f"max abs err {worst:.2e}"


def _failure(result: dict, variant: Variant, err: BaseException) -> None:
    result["check"] = "SKIPPED" if variant.optional else "ERROR"
    result["error"] = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
    if not variant.optional:
        result["traceback"] = traceback.format_exc()


def save_code(save_dir: str | None, workload: str, variant: Variant, programs: list, codes: list[str]) -> None:
    """``--save-code DIR``: what the kernel counts were read from, one file per variant."""
    if not save_dir:
        return
    os.makedirs(save_dir, exist_ok=True)
    if variant.kind == "fxwrap":
        parts = [f"# fxwrap {p.kind} program (target {p.target.name})\n{p.code()}\n"
                 f"# its GraphModule\n{p.graph_module.code}" for p in programs]
    else:
        parts = [f"# Inductor output code, graph {i}\n{code}" for i, code in enumerate(codes)]
    with open(os.path.join(save_dir, f"{workload}.{variant.name}.py.txt"), "w") as f:
        f.write("\n\n".join(parts))


def cold_compile(case: Case, variant: Variant, cache_root: str, expected: tuple, timer: Timer,
                 workload: str = "", save_dir: str | None = None) -> dict:
    """Phase 1: cold compile (timed), kernel counts, correctness against eager."""
    result: dict[str, Any] = {"variant": variant.name, "kind": variant.kind}
    programs: list = []
    codes: list[str] = []
    try:
        result["cache_dir"] = fresh_caches(cache_root)
        compiled = make_compiled(case.fn, variant, programs)
        t0 = time.perf_counter()
        with mock.patch.object(GraphLowering, "save_output_code", codes.append):
            outputs = _clone_outputs(case.run(compiled))
            timer.sync()
        result["compile_s"] = time.perf_counter() - t0
        result["counts"] = count_fxwrap(programs) if variant.kind == "fxwrap" else count_inductor(codes)
        save_code(save_dir, workload, variant, programs, codes)
        ok, note = check_outputs(outputs, expected, case.rtol, case.atol)
        result["check"], result["check_note"] = ("OK" if ok else "MISMATCH"), note
        if case.memory_bound:
            result["bytes"] = case.min_bytes(outputs)
        del outputs, compiled
    except Exception as err:  # noqa: BLE001 - reported; fails the run unless optional
        _failure(result, variant, err)
    return result


def run_workload(wl: Workload, device: str, size: str, timer: Timer, cache_root: str,
                 save_dir: str | None = None) -> dict:
    torch.manual_seed(zlib.crc32(wl.name.encode()))
    case = wl.make(device, size)
    expected = _clone_outputs(case.run(case.fn))
    timer.sync()
    rows = []
    for variant in wl.variants:
        if variant.kind == "eager":
            row = {"variant": variant.name, "kind": "eager", "check": "ref", "check_note": "reference"}
            if case.memory_bound:
                row["bytes"] = case.min_bytes(expected)
        else:
            row = cold_compile(case, variant, cache_root, expected, timer, wl.name, save_dir)
        rows.append(row)
    del expected

    # Phase 2: compile again (not timed; on-disk caches of phase 1 warm), time interleaved.
    torch._dynamo.reset()
    calls = {}
    for variant, row in zip(wl.variants, rows):
        if row["check"] in ("ERROR", "SKIPPED"):
            continue
        try:
            if "cache_dir" in row:
                use_cache_dir(row["cache_dir"])
            compiled = make_compiled(case.fn, variant, [])
            case.run(compiled)
            timer.sync()
            calls[variant.name] = functools.partial(case.run, compiled)
        except Exception as err:  # noqa: BLE001
            _failure(row, variant, err)
    try:
        timings = timer.measure(calls)
    except Exception as err:  # noqa: BLE001 - a failure while timing fails every compiled row
        timings = {}
        for variant, row in zip(wl.variants, rows):
            if variant.name in calls:
                _failure(row, variant, err)
    for row in rows:
        row.update(timings.get(row["variant"], {}))
        row.pop("cache_dir", None)
    shapes = case.shapes
    del calls, case
    torch._dynamo.reset()
    gc.collect()
    return {"workload": wl.name, "description": wl.description, "shapes": shapes, "rows": rows}


# --------------------------------------------------------------------------- reporting


def _row(rows: list[dict], name: str) -> dict | None:
    return next((r for r in rows if r["variant"] == name and "median_s" in r), None)


def ratio(rows, num, den) -> float | None:
    a, b = _row(rows, num), _row(rows, den)
    return a["median_s"] / b["median_s"] if a and b else None


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def format_workload(res: dict, shapes: str, copy_gbs: float | None = None) -> str:
    rows = res["rows"]
    eager = _row(rows, "eager")
    has_bw = any("bytes" in r for r in rows)
    head = f"{'variant':<26}{'median':>12}{'p25-p75':>10}{'vs eager':>10}"
    head += f"{'GB/s':>8}" if has_bw else ""
    head += f"{'%copy':>7}" if has_bw and copy_gbs else ""
    head += f"{'compile s':>11}{'kernels':>9}{'externs':>9}  check"
    out = [f"== {res['workload']}: {res['description']}", f"   inputs: {shapes}"]
    bytes_ = next((r["bytes"] for r in rows if "bytes" in r), None)
    if bytes_:
        out.append(f"   bytes: {bytes_ / 1e6:.1f} MB  ({BYTES_FORMULA})")
    out.append(head)
    for r in rows:
        if "median_s" not in r:
            out.append(f"{r['variant']:<26}{r['check']:>12}  {r.get('error', '')}")
            continue
        spread = (r["p75_s"] - r["p25_s"]) / r["median_s"] * 100
        line = f"{r['variant']:<26}{_fmt_time(r['median_s']):>12}{f'±{spread / 2:.1f}%':>10}"
        line += f"{r['median_s'] / eager['median_s']:>9.2f}x" if eager else f"{'-':>10}"
        if has_bw:
            line += f"{r['bytes'] / r['median_s'] / 1e9:>8.1f}" if "bytes" in r else f"{'-':>8}"
            if copy_gbs:
                line += (f"{r['bytes'] / r['median_s'] / 1e9 / copy_gbs * 100:>6.0f}%" if "bytes" in r
                         else f"{'-':>7}")
        line += f"{r['compile_s']:>11.2f}" if "compile_s" in r else f"{'-':>11}"
        counts = r.get("counts")
        line += f"{counts['kernels']:>9}{counts['externs']:>9}" if counts else f"{'-':>9}{'-':>9}"
        line += f"  {r['check']}" + (f" ({r['check_note']})" if r["check"] != "ref" else "")
        out.append(line)
    fe, fi = ratio(rows, "fxwrap", "eager"), ratio(rows, "fxwrap", "inductor")
    out.append(f"   fxwrap/eager = {fe:.2f}x   fxwrap/Inductor = {fi:.2f}x   (median-time ratios; <1: fxwrap faster)"
               if fe and fi else "   fxwrap/eager, fxwrap/Inductor: n/a (a variant did not run)")
    return "\n".join(out)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def format_summary(results: list[dict], copy_gbs: float | None = None) -> str:
    out = ["== summary (median time per call; ratios <1: fxwrap faster)",
           f"{'workload':<24}{'eager':>12}{'inductor':>12}{'fxwrap':>12}{'fx/eager':>10}{'fx/ind':>9}"
           f"{'ind k+e':>9}{'fx k+e':>9}  {'ind':<9}{'fxwrap':<9}"]
    fe_all, fi_all = [], []
    for res in results:
        rows = res["rows"]
        cells = []
        for name in ("eager", "inductor", "fxwrap"):
            r = _row(rows, name)
            cells.append(_fmt_time(r["median_s"]) if r else "-")
        fe, fi = ratio(rows, "fxwrap", "eager"), ratio(rows, "fxwrap", "inductor")
        checks = [next((r["check"] for r in rows if r["variant"] == n), rows[0]["check"])
                  for n in ("inductor", "fxwrap")]
        if fe and fi and checks == ["OK", "OK"]:
            fe_all.append(fe)
            fi_all.append(fi)
        counts = []
        for name in ("inductor", "fxwrap"):
            c = next((r.get("counts") for r in rows if r["variant"] == name), None)
            counts.append(f"{c['kernels']}+{c['externs']}" if c else "-")
        out.append(f"{res['workload']:<24}{cells[0]:>12}{cells[1]:>12}{cells[2]:>12}"
                   f"{(f'{fe:.2f}x' if fe else '-'):>10}{(f'{fi:.2f}x' if fi else '-'):>9}"
                   f"{counts[0]:>9}{counts[1]:>9}  {checks[0]:<9}{checks[1]:<9}")
    ge, gi = geomean(fe_all), geomean(fi_all)
    out.append(f"geomean over the {len(fe_all)} workloads whose checks are OK: "
               f"fxwrap/eager = {ge:.2f}x   fxwrap/Inductor = {gi:.2f}x" if ge else "geomean: n/a")
    compile_s = {name: sum(r["compile_s"] for res in results for r in res["rows"]
                           if r["variant"] == name and "compile_s" in r) for name in ("inductor", "fxwrap")}
    if compile_s["inductor"]:
        out.append(f"cold compile summed over the workloads: Inductor {compile_s['inductor']:.1f} s, "
                   f"fxwrap {compile_s['fxwrap']:.1f} s (fxwrap/Inductor = "
                   f"{compile_s['fxwrap'] / compile_s['inductor']:.2f}x)")
    if copy_gbs:
        out.append(f"memory-bound workloads as % of the {copy_gbs:.0f} GB/s device copy (Inductor, fxwrap):")
        for res in results:
            cells = [_row(res["rows"], n) for n in ("inductor", "fxwrap")]
            if all(c and "bytes" in c for c in cells):
                pct = [c["bytes"] / c["median_s"] / 1e9 / copy_gbs * 100 for c in cells]
                out.append(f"   {res['workload']:<24}{pct[0]:>6.0f}%{pct[1]:>6.0f}%")
    out.append("(k+e = kernel launches + extern calls per compiled program set, forward+backward for training)")
    return "\n".join(out)


def _loadavg() -> str:
    try:
        return ", ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def environment(device: str) -> dict:
    def sh(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001 - informational only
            return ""
    cpu = next((ln.split(":", 1)[1].strip() for ln in sh(["lscpu"]).splitlines()
                if ln.startswith("Model name")), platform.processor())
    here = os.path.dirname(os.path.abspath(__file__))
    commit = sh(["git", "-C", here, "rev-parse", "--short", "HEAD"])
    dirty = bool(sh(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"]))
    env = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
           "cores": os.cpu_count(), "threads": torch.get_num_threads(),
           "commit": commit + (" (+ uncommitted changes)" if dirty else "")}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    return env


# --------------------------------------------------------------------------- main


def copy_bandwidth(device: str) -> float | None:
    """Device-to-device copy of a 1 GiB float32 tensor: (bytes read + written) / median time."""
    if device != "cuda":
        return None
    src = torch.randn(1 << 28, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        if i >= 3:  # warm-up copies first
            times.append(begin.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times) / 1e9


def warm_up_process(device: str, cache_root: str) -> None:
    """Pay the one-off costs (imports, worker pools) before anything is timed."""
    def tiny(x):
        return torch.relu(x) * 2 + 1

    x = torch.randn(16, device=device)
    for variant in BASE_VARIANTS[1:]:
        fresh_caches(cache_root)
        make_compiled(tiny, variant, [])(x)
    torch._dynamo.reset()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--workloads", help="comma-separated names (default: all for the device)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats: a smoke run")
    parser.add_argument("--repeats", type=int, help="timed repeats per variant (default 15, --quick 5)")
    parser.add_argument("--json", help="write every measurement to this file")
    parser.add_argument("--save-code", metavar="DIR",
                        help="write each compiled variant's code (what the kernel counts read) into DIR")
    args = parser.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    known = {w.name: w for w in WORKLOADS}
    if args.workloads:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            parser.error(f"unknown workload(s) {unknown}; known: {list(known)}")
        selected = [known[n] for n in names]
    else:
        selected = [w for w in WORKLOADS if args.device == "cuda" or not w.cuda_only]
    skipped = [w.name for w in selected if w.cuda_only and args.device != "cuda"]
    selected = [w for w in selected if not (w.cuda_only and args.device != "cuda")]
    size = "quick" if args.quick else args.device

    configure_cold_compiles()
    env = environment(args.device)
    cmd = "python benchmarks/compare.py " + " ".join(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    print(f"# {cmd}")
    print(f"# {datetime.date.today().isoformat()}  torch {env['torch']}  python {env['python']}  "
          f"commit {env['commit']}")
    print(f"# cpu: {env['cpu']} ({env['cores']} cores, torch threads {env['threads']})"
          + (f"  gpu: {env['gpu']}" if "gpu" in env else ""))
    clock = "CUDA events" if args.device == "cuda" else "time.perf_counter"
    print(f"# time: median over repeats of mean time per call, repeats interleaved across variants; {clock}")
    print(f"# {BYTES_FORMULA}")
    print("# compile s: first call after dynamo reset, fresh cache dirs, FX graph/AOT/autotune caches off")
    print("# kernels/externs: fxwrap: Kernel vs op call_function nodes in its Programs; "
          "Inductor: kernel and extern/fallback call sites in its output code")
    print(f"# load average at start (1, 5, 15 min): {_loadavg()}")
    if skipped:
        print(f"# skipped (cuda only): {', '.join(skipped)}")
    print(flush=True)

    copy_gbs = copy_bandwidth(args.device)
    if copy_gbs:
        print(f"# device-to-device copy of a 1 GiB tensor (bytes read + written): {copy_gbs:.0f} GB/s", flush=True)
    cache_root = tempfile.mkdtemp(prefix="fxwrap_bench_")
    results = []
    failed = False
    try:
        warm_up_process(args.device, cache_root)
        timer = Timer(args.device, args.quick, args.repeats)
        for wl in selected:
            try:
                res = run_workload(wl, args.device, size, timer, cache_root, args.save_code)
            except Exception as err:  # noqa: BLE001 - a broken workload must not hide the others
                res = {"workload": wl.name, "description": wl.description, "shapes": "?",
                       "rows": [{"variant": "eager", "check": "ERROR", "error": f"{type(err).__name__}: {err}"}]}
                traceback.print_exc()
            results.append(res)
            print(format_workload(res, res["shapes"], copy_gbs))
            for r in res["rows"]:
                if r["check"] in ("MISMATCH", "ERROR"):
                    failed = True
                    if "traceback" in r:
                        print(r["traceback"], file=sys.stderr)
                elif r["check"] == "SKIPPED":
                    print(f"   note: {r['variant']} skipped: {r['error']}")
            print(flush=True)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    print(format_summary(results, copy_gbs))
    elapsed = time.perf_counter() - started
    print(f"# load average at end (1, 5, 15 min): {_loadavg()}")
    verdict = "FAILED: a variant mismatched eager or errored" if failed else "all checks OK"
    print(f"# total wall time {elapsed:.0f} s; {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": cmd, "date": datetime.date.today().isoformat(), "device": args.device,
                       "quick": args.quick, "environment": env, "bytes_formula": BYTES_FORMULA,
                       "wall_s": elapsed, "failed": failed, "copy_gbs": copy_gbs,
                       "results": [{k: v for k, v in res.items()} for res in results]}, f, indent=2,
                      default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
