"""Cold-compile savings of the Triton target: kernels whose bodies differ only in their
names and provenance share one compiled launcher (and one autotuning result); pointwise
kernels get one heuristic config; reductions autotune over at most three."""
from __future__ import annotations

import time

import sympy
import torch

from triton_helpers import DEVICE, Reduction, Store, acc, buf, build, check, const, emitter, kernel, ld, op, r0, x0
from fxwrap.targets.cuda_triton.emitter import body_digest
from fxwrap.targets.cuda_triton.tiling import Planner

F32 = torch.float32


def _relu_kernel(name, a, o, n=500):
    v = op("maximum", F32, op("mul", F32, ld(a, x0), const(3.0)), const(0.0))
    return kernel(name, [buf(a, (n,))], [buf(o, (n,))], [Store(o, x0, v)], ranges=(n,))


def test_identical_kernels_share_one_launcher():
    la, sa = build(_relu_kernel("fxwrap_pointwise_3", "buf1", "buf2"))
    lb, sb = build(_relu_kernel("fxwrap_pointwise_9", "buf7", "buf8"))
    assert sa.text != sb.text  # names and provenance differ ...
    assert body_digest(sa.text, sa.launch) == body_digest(sb.text, sb.launch)
    assert la is lb            # ... the compiled launcher is one
    a, o = torch.randn(500, device=DEVICE), torch.empty(500, device=DEVICE)
    lb(a, o)
    torch.testing.assert_close(o, torch.relu(a * 3))
    lc, sc = build(_relu_kernel("fxwrap_pointwise_4", "buf1", "buf2", n=501))  # another size: another kernel
    assert lc is not la


def test_repeated_blocks_compile_once():
    w = torch.randn(16, 16, device=DEVICE) * 0.1

    def f(x, w):
        for _ in range(4):
            x = torch.relu(x @ w) + x.mean()
        return x

    ks = check(f, (torch.randn(16, 16, device=DEVICE), w), tol=dict(rtol=1e-4, atol=1e-4))
    launchers = {id(k._launcher) for k in ks}
    assert len(ks) >= 4 and len(launchers) < len(ks), (len(ks), len(launchers))


def test_pointwise_has_one_config_and_reductions_at_most_three():
    p = Planner(interpret=False)
    pw = p.plan(_relu_kernel("k", "a", "o", n=1 << 20))
    assert pw.kind == "pointwise1d" and pw.configs == [{"XBLOCK": 1024, "num_warps": 4}]
    small = p.plan(_relu_kernel("k", "a", "o", n=100))
    assert len(small.configs) == 1 and small.configs[0]["XBLOCK"] == 128
    for rows, cols in ((4096, 3000), (64, 100000), (100000, 64), (20000, 20)):
        k = kernel("red", [buf("a", (rows, cols))], [buf("o", (rows,))], [Store("o", x0, acc("acc0", F32))],
                   ranges=(rows,), reduction_ranges=(cols,),
                   reductions=[Reduction("acc0", "sum", ld("a", cols * x0 + r0), F32)])
        assert 1 <= len(p.plan(k).configs) <= 3
    tiny = kernel("red", [buf("a", (64, 64))], [buf("o", (64,))], [Store("o", x0, acc("acc0", F32))],
                  ranges=(64,), reduction_ranges=(64,),
                  reductions=[Reduction("acc0", "sum", ld("a", 64 * x0 + r0), F32)])
    assert len(p.plan(tiny).configs) == 1


