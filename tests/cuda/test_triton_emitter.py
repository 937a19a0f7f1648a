"""The Triton emitter on hand-built kernels: plans (1-D, 2-D tiles, persistent,
looped, inner/outer), masks on ragged edges, NaN and tie semantics, symbolic sizes,
launchers, errors, the device interface and target registration."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import fxwrap
from fxwrap.plugins.session import generates_kernels
from fxwrap.targets.cuda_triton import ops as triton_ops
from fxwrap.targets.cuda_triton import plugin as triton_plugin
from fxwrap.targets.cuda_triton.device import CudaDevice
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from triton_helpers import (DEVICE, GPU, TARGET, Op, Reduction, Store, acc, buf, build, const, emitter, kernel,
                            ld, op, r0, s0, x0, x1, x2)

F32, I64 = torch.float32, torch.int64


def rand(*shape):
    return torch.randn(*shape, device=DEVICE)


def test_pointwise_1d_ragged_edge():
    n, m = 37, 65
    v = op("mul", F32, op("maximum", F32, ld("a", m * x0 + x1), const(0.0)), const(2.0))
    k = kernel("relu2", [buf("a", (n, m))], [buf("o", (n, m))], [Store("o", m * x0 + x1, v)], ranges=(n, m))
    launch, src = build(k)
    assert src.launch.plan == "pointwise1d" and src.launch.index_dtype == "tl.int32"
    a, o = rand(n, m), torch.full((n, m), 7.0, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, torch.relu(a) * 2)


def test_transpose_is_2d_tiled():
    n, m = 33, 70
    k = kernel("transpose", [buf("a", (m, n))], [buf("o", (n, m))],
               [Store("o", m * x0 + x1, op("add", F32, ld("a", n * x1 + x0), const(1.0)))], ranges=(n, m))
    launch, src = build(k)
    assert src.launch.plan == "pointwise2d"
    assert dict(src.launch.config).keys() >= {"YBLOCK", "XBLOCK", "num_warps"}
    a, o = rand(m, n), torch.empty(n, m, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, a.t() + 1)


def test_small_broadcast_read_keeps_a_1d_tiling():
    """A rotary-embedding pattern: ``o[h, s, d] = q[s, h, d] * cos(pos[s])``, the q read
    from a ``[S, H, D]`` buffer through a transposed view.  Every full-size access is
    contiguous along ``d``; only the small ``pos`` read is contiguous along ``s``.  The
    2-D tiling it would ask for cost more than it saved (on an H100, HF Llama's rotary
    kernels ran 2.5x Inductor's: 177 registers a thread against 80, and three layout
    conversions), so the plan stays 1-D."""
    h, s, d = 4, 24, 16
    q = ld("q", h * d * x1 + d * x0 + x2)
    angle = op("cos", F32, op("cast", F32, ld("pos", x1, I64)))
    k = kernel("rope", [buf("q", (s, h, d)), buf("pos", (s,), I64)], [buf("o", (h, s, d))],
               [Store("o", s * d * x0 + d * x1 + x2, op("mul", F32, q, angle))], ranges=(h, s, d))
    launch, src = build(k)
    assert src.launch.plan == "pointwise1d"
    qt, pos, o = rand(s, h, d), torch.randint(0, 100, (s,), device=DEVICE), torch.empty(h, s, d, device=DEVICE)
    launch(qt, pos, o)
    torch.testing.assert_close(o, qt.transpose(0, 1) * pos.float().cos()[:, None])


def test_transpose_with_a_broadcast_read_is_still_2d_tiled():
    """The weighing by bytes moved keeps a real transpose 2-D (both full-size accesses)."""
    n, m = 33, 70
    v = op("mul", F32, ld("a", n * x1 + x0), ld("w", x0))
    k = kernel("transpose_scale", [buf("a", (m, n)), buf("w", (n,))], [buf("o", (n, m))],
               [Store("o", m * x0 + x1, v)], ranges=(n, m))
    launch, src = build(k)
    assert src.launch.plan == "pointwise2d"
    a, w, o = rand(m, n), rand(n), torch.empty(n, m, device=DEVICE)
    launch(a, w, o)
    torch.testing.assert_close(o, a.t() * w[:, None])


def test_one_transposed_read_among_many_is_still_2d_tiled():
    """A transposed read is a tenth of the bytes here, but a 1-D tiling would spend a 32-byte
    sector on each of its float32 elements: the 2-D tiling still pays."""
    n, m = 33, 70
    v = ld("a0", m * x0 + x1)
    for i in range(1, 9):
        v = op("add", F32, v, ld(f"a{i}", m * x0 + x1))
    v = op("add", F32, v, ld("t", n * x1 + x0))
    k = kernel("sum_and_transpose", [buf(f"a{i}", (n, m)) for i in range(9)] + [buf("t", (m, n))],
               [buf("o", (n, m))], [Store("o", m * x0 + x1, v)], ranges=(n, m))
    launch, src = build(k)
    assert src.launch.plan == "pointwise2d"
    xs, t, o = [rand(n, m) for _ in range(9)], rand(m, n), torch.empty(n, m, device=DEVICE)
    launch(*xs, t, o)
    torch.testing.assert_close(o, sum(xs[1:], xs[0]) + t.t())


@pytest.mark.parametrize("rnumel,kind", [(40, "persistent"), (5000, "looped")])
def test_row_sum_and_max_persistent_and_looped(rnumel, kind):
    rows = 8  # enough rows that a long row is not split (see test_triton_split.py)
    v = ld("a", rnumel * x0 + r0)
    k = kernel("rowred", [buf("a", (rows, rnumel))], [buf("s", (rows,)), buf("m", (rows,))],
               [Store("s", x0, acc("acc0", F32)), Store("m", x0, acc("acc1", F32))],
               ranges=(rows,), reduction_ranges=(rnumel,),
               reductions=[Reduction("acc0", "sum", v, F32), Reduction("acc1", "max", v, F32)])
    launch, src = build(k)
    assert src.launch.plan == kind and src.launch.reduction_shape == "inner"
    a = rand(rows, rnumel)
    a[1, 7] = float("nan")  # max propagates NaN
    s, mx = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    launch(a, s, mx)
    torch.testing.assert_close(s, a.sum(1), rtol=1e-4, atol=1e-3, equal_nan=True)
    torch.testing.assert_close(mx, a.amax(1), equal_nan=True)
    assert torch.isnan(mx[1])


def test_column_sum_is_an_outer_reduction():
    rows, cols = 300, 45
    k = kernel("colsum", [buf("a", (rows, cols))], [buf("o", (cols,))], [Store("o", x0, acc("acc0", F32))],
               ranges=(cols,), reduction_ranges=(rows,),
               reductions=[Reduction("acc0", "sum", ld("a", cols * r0 + x0), F32)])
    launch, src = build(k)
    assert src.launch.reduction_shape == "outer"
    a, o = rand(rows, cols), torch.empty(cols, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, a.sum(0), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("rnumel", [50, 3000])
def test_argmax_argmin_first_index_and_nan(rnumel):
    rows = 4
    v = ld("a", rnumel * x0 + r0)
    k = kernel("arg", [buf("a", (rows, rnumel))], [buf("i", (rows,), I64), buf("j", (rows,), I64)],
               [Store("i", x0, acc("acc0", I64)), Store("j", x0, acc("acc1", I64))],
               ranges=(rows,), reduction_ranges=(rnumel,),
               reductions=[Reduction("acc0", "argmax", v, F32), Reduction("acc1", "argmin", v, F32)])
    launch, _ = build(k)
    a = torch.randint(0, 4, (rows, rnumel), device=DEVICE).to(F32)  # ties everywhere
    a[2, rnumel // 3] = float("nan")
    a[2, rnumel - 1] = float("nan")
    a[3] = float("-inf")
    i, j = torch.empty(rows, dtype=I64, device=DEVICE), torch.empty(rows, dtype=I64, device=DEVICE)
    launch(a, i, j)
    torch.testing.assert_close(i, a.argmax(1))
    torch.testing.assert_close(j, a.argmin(1))
    assert i[2] == rnumel // 3 and i[3] == 0


def test_welford_variance_is_stable():
    rows, rnumel = 3, 3000
    k = kernel("var", [buf("a", (rows, rnumel))], [buf("v", (rows,)), buf("m", (rows,))],
               [Store("v", x0, op("truediv", F32, acc("acc0", F32, 1), const(float(rnumel)))),
                Store("m", x0, acc("acc0", F32, 0))],
               ranges=(rows,), reduction_ranges=(rnumel,),
               reductions=[Reduction("acc0", "welford", ld("a", rnumel * x0 + r0), F32)])
    launch, src = build(k)
    # looped: per-lane Welford, combined with _fx_welford; split-outer: partial Welford states
    # per chunk of rows, combined the same way (Chan's); persistent: two passes in registers
    assert ("_fx_welford" in src.text) == (src.launch.plan in ("looped", "split-outer"))
    a = rand(rows, rnumel) + 1.0e4  # E[x^2] - E[x]^2 in float32 would be off by ~10
    v, m = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    launch(a, v, m)
    torch.testing.assert_close(v.double(), a.double().var(1, correction=0), rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(m.double(), a.double().mean(1), rtol=1e-6, atol=2e-3)


def test_symbolic_sizes_use_int64_and_compute_the_grid_per_call():
    k = kernel("sym", [buf("a", (s0, 5))], [buf("o", (s0, 5))],
               [Store("o", 5 * x0 + x1, op("mul", F32, ld("a", 5 * x0 + x1), const(3.0)))],
               ranges=(s0, 5), sizes=(s0,))
    launch, src = build(k, hints={s0: 64})
    assert src.launch.index_dtype == "tl.int64" and "s0 = s0.to(tl.int64)" in src.text
    assert re.search(r"do_not_specialize=\['s0'\]", src.text)
    for n in (1, 7, 300, 0):
        a, o = rand(n, 5), torch.full((n, 5), -1.0, device=DEVICE)
        launch(a, o, n)
        torch.testing.assert_close(o, a * 3)


def test_masked_load_reads_nothing_outside_its_mask():
    n, pad = 10, 3
    inside = op("lt", torch.bool, Op.index(x0), const(n, I64))
    v = ld("a", x0, mask=inside)
    k = kernel("pad", [buf("a", (n,))], [buf("o", (n + pad,))], [Store("o", x0, op("add", F32, v, const(1.0)))],
               ranges=(n + pad,))
    launch, _ = build(k)
    a, o = rand(n), torch.empty(n + pad, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, torch.cat([a, torch.zeros(pad, device=DEVICE)]) + 1)


def test_bf16_is_loaded_and_stored_in_its_own_type():
    n = 300
    v = Op("cast", torch.bfloat16, (op("mul", F32, Op("cast", F32, (ld("a", x0, torch.bfloat16),)), const(1.7)),))
    k = kernel("bf", [buf("a", (n,), torch.bfloat16)], [buf("o", (n,), torch.bfloat16)], [Store("o", x0, v)],
               ranges=(n,))
    launch, src = build(k)
    assert "tl.float32" in src.text
    a, o = rand(n).bfloat16(), torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, (a.float() * 1.7).bfloat16(), rtol=0, atol=0)


def test_launcher_is_bound_at_compile_time():
    n = 1000
    k = kernel("bound", [buf("a", (n,))], [buf("o", (n,))], [Store("o", x0, op("neg", F32, ld("a", x0)))],
               ranges=(n,))
    launch, src = build(k)
    cfg = dict(src.launch.config)
    assert cfg["XBLOCK"] & (cfg["XBLOCK"] - 1) == 0
    if GPU:
        assert launch.kind == "compiled"

        def no_generic(*args):
            raise AssertionError("generic kernel[grid] dispatch on an aligned call")
        launch.generic = no_generic
    else:
        assert launch.kind == "interpreter"
    a, o = rand(n), torch.empty(n, device=DEVICE)
    launch(a, o)
    torch.testing.assert_close(o, -a)
    if GPU:  # a misaligned view takes the generic path and is still right
        launch.generic = type(launch).generic.__get__(launch)
        big, out = rand(n + 1), torch.empty(n + 1, device=DEVICE)
        launch(big[1:], out[1:])
        torch.testing.assert_close(out[1:], -big[1:])


def test_same_kernel_same_source():
    def make():
        return kernel("det", [buf("a", (8, 9))], [buf("o", (9,))], [Store("o", x0, acc("acc0", F32))],
                      ranges=(9,), reduction_ranges=(8,),
                      reductions=[Reduction("acc0", "sum", ld("a", 9 * r0 + x0), F32)])
    em = emitter()
    em.size_hints = {}
    assert em.render(make()).text == em.render(make()).text


def test_unknown_op_names_op_and_target():
    with pytest.raises(ValueError, match="frobnicate.*not a loop-IR op"):
        op("frobnicate", F32, ld("a", x0))  # the IR refuses it where it is built
    with pytest.raises(NotImplementedError, match=r"frobnicate.*" + re.escape(TARGET.name)):
        triton_ops.OpRenderer(TARGET.name).op("frobnicate", F32, ["tmp0"], [F32])


def test_libdevice_functions_exist():
    """Every libdevice function the emitter renders exists in this triton's libdevice."""
    try:
        from triton.language.extra import libdevice
    except ImportError:
        from triton.language.extra.cuda import libdevice
    names = set()
    for f32, f64 in triton_ops._FLOAT_UNARY.values():
        names |= set(re.findall(r"libdevice\.(\w+)", f32 + f64))
    for text in triton_ops.HELPERS.values():
        names |= set(re.findall(r"libdevice\.(\w+)", text))
    names |= {"fmod", "pow", "atan2", "copysign", "signbit", "trunc"}
    missing = sorted(n for n in names if not hasattr(libdevice, n))
    assert not missing, missing


