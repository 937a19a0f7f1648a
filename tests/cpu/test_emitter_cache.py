"""Compiler driver, on-disk cache (atomic under races and crashes), ctypes launchers."""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import pickle
import secrets
import signal
import time
from pathlib import Path

import pytest
import torch

from emitter_helpers import Store, buf, const, kernel, ld, op, s0, x0
from fxwrap.runtime.kernel import Kernel
from fxwrap.targets.host.cache import STALE_SECONDS
from fxwrap.targets.host.compiler import CompileError, CppCompiler
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.host.loader import kernel_loader


def _source(tag: str) -> str:
    # a unique comment makes the key new, so every test really compiles
    return (f"// test {tag}\n#include <cstdint>\n"
            'extern "C" int64_t answer(int64_t x) { return 6 * x + 4; }\n')


def _call_answer(path: str, x: int) -> int:
    fn = ctypes.CDLL(path).answer
    fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int64
    return fn(x)


def _race_worker(cache_dir, source, barrier, queue):
    comp = CppCompiler(cache_dir=cache_dir)
    existed = comp.cache.lookup(comp.key(source)) is not None
    barrier.wait()
    path = comp.compile(source)
    queue.put((str(path), existed, _call_answer(str(path), 7)))


def test_concurrent_compiles_of_one_kernel(tmp_path):
    """Processes compiling the same kernel at once all get a complete, loadable entry."""
    source = _source(secrets.token_hex(8))
    ctx = mp.get_context("fork")  # children only run g++ and dlopen a trivial .so
    n = 4
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(str(tmp_path), source, barrier, queue))
             for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    paths = {r[0] for r in results}
    assert len(paths) == 1
    assert [r[2] for r in results] == [46] * n
    assert not any(r[1] for r in results)  # nobody found it cached: they really raced
    d = Path(paths.pop()).parent
    assert sorted(f.suffix for f in d.iterdir()) == [".cpp", ".sha256", ".so"]  # the entry, its seal; no temporaries left
    key = CppCompiler(cache_dir=tmp_path).key(source)
    assert (d / f"{key}.cpp").read_text() == source


def _compile_forever(cache_dir, source):
    CppCompiler(cache_dir=cache_dir).compile(source)


def test_crash_mid_build_never_leaves_a_broken_entry(tmp_path):
    comp = CppCompiler(cache_dir=tmp_path)
    source = _source(secrets.token_hex(8))
    key = comp.key(source)
    final = comp.cache.path(key)
    final.parent.mkdir(parents=True, exist_ok=True)
    # 1. a crashed writer's truncated temporary, lying next to where the entry goes
    junk = final.parent / f"{key}.999.deadbeef.tmp.so"
    junk.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 9)
    # 2. a build that dies half way through writing its output
    def dying_build(src: Path, out: Path) -> None:
        out.write_bytes(b"\x7fELF partial")
        raise KeyboardInterrupt("simulated crash")
    with pytest.raises(KeyboardInterrupt):
        comp.cache.get_or_build(key, source, dying_build)
    assert not final.exists()
    # 3. a process killed (SIGKILL) while its compiler runs
    ctx = mp.get_context("fork")  # children only run g++ and dlopen a trivial .so
    p = ctx.Process(target=_compile_forever, args=(str(tmp_path), source))
    p.start()
    deadline = time.time() + 60
    while not list(final.parent.glob(f".{key}.*.tmp/{key}.cpp")) and time.time() < deadline:
        time.sleep(0.005)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert p.exitcode == -signal.SIGKILL
    assert not final.exists() or _call_answer(str(final), 1) == 10
    # a later compile produces a complete entry that loads and runs
    path = comp.compile(source)
    assert path == final and _call_answer(str(path), 2) == 16
    # stale temporaries of the key are swept by the next build of that key
    old = time.time() - STALE_SECONDS - 10
    os.utime(junk, (old, old))
    final.unlink()
    comp.compile(source)
    assert not junk.exists()
    assert _call_answer(str(final), 3) == 22


