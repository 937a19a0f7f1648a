"""The reduction plans the GPU planner chooses for the shapes of benchmarks/reductions.py
(issue 30: a middle-dimension mean and batch norm's statistics at the copy bandwidth), and
numbers against eager for what the new plans render: a split's combine over a wide
``[XBLOCK, NSPLIT]`` tile of partials (many of them empty), Welford with its count per ``r``
lane.  The planner runs without a GPU (``Planner(interpret=False)`` on hand-built kernels);
the numbers run on the target under test (``cuda``, or ``triton-interpret`` here)."""
from __future__ import annotations

import pytest
import torch

from fxwrap.targets.cuda_triton.tiling import Planner
from fxwrap.ir.loops import Op
from triton_helpers import (DEVICE, GPU, Reduction, Store, acc, buf, build, check, compiled, kernel, ld, r0, x0, x1)

F32, BF16 = torch.float32, torch.bfloat16


def _middle_reduction(a, r, b, dtype, kind="sum"):
    """``[A, R, B]`` (contiguous) reduced over R: x vars (A, B), index ``R*B*x0 + B*r0 + x1``."""
    out_dtype = F32 if kind == "sum" else dtype
    red = Reduction("acc0", kind, ld("a", r * b * x0 + b * r0 + x1, dtype), F32 if kind == "sum" else F32)
    return kernel("mid", [buf("a", (a, r, b), dtype)], [buf("o", (a, b), out_dtype)],
                  [Store("o", b * x0 + x1, acc("acc0", F32))], ranges=(a, b), reduction_ranges=(r,),
                  reductions=[red])


def _channel_stats(n_hw, c, dtype):
    """Batch norm's statistics over a channels-last tensor seen as ``[N*H*W, C]``: a Welford
    reduction over the rows per channel, index ``C*r0 + x0``."""
    red = Reduction("acc0", "welford", ld("a", c * r0 + x0, dtype), F32)
    return kernel("bnstats", [buf("a", (n_hw, c), dtype)], [buf("m", (c,)), buf("v", (c,))],
                  [Store("m", x0, acc("acc0", F32, 0)), Store("v", x0, acc("acc0", F32, 1))],
                  ranges=(c,), reduction_ranges=(n_hw,), reductions=[red])


