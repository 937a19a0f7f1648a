"""C++ pointwise kernels whose innermost loop is a small constant range stored together with
the loop above it (a stack of two strided halves along a new last dim, then flattened: the
rotary embedding of a Llama written with ``torch.stack``) unroll that range into the body of
the loop above, which carries ``#pragma omp simd``: a loop of two steps never vectorized (the
hand-written Llama's RoPE kernel took 350 us against Inductor's 100 at one thread, 8 x 128 x
6 x 32).  The unrolled copies compute exactly what eager does (no FMA contraction)."""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import DefineKernel
from fxwrap.targets.host.compiler import DEFAULT_FLAGS


def _kernel_sources(program) -> list[str]:
    sources = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    return [s[s.index('extern "C"'):] for s in sources]


def _rope(x, cos, sin):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


def _rope_inputs(seed, batch=2, seq=12, heads=3, dim=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, heads, dim, generator=g).to(dtype)
    angles = torch.randn(seq, 1, dim // 2, generator=g) * 3
    return x, angles.cos().to(dtype), angles.sin().to(dtype)


def _run(program, *args):
    out = program.run(*args)
    return out[0] if isinstance(out, (tuple, list)) else out


def _simd_loop_var(source: str) -> str:
    match = re.search(r"#pragma omp simd\n\s*for \(int64_t (\w+) = ", source)
    assert match, source
    return match.group(1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_rope_stack_unrolls_the_pair_and_vectorizes_the_loop_above(dynamic):
    program = fxwrap.lower(_rope, *_rope_inputs(0), dynamic=dynamic, options={"cache": False})
    (source,) = _kernel_sources(program)
    # the pair is two blocks inside the vectorized loop, not a loop of two steps
    lane_var = re.search(r"const int64_t (\w+) = 0;", source).group(1)
    assert f"const int64_t {lane_var} = 1;" in source
    assert f"for (int64_t {lane_var} " not in source
    assert _simd_loop_var(source) != lane_var
    assert source.count("#pragma omp simd") == 1
    # gcc 12 fuses x1 * cos - x2 * sin, x1 * sin + x2 * cos into vfmaddsub under SLP (1 ulp)
    assert re.search(r'extern "C" FX_NO_SLP(_NO_IFCVT)? void', source)
    for seed in (1, 2):
        args = _rope_inputs(seed)
        out = _run(program, *args)
        assert torch.equal(out, _rope(*args))  # bit for bit: the same products and sums


def test_rope_stack_bf16_matches_eager():
    args = _rope_inputs(3, dtype=torch.bfloat16)
    program = fxwrap.lower(_rope, *args, options={"cache": False})
    assert "const int64_t" in _kernel_sources(program)[0]
    args = _rope_inputs(4, dtype=torch.bfloat16)
    out = _run(program, *args)
    torch.testing.assert_close(out, _rope(*args), rtol=0, atol=0)


def test_three_channel_stack_unrolls_three_lanes():
    def pixels(r, g, b):
        return torch.stack([r * 0.5, g - b, b * g], -1)
    torch.manual_seed(5)
    args = [torch.randn(7, 19) for _ in range(3)]
    program = fxwrap.lower(pixels, *args, options={"cache": False})
    (source,) = _kernel_sources(program)
    assert all(re.search(rf"const int64_t \w+ = {k};", source) for k in range(3))
    out = _run(program, *args)
    assert torch.equal(out, pixels(*args))


@pytest.mark.parametrize("case", ["five_lanes", "stack_not_last"])
def test_no_unroll_where_the_stores_are_not_one_run(case):
    """More lanes than the limit, a stack along an outer dim (the innermost loop is long):
    the plain loop stays, and so does SLP vectorization."""
    torch.manual_seed(6)
    if case == "five_lanes":
        def fn(a):
            return torch.stack([a * k for k in range(1, 6)], -1)
        args = (torch.randn(9, 11),)
    else:
        def fn(a, b):
            return torch.stack([a * 2, b - 1], 0)
        args = (torch.randn(9, 11), torch.randn(9, 11))
    program = fxwrap.lower(fn, *args, options={"cache": False})
    for source in _kernel_sources(program):
        assert not re.search(r"const int64_t x\d+ = \d+;", source), source
        assert "FX_NO_SLP" not in source
    out = _run(program, *args)
    assert torch.equal(out, fn(*args))


def _rope_repeat(k, v, cos, sin):
    """The hand-written Llama's keys and values: RoPE on k, then both repeated for 3 query
    heads per KV head (``repeat_interleave`` fused: the stack's dim is flattened into the head
    dim, read back as ``x % 2`` and ``x / 2``)."""
    k = _rope(k, cos, sin).transpose(1, 2)
    return k.repeat_interleave(3, 1), v.transpose(1, 2).repeat_interleave(3, 1)


def test_flattened_pair_runs_over_pairs():
    """A kernel whose innermost var is taken ``% 2`` and ``/ 2`` loops over pairs with the two
    lanes unrolled (``x4 = 2*x4_pair0 + k``), exactly eager's numbers.  A symbolic head dim
    (``dynamic=True``) keeps the plain loop: its range is no constant multiple of 2."""
    dynamic = False
    def inputs(seed):
        k, cos, sin = _rope_inputs(seed, heads=2)
        return k, torch.randn(k.shape, generator=torch.Generator().manual_seed(seed + 50)), cos, sin
    program = fxwrap.lower(_rope_repeat, *inputs(0), dynamic=dynamic, options={"cache": False})
    paired = [s for s in _kernel_sources(program) if "_pair0" in s]
    assert len(paired) == 1, _kernel_sources(program)
    (source,) = paired
    var = _simd_loop_var(source)
    assert var.endswith("_pair0")
    lane = var[:-len("_pair0")]
    assert f"const int64_t {lane} = 2*{var} + 0;" in source and f"const int64_t {lane} = 2*{var} + 1;" in source
    assert re.search(r'extern "C" FX_NO_SLP(_NO_IFCVT)? void', source)
    for seed in (1, 2):
        args = inputs(seed)
        out = program.run(*args)
        for got, want in zip(out, _rope_repeat(*args)):
            assert torch.equal(got, want)


def test_period_that_does_not_divide_the_range_is_not_paired():
    """``x % 2`` over a row of odd length: no pairs (the loop would miss the last element)."""
    def fn(a):
        return a.view(5, 3, 2).flip(-1).reshape(5, 6)[:, :5] * 2
    a = torch.randn(5, 6)
    program = fxwrap.lower(fn, a, options={"cache": False})
    for source in _kernel_sources(program):
        assert "_pair" not in source
    assert torch.equal(_run(program, a), fn(a))


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None or platform.machine() != "x86_64",
                    reason="needs the host C++ compiler on x86-64 (the instruction the test looks for)")
def test_unrolled_rope_compiles_to_no_fused_multiply_add(tmp_path):
    """The machine code of the unrolled RoPE kernel holds no FMA of any kind: gcc 12's SLP made
    ``vfmaddsub`` of it under -ffp-contract=off (at this size, a serial loop nest)."""
    program = fxwrap.lower(_rope, *_rope_inputs(0), options={"cache": False})
    (source,) = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    assert re.search(r"FX_NO_SLP(_NO_IFCVT)? void", source)
    path = tmp_path / "rope.cpp"
    path.write_text(source)
    flags = [f for f in DEFAULT_FLAGS if f not in ("-shared", "-fPIC")]
    asm = subprocess.run([os.environ.get("CXX", "g++"), *flags, "-S", "-o", "-", str(path)],
                         check=True, capture_output=True, text=True).stdout
    assert re.search(r"\tv(add|mul|sub)ps\t%[yz]mm", asm), "the loop should vectorize"
    assert not re.search(r"vf(n?m(add|sub)|maddsub|msubadd)", asm)
