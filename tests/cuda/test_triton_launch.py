"""Launching compiled kernels through the CUDA driver (``cuda_driver.DriverKernel``,
``launcher.DriverLauncher``).  Everywhere: the PTX parameter parsing and slot packing,
and the launcher's logic against a fake driver (packing, fallbacks to the generic path,
per-thread slots, hooks, the context retry, the device switch).  On a GPU: real launches
(equal to eager and to Triton's own launcher, from other threads and from a thread that
never used CUDA, sizes past int32) and a training run on autograd's device thread
without cuBLAS's "no current CUDA context" warning."""
from __future__ import annotations

import ctypes
import struct
import threading

import pytest
import torch

from fxwrap.targets.cuda_triton.cuda_driver import ptx_parameters, slot_format
from triton_helpers import DEVICE, GPU, Store, buf, build, kernel, ld, op, s0, x0

F32 = torch.float32

PTX = """
.visible .entry k0(
	.param .u64 .ptr .global .align 1 k0_param_0,
	.param .u64 .ptr .global .align 1 k0_param_1,
	.param .u32 k0_param_2,
	.param .u64 .ptr .global .align 1 k0_param_3,
	.param .u64 .ptr .global .align 1 k0_param_4
)
.maxntid 128, 1, 1
{
	ld.param.u64 	%rd1, [k0_param_0];
}
.visible .entry k1(
	.param .f32 k1_param_0
)
"""


def test_ptx_parameters_of_one_entry():
    assert ptx_parameters(PTX, "k0") == ["*u64", "*u64", "u32", "*u64", "*u64"]
    assert ptx_parameters(PTX, "k1") == ["f32"]
    assert ptx_parameters(PTX, "k2") is None


def test_slot_format_packs_pointers_sizes_and_scratch():
    fmt = slot_format(ptx_parameters(PTX, "k0"), npointers=2, nsizes=1)
    assert fmt == "<QQi4xQQ" and struct.calcsize(fmt) == 5 * 8
    slots = (ctypes.c_uint64 * 5)()
    struct.pack_into(fmt, slots, 0, 0x1000, 0x2000, -3, 0, 0)
    assert list(slots) == [0x1000, 0x2000, (1 << 32) - 3, 0, 0]
    with pytest.raises(struct.error):  # a size past int32: the launcher's cue for the generic path
        struct.pack_into(fmt, slots, 0, 0x1000, 0x2000, 1 << 31, 0, 0)


def test_slot_format_refuses_other_parameter_lists():
    types = ptx_parameters(PTX, "k0")
    assert slot_format(types, npointers=3, nsizes=0) is None      # a size where a pointer is expected
    assert slot_format(types, npointers=2, nsizes=3) is None      # pointers where sizes are expected
    assert slot_format(["f32"], npointers=0, nsizes=1) is None    # float parameter
    assert slot_format(types[:2], npointers=2, nsizes=1) is None  # too few parameters
    assert slot_format(["*u64", "u64"], 1, 1) == "<Qq"            # an int64 size


gpu = pytest.mark.skipif(not GPU, reason="launches need a CUDA device")


def _scale_kernel():
    """``o = a * (a + a)`` over ``s0`` elements (a size argument)."""
    return kernel("scale", [buf("a", (s0,))], [buf("o", (s0,))],
                  [Store("o", x0, op("mul", F32, ld("a", x0), op("add", F32, ld("a", x0), ld("a", x0))))],
                  ranges=(s0,), sizes=(s0,))


def _build_scale():
    return build(_scale_kernel(), hints={s0: 4096})[0]


@gpu
def test_driver_launch_matches_eager_and_triton(monkeypatch):
    launch = _build_scale()
    assert launch.path == "cuda-native"       # the plain call in C (native_launch)
    a = torch.randn(5000, device=DEVICE)
    out = torch.full_like(a, float("nan"))
    launch(a, out, a.numel())
    torch.testing.assert_close(out, a * (a + a), rtol=0, atol=0)
    out_python = torch.full_like(a, float("nan"))
    launch.python_call(a, out_python, a.numel())   # the ctypes path of the same launcher
    assert torch.equal(out, out_python)

    from fxwrap.targets.cuda_triton import emitter as triton_emitter
    triton_emitter.clear_caches()
    monkeypatch.setenv("FXWRAP_TRITON_LAUNCHER", "triton")
    via_triton = _build_scale()
    assert via_triton.path == "triton"
    triton_emitter.clear_caches()
    monkeypatch.setenv("FXWRAP_TRITON_LAUNCHER", "ctypes")
    assert _build_scale().path == "cuda-driver"
    triton_emitter.clear_caches()
    monkeypatch.setenv("FXWRAP_TRITON_LAUNCHER", "triton")
    via_triton = _build_scale()
    out2 = torch.full_like(a, float("nan"))
    via_triton(a, out2, a.numel())
    assert torch.equal(out, out2)
    triton_emitter.clear_caches()