def _programs(cfg, xnumel):
    return -(-xnumel // cfg["XBLOCK"]) * cfg["NSPLIT"]


def _check_split(plan, xnumel, xblock):
    assert plan.kind == "split-outer", plan.kind
    assert plan.configs
    nsplits = []
    for cfg in plan.configs:
        # XBLOCK spans the contiguous run of x the load reads (its rows are whole sectors)
        assert cfg["XBLOCK"] == xblock, cfg
        assert cfg["XBLOCK"] * cfg["RBLOCK"] in (2048, 4096, 8192), cfg
        # NSPLIT is a power of two (the combine's tile) and the programs fill an H100's 132
        # SMs with 29 or more warps each
        assert cfg["NSPLIT"] & (cfg["NSPLIT"] - 1) == 0 and 2 <= cfg["NSPLIT"] <= Planner.split_outer_max, cfg
        warps = _programs(cfg, xnumel) * cfg["num_warps"]
        assert warps >= 29 * 132, (cfg, warps)
        nsplits.append(cfg["NSPLIT"])
    # the combine reduces one [XBLOCK, NSPLIT] tile of partials a program
    assert plan.combine_config["XBLOCK"] * max(nsplits) <= Planner.combine_elements


@pytest.mark.parametrize("a,r,b,dtype,xblock", [
    (32, 12544, 32, BF16, 32),    # an SE block's spatial mean (channels-last, 112x112, 32 channels)
    (32, 3136, 144, BF16, 64),    # 56x56, 144 channels: 64 bf16 are 128 bytes
    (64, 4096, 256, F32, 32),     # 32 float32 are 128 bytes
    (32, 784, 240, F32, 32),      # 28x28, 240 channels: split from 512 rows on
], ids=["se-112", "se-56", "f32-4096", "se-28"])
def test_middle_mean_plan(a, r, b, dtype, xblock):
    _check_split(Planner(interpret=False).plan(_middle_reduction(a, r, b, dtype)), a * b, xblock)


@pytest.mark.parametrize("n,c,hw", [(32, 64, 112 * 112), (32, 256, 56 * 56), (32, 512, 28 * 28)])
def test_batch_norm_statistics_plan(n, c, hw):
    plan = Planner(interpret=False).plan(_channel_stats(n * hw, c, BF16))
    _check_split(plan, c, min(c, 64))


def test_batch_norm_statistics_of_64_channels_use_1024_partials():
    """64 channels are one x tile: the programs are the splits, 1024 of them (were 64 to 256
    programs with at most 64 partials: 25% of copy on the H100)."""
    plan = Planner(interpret=False).plan(_channel_stats(32 * 112 * 112, 64, BF16))
    assert {cfg["NSPLIT"] for cfg in plan.configs} == {1024}
    assert plan.combine_config["XBLOCK"] == 4


def test_short_or_wide_column_reductions_keep_one_program_per_tile():
    # 196 rows (14x14): persistent, the whole reduction in registers
    assert Planner(interpret=False).plan(_middle_reduction(32, 196, 672, BF16)).kind == "persistent"
    # x tiles alone fill the GPU: no split
    assert Planner(interpret=False).plan(_middle_reduction(4, 8192, 1 << 16, F32)).kind != "split-outer"


# ------------------------------------------------------------------ numbers, wide combines
ROWS = 1001


@pytest.fixture
def wide_split(monkeypatch):
    """The interpreter's split plans with 64 partials per x (a 1001-row reduction in 32-row
    steps fills 32 chunks: the rest are empty partials the combine must skip)."""
    monkeypatch.setattr(Planner, "split_nsplit_interpret", 64)


def _split(ks):
    return [k for k in ks if k.launch.plan == "split-outer"]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_wide_combine_sum_and_mean(wide_split, dtype):
    x = torch.randn(3, ROWS, 7, device=DEVICE).to(dtype)
    ks = check(lambda x: (x.sum(1), x.mean(1)), (x,),
               tol=dict(rtol=2e-2, atol=2e-2) if dtype is BF16 else dict(rtol=1e-4, atol=1e-4))
    (sk,) = _split(ks)
    # the interpreter's plan has the fixture's 64 partials; a GPU sizes NSPLIT for its SMs
    assert (sk.launch.nsplit == 64 or GPU) and "tl.arange(0, NSPLIT)" in sk.source


def test_wide_combine_max_min_propagate_nan(wide_split):
    x = torch.randn(ROWS, 5, device=DEVICE)
    x[ROWS - 3, 1] = float("nan")  # in the last non-empty chunk
    x[:, 4] = float("-inf")
    ks = check(lambda x: (x.amax(0), x.amin(0)), (x,))
    assert _split(ks) and (GPU or all(k.launch.nsplit == 64 for k in _split(ks)))


def test_wide_combine_any_all_prod(wide_split):
    x = torch.rand(ROWS, 6, device=DEVICE) * 0.02 + 0.995
    b = x > 0.9951
    ks = check(lambda x, b: (x.prod(0), b.any(0), b.all(0), (x > 0).all(0)), (x, b),
               tol=dict(rtol=1e-3, atol=1e-6))
    assert _split(ks)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_wide_combine_welford(wide_split, dtype):
    """Chan's combine over 64 partials, half of them empty (count 0), of batch norm's
    statistics over a channels-last tensor."""
    x = (torch.randn(1, 6, 13, 77, device=DEVICE) * 3 + 1).to(dtype).to(memory_format=torch.channels_last)
    ks = check(lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0), (x,),
               tol=dict(rtol=2e-2, atol=2e-2) if dtype is BF16 else dict(rtol=1e-4, atol=1e-4))
    sk = [k for k in _split(ks) if "_fx_welford" in k.source]
    assert sk and (GPU or sk[0].launch.nsplit == 64)


def test_wide_combine_of_a_row_split(wide_split):
    x = torch.randn(2, 1003, device=DEVICE)
    ks = check(lambda x: x.sum(1), (x,))
    assert _split(ks) or GPU  # a GPU holds a 1003-element row in one block (persistent)