def test_split_plan_on_the_gpu_sizes():
    """The GPU planner splits the benchmark's column sum (float32[32768, 4096])."""
    rows, cols = 32768, 4096
    k = kernel("colsum", [buf("a", (rows, cols))], [buf("o", (cols,))], [Store("o", x0, acc("acc0", F32))],
               ranges=(cols,), reduction_ranges=(rows,),
               reductions=[Reduction("acc0", "sum", ld("a", cols * r0 + x0), F32)])
    plan = Planner(interpret=False).plan(k)
    assert plan.kind == "split-outer" and 1 <= len(plan.configs) <= 4  # 16- to 128-column tiles
    for cfg in plan.configs:
        programs = -(-cols // cfg["XBLOCK"]) * cfg["NSPLIT"]
        assert programs >= 4 * 132 and 2 <= cfg["NSPLIT"] <= 64
    wide = kernel("colsum", [buf("a", (8192, 1 << 20))], [buf("o", (1 << 20,))], [Store("o", x0, acc("acc0", F32))],
                  ranges=(1 << 20,), reduction_ranges=(8192,),
                  reductions=[Reduction("acc0", "sum", ld("a", (1 << 20) * r0 + x0), F32)])
    assert Planner(interpret=False).plan(wide).kind != "split-outer"  # enough x tiles already


def _relu_sources(count: int) -> tuple:
    """An emitter and ``count`` relu kernels it rendered, equal but for their names and buffers
    (not loaded)."""
    em = emitter()
    return em, [em.render(_relu_kernel(f"fxwrap_pointwise_{i}", f"buf{2 * i}", f"buf{2 * i + 1}", n=700))
                for i in range(count)]


def test_identical_kernels_loaded_at_once_build_one_launcher(monkeypatch):
    """Four kernels of one body loaded by four threads at once (a program's repeated layers in
    the load pool) build one launcher: the threads that come second wait for the first's
    (each compile made slow here, so that all four are in flight together)."""
    from concurrent.futures import ThreadPoolExecutor
    from fxwrap.targets.cuda_triton import emitter as emitter_module

    emitter_module.clear_caches()
    em, sources = _relu_sources(4)
    built = []
    real = emitter_module.TritonEmitter._bind_one

    def slow(self, text, launch, device):
        built.append(launch.symbol)
        time.sleep(0.3)
        return real(self, text, launch, device)
    monkeypatch.setattr(emitter_module.TritonEmitter, "_bind_one", slow)
    with ThreadPoolExecutor(4) as pool:
        launchers = list(pool.map(em.load, sources))
    assert len(built) == 1, built
    assert all(launcher is launchers[0] for launcher in launchers)
    a, o = torch.randn(700, device=DEVICE), torch.empty(700, device=DEVICE)
    launchers[3](a, o)
    torch.testing.assert_close(o, torch.relu(a * 3))


class Layer(torch.nn.Module):
    """A residual block: ``x + gelu(layer_norm(linear(x)))``, ``width`` features."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(width, width), torch.nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.linear(x)))


def test_compile_workers_compile_each_distinct_kernel_once(monkeypatch):
    """With compile worker processes (``FXWRAP_TRITON_COMPILE_WORKERS``; the default on a GPU,
    forced here under the interpreter too, where a worker imports the module), a model of twelve
    equal layers gives the workers one job per distinct kernel body, not one per kernel; every
    job ends compiled by a worker or taken back by the compiling process, none failed; the
    numbers are eager's."""
    from fxwrap.targets.cuda_triton import compile_workers, emitter as emitter_module

    monkeypatch.setenv("FXWRAP_TRITON_COMPILE_WORKERS", "2")
    emitter_module.clear_caches()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Layer() for _ in range(12)]).to(DEVICE)
    workers = compile_workers.compile_workers(2)
    assert workers.wait_ready(120)  # (a cold start takes the workers' imports; no job waits for them)
    before = (workers.submitted, workers.compiled, workers.failed, workers.taken_back)
    x = torch.randn(16, 32, device=DEVICE)
    ks = check(model, (x,), tol=dict(rtol=1e-4, atol=1e-4))
    submitted, compiled, failed, taken_back = (now - then for now, then in zip(
        (workers.submitted, workers.compiled, workers.failed, workers.taken_back), before))
    bodies = {body_digest(k.source, k.launch) for k in ks}
    configs = {(body_digest(k.source, k.launch), config) for k in ks for config in k.launch.configs}
    assert len(ks) >= 12 and len(bodies) < len(ks), (len(ks), len(bodies))
    # one job per body and config (autotuned on a GPU: each candidate config), + the GEMM
    # template's candidate timed against the extern; not one per kernel
    assert len(bodies) <= submitted <= len(configs) + 2 and submitted < len(ks), (submitted, len(configs), len(ks))
    assert failed == 0 and compiled + taken_back == submitted and compiled >= 1, (compiled, taken_back)


def test_equal_layers_plan_their_kernels_from_one_differentiation(monkeypatch):
    """The GPU planner asks each kernel's indices their step along each loop variable
    (``tiling._coeff``, a ``sympy.diff``); twelve equal layers ask the same questions, answered
    once (memoized): no more differentiations than for three layers (106 without the memo, 25
    for three layers).  Sizes of their own: no other test's answers remembered."""
    from fxwrap.testing.offline_cuda import offline_programs

    counts = {}
    real = sympy.diff
    for layers in (3, 12):
        calls = []

        def counted(*args, **kwargs):
            calls.append(args)
            return real(*args, **kwargs)
        monkeypatch.setattr(sympy, "diff", counted)
        torch.manual_seed(0)
        (program,) = offline_programs(torch.nn.Sequential(*[Layer(40) for _ in range(layers)]), torch.randn(24, 40))
        assert sum(type(line).__name__ == "DefineKernel" for line in program.lines) == layers
        counts[layers] = len(calls)
    assert counts[3] > 0 and counts[12] <= counts[3], counts


def _finished(workers, jobs: int) -> None:
    """Wait (60 s at most) until ``jobs`` jobs were answered, not claiming any."""
    deadline = time.monotonic() + 60
    while workers.compiled + workers.failed < jobs and time.monotonic() < deadline:
        time.sleep(0.05)