@gpu
def test_driver_launch_from_another_thread_and_ragged_sizes():
    launch = _build_scale()
    results = {}

    def worker(n):
        a = torch.randn(n, device=DEVICE)
        o = torch.empty_like(a)
        for _ in range(50):
            launch(a, o, n)
        torch.cuda.synchronize()
        results[n] = torch.equal(o, a * (a + a))

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 1023, 70001)]
    for t in threads:
        t.start()
    worker(4097)
    for t in threads:
        t.join()
    assert results == {1: True, 1023: True, 70001: True, 4097: True}


@gpu
def test_unaligned_pointers_launch_a_variant_compiled_for_them():
    """A slice at an odd offset (shifted labels ``tokens[:, 1:]``) is not 16-byte aligned:
    the driver launcher compiles a variant without that assumption once per set of
    unaligned pointers and launches it through the driver, not Triton's per-call
    ``kernel[grid]`` dispatch (tens of microseconds per launch)."""
    launch = _build_scale()
    generic = []
    launch.generic = lambda n, args: generic.append(n)
    a = torch.randn(5001, device=DEVICE)
    for offset in (1, 1, 3, 0):
        src = a[offset:offset + 4000]
        out = torch.full((4001,), float("nan"), device=DEVICE)[1:]
        launch(src, out, src.numel())
        torch.testing.assert_close(out, src * (src + src), rtol=0, atol=0)
    assert not generic
    # one variant per set of unaligned pointers: both (offsets 1 and 3 alike), the output only
    assert set(launch.variants) == {frozenset({0, 1}), frozenset({1})}, launch.variants
    assert all(v.path == "cuda-driver" for v in launch.variants.values())
    aligned = torch.empty(4000, device=DEVICE)
    launch(a[:4000], aligned, 4000)  # all aligned: the kernel compiled first, no new variant
    torch.testing.assert_close(aligned, a[:4000] * (a[:4000] + a[:4000]), rtol=0, atol=0)
    assert len(launch.variants) == 2 and not generic


@gpu
def test_size_past_int32_takes_generic_path():
    launch = _build_scale()
    calls = []
    launch.generic = lambda n, args: calls.append((n, args[-1]))
    a = torch.randn(4, device=DEVICE)
    launch(a, torch.empty_like(a), 1 << 31)
    assert calls and calls[0][1] == 1 << 31


@gpu
def test_driver_errors_name_the_kernel():
    from fxwrap.targets.cuda_triton.cuda_driver import CudaDriverError, _check
    with pytest.raises(CudaDriverError, match=r"cuLaunchKernel failed for kernel k0: CUDA error 1 \("):
        _check(1, "cuLaunchKernel", "k0")


class _FakeDriver:
    """A ``DriverKernel`` stand-in whose ``cu_launch`` records what a launch would pass."""

    threads, shared = 128, 0

    def __init__(self, types, npointers, nsizes):
        from fxwrap.targets.cuda_triton.cuda_driver import DriverKernel

        self.nslots = len(types)
        self.function = ctypes.c_void_p(0xABC)
        self.pack = struct.Struct(slot_format(types[:npointers + nsizes], npointers, nsizes)).pack_into
        self.buffers = DriverKernel.buffers.__get__(self)
        self.launches, self.recovered = [], []
        self.results = []  # results to return before launching for real

    def recover(self, result):
        self.recovered.append(result)
        if result != 201:
            raise RuntimeError(f"CUDA error {result}")

    def check(self, result):
        raise RuntimeError(f"CUDA error {result} again")

    def cu_launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        if self.results:
            return self.results.pop(0)
        values = [ctypes.c_uint64.from_address(params[i]).value for i in range(self.nslots)]
        self.launches.append({"grid": (gx, gy, gz), "block": (bx, by, bz), "stream": stream.value,
                              "values": values, "params": ctypes.addressof(params),
                              "thread": threading.get_ident(), "function": function.value})
        return 0