def test_device_interface():
    dev = CudaDevice()
    assert dev.device_type == "cuda"
    if GPU:
        assert dev.is_available() and dev.device_count() >= 1
        caps = dev.capabilities()
        assert caps.warp_size == 32 and caps.multiprocessors > 0 and "bfloat16" in caps.dtypes
        assert dev.current_stream() is not None
        dev.synchronize()
    else:
        assert not dev.is_available() and dev.device_count() == 0 and dev.capabilities() == fxwrap.Capabilities()
        assert dev.current_stream() is None
        dev.synchronize()


def test_targets_are_registered_with_the_triton_emitter():
    targets = {t.name: t for t in triton_plugin.fxwrap_targets()}
    assert targets["cuda"].device_type == "cuda" and targets["triton-interpret"].device_type == "cpu"
    for t in targets.values():
        assert t.emitter is TritonEmitter and generates_kernels(t)
    assert targets["triton-interpret"].priority < 0  # never the default for CPU tensors
    from fxwrap.plugins.manager import get_plugin_manager  # built-ins load even from a source tree
    assert get_plugin_manager().target("triton-interpret").emitter is TritonEmitter


def test_compile_api_generates_triton_kernels():
    programs = []
    f = fxwrap.compile(lambda x: (x.sin() * 2).sum(1), target=TARGET, options={"on_program": programs.append})
    x = rand(6, 20)
    torch.testing.assert_close(f(x), (x.sin() * 2).sum(1), rtol=1e-5, atol=1e-5)
    ks = [n.target for p in programs for n in p.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert ks and all(k.target == TARGET.name and "@triton.jit" in k.source for k in ks)