def test_corrupted_entry_is_rebuilt(tmp_path):
    comp = CppCompiler(cache_dir=tmp_path)
    em = CppEmitter(compiler=comp)
    k = kernel(f"corrupt_{secrets.token_hex(4)}", [buf("x", (s0,))], [buf("y", (s0,))],
               [Store("y", x0, op("add", torch.float32, ld("x", x0), const(1.5)))],
               ranges=(s0,), sizes=(s0,))
    src = em.render(k)
    path = comp.compile(src.text)
    path.write_bytes(b"not an ELF file")        # damaged behind our back
    launch = em.load(src)
    x, y = torch.randn(10), torch.empty(10)
    launch(x, y, 10)
    assert torch.equal(y, x + 1.5)


def test_cache_key_and_layout(tmp_path, monkeypatch):
    comp = CppCompiler(cache_dir=tmp_path)
    a, b = _source("a"), _source("b")
    assert comp.key(a) == comp.key(a) and comp.key(a) != comp.key(b)
    assert comp.key(a) != comp.key(a, extra_flags=("-DX",))
    assert comp.key(a) != CppCompiler(cache_dir=tmp_path, flags=("-O2",)).key(a)
    assert len(comp.key(a)) == 64
    assert "-march=native" in comp.flags and "-fopenmp" in comp.flags
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "env"))
    from fxwrap.targets.host.compiler import default_compiler
    assert default_compiler().cache.root == tmp_path / "env"


def test_compile_error_names_the_kernel_and_keeps_the_source(tmp_path):
    comp = CppCompiler(cache_dir=tmp_path)
    bad = '// broken\nextern "C" void f() { this is not C++; }\n'
    with pytest.raises(CompileError) as info:
        comp.compile(bad)
    msg = str(info.value)
    assert "failed" in msg and ".failed.cpp" in msg and "error" in msg
    kept = [p for p in tmp_path.rglob("*.failed.cpp")]
    assert kept and kept[0].read_text() == bad
    assert not list(tmp_path.rglob("*.so"))


def test_launcher_convention_and_overhead(tmp_path):
    """``launch(in..., out..., sizes...)`` == ``fn(ptr..., int(size)...)``; report the cost."""
    em = CppEmitter(compiler=CppCompiler(cache_dir=tmp_path))
    k = kernel("tiny", [buf("x", (s0,))], [buf("y", (s0,))],
               [Store("y", x0, op("mul", torch.float32, ld("x", x0), const(3.0)))],
               ranges=(s0,), sizes=(s0,))
    src = em.render(k)
    assert [(a.name, a.role) for a in src.signature] == [("x", "input"), ("y", "output"), ("s0", "size")]
    assert src.launch.symbol == "tiny" and src.launch.pointers == 2
    launch = em.load(src)
    x, y = torch.randn(4), torch.empty(4)
    launch(x, y, 4)
    assert torch.equal(y, x * 3)
    fn = launch.c_function
    assert fn.argtypes == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    px, py = x.data_ptr(), y.data_ptr()

    def best(f, reps=20000):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                f()
            times.append((time.perf_counter() - t) / reps)
        return min(times)

    direct = best(lambda: fn(px, py, 4))
    launched = best(lambda: launch(x, y, 4))
    print(f"\nlaunch overhead: direct ctypes call {direct * 1e9:.0f} ns, "
          f"launcher {launched * 1e9:.0f} ns, extra {(launched - direct) * 1e9:.0f} ns")
    assert launched < direct + 5e-6  # only data_ptr() and int() on top of the C call


def test_runtime_kernel_round_trip(tmp_path, monkeypatch):
    """A ``fxwrap.runtime.Kernel`` built from a KernelSource, pre-bound and after pickling."""
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    em = CppEmitter()
    k = kernel("rt", [buf("x", (s0,))], [buf("y", (s0,))],
               [Store("y", x0, op("sub", torch.float32, ld("x", x0), const(0.25)))],
               ranges=(s0,), sizes=(s0,))
    src = em.render(k)
    kern = Kernel(src.name, src.text, "cpu", src.signature, src.launch, loader=kernel_loader)
    kern.bind(em.load(src))
    x, y = torch.randn(33), torch.empty(33)
    kern(x, y, 33)
    assert torch.equal(y, x - 0.25)
    again = pickle.loads(pickle.dumps(kern))  # lazily reloads through kernel_loader
    y2 = torch.empty(33)
    again(x, y2, 33)
    assert torch.equal(y2, y)