def _fake_launcher():
    from fxwrap.runtime.launch import TritonLaunch
    from fxwrap.targets.cuda_triton.launcher import DriverLauncher

    launch = TritonLaunch(pointers=2, size_symbols=("s0",), numels=(("x", "s0"),),
                          config=(("XBLOCK", 128), ("num_warps", 4)))
    driver = _FakeDriver(["*u64", "*u64", "u32", "*u64"], 2, 1)
    launcher = DriverLauncher(fn=None, launch=launch, compiled=None, device_index=0, driver=driver, device_count=2)
    launcher.stream = lambda index: 0x5000 + index
    launcher.current_device = lambda: 0
    launcher.other_devices = True
    launcher.generic_calls, launcher.triton_calls = [], []
    launcher.generic = lambda n, args: launcher.generic_calls.append((n, args))
    launcher.triton_launch = lambda n, args: launcher.triton_calls.append((n, args))
    return launcher, driver


def test_driver_launcher_packs_pointers_sizes_and_null_scratch():
    launcher, driver = _fake_launcher()
    a, o = torch.randn(1000), torch.empty(1000)
    launcher(a, o, 1000)
    (rec,) = driver.launches
    assert rec["grid"] == (8, 1, 1) and rec["block"] == (128, 1, 1) and rec["stream"] == 0x5000
    assert rec["function"] == 0xABC
    assert rec["values"] == [a.data_ptr(), o.data_ptr(), 1000, 0]
    launcher(a, o, 0)  # an empty grid launches nothing
    assert len(driver.launches) == 1 and not launcher.generic_calls


def test_driver_launcher_falls_back_where_the_compiled_kernel_does_not_apply():
    launcher, driver = _fake_launcher()
    a, o = torch.randn(1001), torch.empty(1001)
    launcher(a[1:], o[1:], 1000)           # 4-byte offset: not the 16-byte alignment compiled for
    launcher(a, o, 1 << 31)                # past the int32 size parameter
    assert [c[0] for c in launcher.generic_calls] == [8, 1 << 24] and not driver.launches


def test_driver_launcher_sends_unaligned_calls_to_a_variant_built_once():
    launcher, driver = _fake_launcher()
    built = []

    def variant(unaligned):
        built.append(unaligned)
        other, _ = _fake_launcher()
        other.unaligned = unaligned
        other.aligned = tuple(i for i in range(2) if i not in unaligned)
        other.root = launcher
        other.driver.function = ctypes.c_void_p(0xDEF)  # the variant's own compiled function
        return other

    launcher._variant = variant
    a, o = torch.randn(1003), torch.empty(1003)
    launcher(a[1:1001], o[:1000], 1000)    # pointer 0 unaligned
    launcher(a[3:1003], o[:1000], 1000)    # the same set: the same variant
    launcher(a[:1000], o[2:1002], 1000)    # pointer 1 unaligned: a variant of its own
    launcher(a[:1000], o[:1000], 1000)     # aligned: the kernel compiled first
    assert built == [frozenset({0}), frozenset({1})]
    assert [rec["function"] for rec in driver.launches] == [0xABC]
    (v0, v1) = (launcher.variants[frozenset({0})], launcher.variants[frozenset({1})])
    assert [rec["values"][0] for rec in v0.driver.launches] == [a[1:].data_ptr(), a[3:].data_ptr()]
    assert [rec["function"] for rec in v1.driver.launches] == [0xDEF]
    v0(a[1:1001], o[2:1002], 1000)         # the variant sees another unaligned pointer: the root's table
    assert built[-1] == frozenset({0, 1}) and not launcher.generic_calls


def test_driver_launcher_gives_each_thread_its_own_slots():
    launcher, driver = _fake_launcher()
    a, o = torch.randn(256), torch.empty(256)

    def worker():
        launcher(a, o, 256)

    worker()
    worker()
    t = threading.Thread(target=worker)
    t.start()
    t.join()
    first, second, other = driver.launches
    assert first["params"] == second["params"] != other["params"]
    assert first["thread"] == second["thread"] != other["thread"]
    assert first["values"] == other["values"] == [a.data_ptr(), o.data_ptr(), 256, 0]


def test_driver_launcher_hands_hooked_launches_to_triton():
    launcher, driver = _fake_launcher()

    class Chain:
        calls = [print]

    launcher.chains = (Chain(),)
    a, o = torch.randn(64), torch.empty(64)
    launcher(a, o, 64)
    assert len(launcher.triton_calls) == 1 and not driver.launches


