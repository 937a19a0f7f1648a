"""A bool computed on scalars is emitted as ``tl.where(c, True, False)``
(``fxwrap.targets.cuda_triton.ops.scalar_bool``): Triton's interpreter needs it (fuzz seed
1206), and compiled Triton must give the same machine code with it as without it.

GPU check: ``python -m pytest -q tests/cuda/test_triton_scalar_bool.py`` (the PTX test
needs CUDA; without it that test is skipped and the rest runs under the interpreter).
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import triton
import triton.language as tl

import fxwrap
from triton_helpers import DEVICE, GPU, TARGET_NAME


@triton.jit
def _any_ne_plain(a, b, out, n, RBLOCK: tl.constexpr):
    c = tl.load(a) != tl.load(b)
    acc = tl.full([RBLOCK], 0, tl.int1)
    for off in range(0, n, RBLOCK):
        m = off + tl.arange(0, RBLOCK) < n
        acc = tl.where(m, acc | c, acc)
    tl.store(out, tl.max(acc.to(tl.int32), 0) != 0)


@triton.jit
def _any_ne_relabelled(a, b, out, n, RBLOCK: tl.constexpr):
    c = tl.where(tl.load(a) != tl.load(b), True, False)
    acc = tl.full([RBLOCK], 0, tl.int1)
    for off in range(0, n, RBLOCK):
        m = off + tl.arange(0, RBLOCK) < n
        acc = tl.where(m, acc | c, acc)
    tl.store(out, tl.max(acc.to(tl.int32), 0) != 0)


def _instructions(ptx: str) -> Counter:
    """PTX instructions by opcode (no names, labels, directives or debug lines)."""
    ops = Counter()
    for line in ptx.splitlines():
        line = line.strip()
        if not line.endswith(";") or line.startswith((".", "//")):
            continue
        words = line.split()
        if words[0].startswith("@"):  # a predicate guard: @%p1 st.global.b8 ...
            words = words[1:]
        ops[words[0]] += 1
    return ops


@pytest.mark.parametrize("same", [False, True])
def test_the_relabelled_kernel_computes_any(same):
    b = torch.randn(1, device=DEVICE)
    a = b.clone() if same else b + 1
    out = torch.ones(1, dtype=torch.bool, device=DEVICE) if same else torch.zeros(1, dtype=torch.bool,
                                                                                  device=DEVICE)
    _any_ne_relabelled[(1,)](a, b, out, 100, RBLOCK=32)
    assert bool(out) is (not same)


@pytest.mark.skipif(not GPU, reason="compares PTX: needs CUDA (the interpreter has no machine code)")
def test_compiled_triton_folds_the_select_away():
    a, b = torch.randn(1, device="cuda"), torch.randn(1, device="cuda")
    out = torch.zeros(1, dtype=torch.bool, device="cuda")
    plain = _any_ne_plain[(1,)](a, b, out, 100, RBLOCK=32)
    relabelled = _any_ne_relabelled[(1,)](a, b, out, 100, RBLOCK=32)
    got, want = _instructions(relabelled.asm["ptx"]), _instructions(plain.asm["ptx"])
    assert want and got == want, f"the select costs instructions on the GPU: {got - want} / {want - got}"


@pytest.mark.parametrize("same", [False, True])
def test_any_of_a_comparison_of_expanded_inputs(same):
    """Fuzz seed 1206 through the compiler, on this folder's target."""
    def fn(x, y, z):
        ne = x != y
        return ne.any(0), (ne ^ ne.any(0)).any(0), ne | (z > 0)

    y = torch.randn(1, device=DEVICE)
    x = (y.clone() if same else torch.randn(1, device=DEVICE)).expand(6)
    z = torch.randn(6, device=DEVICE)
    compiled = torch.compile(fn, backend=fxwrap.Backend(TARGET_NAME), dynamic=True)
    for got, want in zip(compiled(x, y.expand(6), z), fn(x, y.expand(6), z)):
        torch.testing.assert_close(got, want)
