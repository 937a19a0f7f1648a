"""Numbers after the numerics pass (``fxwrap.core.numerics``), bit for bit against eager:
bf16/fp16/float64/int/bool mixes through whole programs, and the hand-made kernel of
``tests/null/test_numerics_pass.py`` (16-bit ops, promotion, casts left implicit)
rendered by the C++ and Metal-shim emitters after ``legalize``."""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch._dynamo

import fxwrap
from fxwrap.core.numerics import legalize
from fxwrap.plugins.manager import get_plugin_manager

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "null"))
import test_numerics_pass as hand  # noqa: E402

TARGETS = ["cpu", "mps_shim", "reference"]
BF16, F16, F64 = torch.bfloat16, torch.float16, torch.float64


def programs(g):
    a = torch.randn(8, 33, generator=g)
    i = torch.randint(-20, 20, (8, 33), generator=g)
    m = torch.rand(8, 33, generator=g) > 0.5
    yield "bf16", lambda x, y: ((x + y) * x / (y.abs() + 1), x > y, torch.where(x > 0, x, y * 2),
                                x.clamp(-1, 1) - y, torch.div(x, y, rounding_mode="floor")), (a.to(BF16), (a * 3).to(BF16))
    yield "fp16", lambda x, y: (x * 0.1 + y, (x - y).neg().abs(), x.to(torch.int32), x >= 0.5), (a.to(F16), a.flip(0).to(F16))
    yield "f64", lambda x, y: (x * y + 1.5, x / 3, (x > y).to(F64) * x), (a.double() * 1.0000001, a.double().abs())
    yield "mixed", lambda x, y, z, k, b: (x + y, y * z, k + x, b * y, k > y, x.float() + z.to(BF16), k * 2.5,
                                         (k // 3) % 4, b & (k > 0)), (a.to(BF16), a, a.double(), i, m)
    yield "casts", lambda d, x, y, k: (d.to(BF16), d.to(F16), x.to(torch.int8), y.to(BF16), (k > 0).to(F16),
                                       k.to(BF16), x.to(F64)), (a.double() * 7, a.to(BF16) * 20, a * 50, i)


@pytest.mark.parametrize("target", TARGETS)
def test_programs_match_eager_bit_for_bit(target):
    g = torch.Generator().manual_seed(0)
    for name, fn, inputs in programs(g):
        torch._dynamo.reset()
        got = torch.compile(fn, backend=fxwrap.Backend(target))(*inputs)
        for j, (o, w) in enumerate(zip(got, fn(*inputs))):
            assert o.dtype == w.dtype, (name, j)
            torch.testing.assert_close(o, w, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda msg, n=name, j=j: f"{target} {n} output {j}: {msg}")


@pytest.mark.parametrize("target", ["cpu", "mps_shim"])
def test_hand_made_kernel_after_legalize_matches_eager(target):
    manager = get_plugin_manager()
    t = manager.target(target)
    k, cases = hand.numeric_kernel()
    if target == "mps_shim":  # Metal has no double: drop the float64 input and its uses
        cases = [c for c in cases if c[0] not in ("cmp_bf_f64", "f64_to_bf", "bool_mul_f64")]
        ins = {b.name: b.dtype for b in k.inputs if b.dtype != F64}
        k = hand.kernel(ins, {n: (v, dt) for n, v, dt, _ in cases})
    em = t.emitter(t)
    em.size_hints = {}
    legal = legalize(k, manager.session(t).numerics)
    launch = em.load(em.render(legal))
    inputs = hand._inputs(torch.Generator().manual_seed(2))
    outs = [torch.empty(hand.N, dtype=b.dtype) for b in k.outputs]
    launch(*[inputs[b.name] for b in k.inputs], *outs)
    for (name, _, dt, fn), got in zip(cases, outs):
        torch.testing.assert_close(got, fn(inputs).to(dt), rtol=0, atol=0, equal_nan=True,
                                   msg=lambda msg, n=name: f"{target} {n}: {msg}")