def test_a_driver_launcher_hands_triton_its_compiled_kernel_and_keeps_it_for_saving():
    """A ``DriverLauncher`` holds Triton's launch of the same compiled kernel (``triton``: where
    hooked and generic calls go) and keeps the kernel: a saved program takes its cubin from there
    (``saved.cubin_loader_of``)."""
    from fxwrap.runtime.launch import TritonLaunch
    from fxwrap.targets.cuda_triton.launcher import CompiledLauncher, DriverLauncher
    from fxwrap.targets.cuda_triton.saved import _compiled_parts

    compiled = object()
    launch = TritonLaunch(pointers=2, size_symbols=("s0",), numels=(("x", "s0"),),
                          config=(("XBLOCK", 128), ("num_warps", 4)))
    driver = _FakeDriver(["*u64", "*u64", "u32", "*u64"], 2, 1)
    launcher = DriverLauncher(fn=None, launch=launch, compiled=compiled, device_index=0, driver=driver,
                              device_count=2)
    assert isinstance(launcher.triton, CompiledLauncher) and launcher.triton.compiled is compiled
    assert launcher.kind == "compiled" and _compiled_parts(launcher) == [compiled]
    runs = []
    launcher.triton.triton_launch = lambda n, args: runs.append(n)
    launcher.triton_launch(8, ())
    assert runs == [8]


def test_driver_launcher_retries_once_after_a_recovered_context_error():
    launcher, driver = _fake_launcher()
    a, o = torch.randn(64), torch.empty(64)
    driver.results = [201]  # CUDA_ERROR_INVALID_CONTEXT: the thread had no context
    launcher(a, o, 64)
    assert driver.recovered == [201] and len(driver.launches) == 1
    driver.results = [700]  # any other error is raised
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        launcher(a, o, 64)
    assert driver.recovered == [201, 700] and len(driver.launches) == 1


@gpu
def test_driver_launch_from_a_thread_that_never_used_cuda():
    """Autograd's device threads start without a current CUDA context."""
    launch = _build_scale()
    a = torch.randn(3000, device=DEVICE)
    out = torch.full_like(a, float("nan"))
    errors, contexts = [], []

    def first_thing():
        from fxwrap.targets.cuda_triton.cuda_driver import _libraries
        ctx = ctypes.c_void_p()
        _libraries()[0].cuCtxGetCurrent(ctypes.byref(ctx))
        contexts.append(ctx.value)
        try:
            launch(a, out, a.numel())
        except Exception as e:  # noqa: BLE001 - reported by the assertion
            errors.append(e)

    t = threading.Thread(target=first_thing)
    t.start()
    t.join()
    torch.cuda.synchronize()
    assert contexts == [None]  # the launch had to make the primary context current itself
    assert not errors and torch.equal(out, a * (a + a))


def test_driver_launcher_switches_to_its_own_device():
    launcher, driver = _fake_launcher()
    switched = []
    launcher.on_own_device = lambda args: switched.append(len(args))
    launcher.current_device = lambda: 1  # the kernel lives on device 0
    a, o = torch.randn(64), torch.empty(64)
    launcher(a, o, 64)
    assert switched == [3] and not driver.launches


def test_driver_launcher_with_one_device_never_checks_the_current_one():
    launcher, driver = _fake_launcher()
    launcher.other_devices = False
    launcher.current_device = lambda: 1 / 0  # would raise if it were asked
    a, o = torch.randn(64), torch.empty(64)
    launcher(a, o, 64)
    assert len(driver.launches) == 1



def _fake_cubin_launcher():
    """A saved program's ``CubinLauncher`` over a ``_FakeDriver`` (no cubin is loaded)."""
    from fxwrap.runtime.launch import TritonLaunch
    from fxwrap.targets.cuda_triton.launcher import grid_function
    from fxwrap.targets.cuda_triton.saved import CubinLauncher

    launch = TritonLaunch(symbol="k", pointers=2, size_symbols=("s0",), numels=(("x", "s0"),),
                          config=(("XBLOCK", 128), ("num_warps", 4)))
    launcher = CubinLauncher.__new__(CubinLauncher)
    launcher.text, launcher.launch, launcher.npointers, launcher.aligned = "", launch, 2, (0, 1)
    launcher.grid, launcher.device, launcher.other_devices = grid_function(launch), 0, True
    launcher.current_device, launcher.stream = (lambda: 0), (lambda index: 0x5000 + index)
    launcher.driver = _FakeDriver(["*u64", "*u64", "u32", "*u64"], 2, 1)
    launcher.local, launcher.streams = threading.local(), {}
    launcher.generic_calls = []
    launcher.generic = lambda n, args: launcher.generic_calls.append(n)
    return launcher