def test_looped_welford_counts_per_r_lane():
    """A looped Welford reduction keeps its count as ``[1, RBLOCK]`` (one division per r
    lane a step); rows of different lengths and ragged last steps against eager."""
    rows, cols = 5, 333  # looped under the interpreter (RBLOCK 32 < 333), a ragged last step
    k = kernel("wf", [buf("a", (rows, cols))], [buf("m", (rows,)), buf("v", (rows,))],
               [Store("m", x0, acc("acc0", F32, 0)), Store("v", x0, acc("acc0", F32, 1))],
               ranges=(rows,), reduction_ranges=(cols,),
               reductions=[Reduction("acc0", "welford", ld("a", cols * x0 + r0), F32)])
    launch, src = build(k)
    if not GPU:  # a GPU's plan for 333 columns is persistent (one block holds the row)
        assert src.launch.plan == "looped"
        assert "_n = tl.zeros([1, RBLOCK], tl.float32)" in src.text and "_d / " not in src.text
    a = torch.randn(rows, cols, device=DEVICE) * 4 + 2
    m, v = torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE)
    launch(a, m, v)
    torch.testing.assert_close(m, a.mean(1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v, a.var(1, correction=0) * cols, rtol=1e-4, atol=1e-3)  # M2


# ------------------------------------------------------------------ RMSNorm's weight gradient
def _rmsnorm_weight_grad(rows, width):
    """``(grad * x * rstd[:, None]).sum(0)`` as the backward fuses it: two ``[rows, width]``
    bf16 reads contiguous in x, and the per-row float32 ``rstd``, contiguous in r."""
    g, x = ld("g", width * r0 + x0, BF16), ld("x", width * r0 + x0, BF16)
    rstd = ld("rstd", r0, F32)
    value = Op("mul", F32, (Op("cast", F32, (g,)), Op("mul", F32, (Op("cast", F32, (x,)), rstd))))
    return kernel("wgrad", [buf("g", (rows, width), BF16), buf("x", (rows, width), BF16), buf("rstd", (rows, 1))],
                  [buf("o", (width,), BF16)], [Store("o", x0, acc("acc0", F32))],
                  ranges=(width,), reduction_ranges=(rows,),
                  reductions=[Reduction("acc0", "sum", value, F32)])


def test_rmsnorm_weight_gradient_is_an_outer_split():
    """Accesses weigh the bytes they move: the per-row rstd (contiguous in r, 1/width of the
    bytes) does not make the column sum an inner reduction (it did: one program per column
    reading it down the rows, HF Llama's RMSNorm backward 361 us a step against Inductor's 197)."""
    plan = Planner(interpret=False).plan(_rmsnorm_weight_grad(2048, 1024))
    assert plan.kind == "split-outer" and plan.reduction_shape == "outer"
    assert {cfg["XBLOCK"] for cfg in plan.configs} == {64}  # 128 bytes of a bf16 row
    # 2048 rows: every program takes at least one RBLOCK step, the most programs 1024
    assert all(cfg["NSPLIT"] * cfg["RBLOCK"] <= 2048 for cfg in plan.configs)
    assert max(_programs(cfg, 1024) for cfg in plan.configs) >= 1024


def test_rmsnorm_training_against_eager():
    def rms(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    torch._dynamo.reset()
    x = torch.randn(300, 24, device=DEVICE).to(BF16).requires_grad_()
    w = (torch.rand(24, device=DEVICE) + 0.5).to(BF16).requires_grad_()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    f, programs = compiled(rms)
    grad = torch.randn(300, 24, device=DEVICE).to(BF16)
    f(x, w).backward(grad)
    rms(x2, w2).backward(grad)
    torch.testing.assert_close(x.grad, x2.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w.grad.float(), w2.grad.float(), rtol=2e-2, atol=5e-2)
    ks = [n.target for p in programs for n in p.graph_module.graph.nodes if hasattr(n.target, "launch")]
    # the weight's gradient is a column (outer) reduction, not one program per column reading
    # down the rows: split under the interpreter's small thresholds, looped on an H100 (300 rows)
    outer = ("split-outer",) if not GPU else ("split-outer", "looped")
    assert any(k.launch.plan in outer and k.launch.reduction_shape == "outer" for k in ks), \
        [(k.launch.plan, k.launch.reduction_shape) for k in ks]


# ------------------------------------------------------------------ the GPU code, compiled offline
def _gpu_source(k):
    """``k`` rendered as the ``cuda`` target renders it (the GPU planner's plan and configs),
    without a GPU: an emitter whose target does not interpret nor autotune."""
    from fxwrap.targets.base import DirectCallWrapper, Target
    from fxwrap.targets.cuda_triton.emitter import TritonEmitter
    from fxwrap.targets.host.device import CpuDevice

    target = Target("cuda-offline", "cpu", CpuDevice(), TritonEmitter, DirectCallWrapper,
                    options={"interpret": False, "autotune": False})
    return TritonEmitter(target).render(k)


_OFFLINE_COMPILE = """
import importlib.util, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
path, symbol, config, types = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
spec = importlib.util.spec_from_file_location("offline_kernel", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, symbol)
names = fn.arg_names
sig, consts = {}, {}
for i, n in enumerate(names):
    if n in config:
        sig[n], consts[(i,)] = "constexpr", config[n]
    else:
        sig[n] = types.get(n, "*fp32") if "ptr" in n else "i32"
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if "ptr" in n}
try:  # this Triton's offline-compile API (exit 3: the test is skipped with the reason)
    src, target = ASTSource(fn, sig, consts, attrs), GPUTarget("cuda", 90, 32)
except Exception as error:
    print(f"offline compile API: {type(error).__name__}: {error}", file=sys.stderr)
    sys.exit(3)
compiled = triton.compile(src, target=target, options={"num_warps": config["num_warps"]})
print(json.dumps(re.findall(r"ld\\.global[.a-z0-9]*", compiled.asm["ptx"])))
"""


def _ptx_loads(source, symbol, config, pointer_types, tmp_path):
    """The ``ld.global`` instructions of ``symbol`` compiled for sm_90 with ``config`` (pointers
    16-byte aligned, as the launcher specializes them).  In a process of its own: this one may
    run Triton's interpreter (``TRITON_INTERPRET=1`` turns ``tl.sum`` itself into an
    interpreted function).  Skipped where this Triton cannot compile for CUDA."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    path = tmp_path / f"{symbol}.py"
    path.write_text(source.text)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", _OFFLINE_COMPILE, str(path), symbol, json.dumps(config),
                           json.dumps(pointer_types)], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        if done.returncode == 3 or "ImportError" in done.stderr or "ModuleNotFoundError" in done.stderr:
            pytest.skip(f"Triton cannot compile for sm_90 here: {done.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"offline compile of {symbol} {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["middle-mean", "bn-stats"])
def test_split_partials_load_16_byte_vectors(case, tmp_path):
    """Coalescing, checked on the PTX: every load of the partials kernel is a 16-byte vector
    (eight bf16 consecutive in x, the fastest-varying index), for each candidate config."""
    if case == "middle-mean":
        k = _middle_reduction(32, 12544, 32, BF16)
    else:
        k = _channel_stats(32 * 112 * 112, 64, BF16)
    src = _gpu_source(k)
    assert src.launch.plan == "split-outer"
    for cfg in src.launch.configs:
        cfg = dict(cfg)
        loads = _ptx_loads(src, src.launch.partial_symbol, cfg, {"in_ptr0": "*bf16"}, tmp_path)
        assert loads and all(ld_.startswith("ld.global.v4") for ld_ in loads), (cfg, loads)


def test_wide_column_reduction_of_784_rows_is_looped_with_wide_tiles():
    """A channels-last 28x28 spatial mean with enough x tiles not to split (batch 128, 240
    channels): the rows held in registers would leave 4-value x tiles (8 bytes of a sector a
    row); the looped plan reads 32- to 128-wide x tiles."""
    plan = Planner(interpret=False).plan(_middle_reduction(128, 784, 240, BF16))
    assert plan.kind == "looped" and plan.reduction_shape == "outer"
    assert min(cfg["XBLOCK"] for cfg in plan.configs) >= 32
    # 196 rows still fit a persistent tile 16 wide
    assert Planner(interpret=False).plan(_middle_reduction(128, 196, 240, BF16)).kind == "persistent"