def test_compile_workers_report_failures_and_give_up_on_workers_that_compile_nothing():
    """A worker answers each job: a kernel it compiles (imports, under the interpreter) is
    ``compiled``; a module that does not even parse is ``failed`` (its caller then compiles it
    and raises the error there).  Workers that failed four jobs and compiled none take no more
    jobs (a worker environment that cannot compile would only double each compile)."""
    from fxwrap.targets.cuda_triton.compile_workers import CompileUnit, CompileWorkers

    _, (source,) = _relu_sources(1)
    launch = source.launch
    broken = source.text.replace("def ", "def def ", 1)

    def unit(text):
        return CompileUnit(text, launch.symbol, launch, tuple(launch.pointer_dtypes))

    for texts, compiled, failed, given_up in (([source.text] + [broken] * 4, 1, 4, False),
                                               ([broken] * 4, 0, 4, True)):
        workers = CompileWorkers(1)
        try:
            for i, text in enumerate(texts):
                assert workers.submit((i,), unit(text))
            _finished(workers, len(texts))
            assert (workers.compiled, workers.failed, workers.given_up) == (compiled, failed, given_up)
            assert workers.submit(("later",), unit(source.text)) is not given_up
        finally:
            workers.close()


def test_compile_workers_compile_into_the_cache_folder_the_caller_has_now(monkeypatch, tmp_path):
    """A benchmark gives each model fresh cache folders after the workers started: each job
    carries the caller's ``FXWRAP_CACHE_DIR`` (and ``TRITON_CACHE_DIR``) of the moment it was
    made, and the worker writes the kernel's module there, where the caller will look."""
    from fxwrap.targets.cuda_triton.compile_workers import CompileUnit, CompileWorkers

    _, (source,) = _relu_sources(1)
    launch = source.launch
    workers = CompileWorkers(1)
    try:
        monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "fxwrap"))
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
        assert workers.submit(("moved",), CompileUnit(source.text, launch.symbol, launch,
                                                      tuple(launch.pointer_dtypes)))
        _finished(workers, 1)
        assert (workers.compiled, workers.failed) == (1, 0)
        assert [p.name for p in (tmp_path / "fxwrap").rglob(f"{launch.symbol}_*.py")]
    finally:
        workers.close()


def test_compile_worker_count(monkeypatch):
    """How many workers: none unless ``FXWRAP_TRITON_COMPILE_WORKERS`` asks (opt-in for now);
    ``auto``: none under the interpreter, one a core up to 16 on a GPU, the cores shared by the
    ranks ``torchrun`` started on the host; a count wins, and a value that is neither fails
    naming the variable."""
    import os

    import pytest
    from fxwrap.targets.cuda_triton.compile_workers import default_count

    monkeypatch.delenv("FXWRAP_TRITON_COMPILE_WORKERS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert (default_count(interpret=True), default_count(interpret=False)) == (0, 0)
    monkeypatch.setenv("FXWRAP_TRITON_COMPILE_WORKERS", "auto")
    assert (default_count(interpret=True), default_count(interpret=False)) == (0, 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert default_count(interpret=False) == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert default_count(interpret=False) == 1
    monkeypatch.setenv("FXWRAP_TRITON_COMPILE_WORKERS", "3")
    assert default_count(interpret=True) == 3
    monkeypatch.setenv("FXWRAP_TRITON_COMPILE_WORKERS", "many")
    with pytest.raises(ValueError, match="FXWRAP_TRITON_COMPILE_WORKERS='many'"):
        default_count(interpret=False)


def test_every_kernel_goes_to_the_compile_workers_as_it_renders(monkeypatch):
    """Plain and combo kernels alike are given to the workers when rendered, not when the
    program loads them (a job given at load is nearly always taken back: the load pool claims
    it at once): every job of the program is submitted before ``load_ahead``."""
    from fxwrap.targets.cuda_triton import compile_workers, emitter as emitter_module

    monkeypatch.setenv("FXWRAP_TRITON_COMPILE_WORKERS", "2")
    emitter_module.clear_caches()
    workers = compile_workers.compile_workers(2)
    at_load = []
    real = emitter_module.TritonEmitter.load_ahead

    def load_ahead(self, sources):
        at_load.append(workers.submitted)
        return real(self, sources)
    monkeypatch.setattr(emitter_module.TritonEmitter, "load_ahead", load_ahead)
    before = workers.submitted

    def independent(a, b, c):  # three pointwise kernels of three sizes: one combo kernel; a reduction
        return a.sin() * 2.5, b.cos() + 1.5, c.exp() - 0.5, (c * c).sum(1)
    args = (torch.randn(300, device=DEVICE), torch.randn(77, device=DEVICE), torch.randn(5, 9, device=DEVICE))
    ks = check(independent, args)
    assert any(k.launch.plan == "combo" for k in ks), [k.launch.plan for k in ks]
    assert at_load and at_load[0] == workers.submitted > before, (at_load, workers.submitted, before)