def test_a_saved_cubin_launcher_runs_the_same_preamble_as_the_compiled_ones():
    """``launch_preamble`` (device, grid, alignment) and ``driver_launch`` serve a saved
    program's launcher as they do ``DriverLauncher``: an aligned call is packed and launched,
    an empty grid launches nothing, an unaligned pointer or a grid past int32 goes to Triton's
    generic launch, a call on another device is made again on the kernel's."""
    launcher = _fake_cubin_launcher()
    a, o = torch.randn(1001), torch.empty(1001)
    launcher(a[:1000], o[:1000], 1000)
    (rec,) = launcher.driver.launches
    assert rec["grid"] == (8, 1, 1) and rec["values"] == [a.data_ptr(), o.data_ptr(), 1000, 0]
    launcher(a, o, 0)                        # an empty grid
    launcher(a[1:], o[1:], 1000)             # 4-byte offset
    launcher(a, o, 1 << 40)                  # a grid past int32
    assert launcher.generic_calls == [8, (1 << 40) // 128] and len(launcher.driver.launches) == 1
    switched = []
    launcher.on_own_device = lambda args: switched.append(len(args))
    launcher.current_device = lambda: 1
    launcher(a, o, 1000)
    assert switched == [3] and len(launcher.driver.launches) == 1


def test_the_triton_run_launcher_runs_the_same_preamble():
    """``CompiledLauncher`` (Triton's ``CompiledKernel.run``): the same preamble; an unaligned
    pointer, a grid or a size past int32 take the generic launch."""
    from fxwrap.runtime.launch import TritonLaunch
    from fxwrap.targets.cuda_triton.launcher import CompiledLauncher

    launch = TritonLaunch(pointers=2, size_symbols=("s0",), numels=(("x", "s0"),),
                          config=(("XBLOCK", 128), ("num_warps", 4)))
    launcher = CompiledLauncher(fn=None, launch=launch, compiled=None, device_index=0, device_count=1)
    runs, generic = [], []
    launcher.triton_launch = lambda n, args: runs.append(n)
    launcher.generic = lambda n, args: generic.append(n)
    a, o = torch.randn(1001), torch.empty(1001)
    launcher(a[:1000], o[:1000], 1000)
    launcher(a, o, 0)
    launcher(a[1:], o[1:], 1000)
    launcher(a, o, 1 << 40)
    assert runs == [8] and generic == [8, (1 << 40) // 128]

_AUTOGRAD_THREAD_SCRIPT = """
import os, torch, fxwrap
if os.environ.get("FXWRAP_TEST_NO_PROLOGUE") == "1":  # the runner without ensure_thread_context
    from fxwrap.targets.base import DirectCallWrapper
    from fxwrap.targets.cuda_triton.wrapper import CudaWrapper
    CudaWrapper.compile_graph = DirectCallWrapper.compile_graph
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda()
ref.load_state_dict(model.state_dict())
fn = torch.compile(model, backend=fxwrap.Backend("cuda", {"mode": "cudagraphs"}))
for _ in range(3):
    x = torch.randn(16, 32, device="cuda")
    out, want = fn(x), ref(x)
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        p.grad = q.grad = None
print("ok")
"""


def run_autograd_thread_script(no_prologue: bool):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
               FXWRAP_TEST_NO_PROLOGUE="1" if no_prologue else "0")
    return subprocess.run([sys.executable, "-c", _AUTOGRAD_THREAD_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)


@gpu
def test_backward_on_autograd_threads_needs_no_cublas_context_warning():
    """Training through CUDA graphs: the backward program runs on autograd's device
    thread, which starts without a CUDA context, and its first CUDA work is a matrix
    product.  The cuda target's runner gives the thread a context first, so cuBLAS does
    not warn "no current CUDA context" (a fresh process each: the warning is once per
    process); without that first call it does."""
    done = run_autograd_thread_script(no_prologue=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    assert "no current CUDA context" not in done.stderr
    without = run_autograd_thread_script(no_prologue=True)
    assert without.returncode == 0, without.stderr[-2000:]
    assert "no current CUDA context" in without.stderr
