"""Differential tests of the lowering rules through the C++ target, against eager.

Many ops share one compiled function (one fused kernel), so each test compiles a
handful of kernels; every run draws fresh random inputs.
"""
from __future__ import annotations


import json

import pytest
import torch

import fxwrap
import shared_helpers
from fxwrap.ir.lines import CallExtern

import os
TARGET = os.environ.get("FXWRAP_TEST_TARGET", "cpu")
LAYOUTS = ["contiguous", "transposed", "sliced", "broadcast"]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-9),
       torch.bfloat16: dict(rtol=4e-2, atol=2e-2)}  # fused bf16 keeps fp32 intermediates


def make(layout: str, dtype=torch.float32, scale=1.0, shape=(37, 65)):
    """A fresh random input of ``shape`` laid out as asked."""
    return shared_helpers.random_input(layout, dtype, shape, scale)


def compiled(fn, dynamic):
    programs = []
    f = torch.compile(fn, backend=fxwrap.Backend(TARGET, {"on_program": programs.append}),
                      dynamic=dynamic)
    return f, programs


def kernel_count(programs):
    return len(shared_helpers.kernels(programs))


# Size, stride and offset reads are how a program learns sizes, not computation.
_METADATA_READS = ("sym_size", "sym_stride", "sym_storage_offset", "sym_numel")
aten = torch.ops.aten

# Ops of these tests that run as ATen extern calls on purpose, with the reason.
_NO_RULE = "no lowering rule yet (add it to fxwrap/core/rules, then drop this entry)"
EXTERNS = {
    "elu": {aten.elu: _NO_RULE},
    "leaky_relu": {aten.leaky_relu: _NO_RULE},
    "hypot": {aten.hypot: _NO_RULE},
    "flip": {aten.flip: _NO_RULE},
}


def expected_externs(*names: str) -> dict:
    return {op: reason for name in names for op, reason in EXTERNS[name].items()}


def extern_ops(programs) -> set:
    """The ATen ops (as packets: ``aten.elu``) the programs run as extern calls, size reads aside."""
    ops = set()
    for program in programs:
        for line in program.lines:
            if isinstance(line, CallExtern) and isinstance(line.op, torch._ops.OpOverload):
                packet = line.op.overloadpacket
                if not packet.__name__.startswith(_METADATA_READS):
                    ops.add(packet)
    return ops


def check(fn, args, dynamic, tol, externs=None):
    """``fn`` compiled gives eager's numbers, and every ATen op of it runs inside a
    generated kernel: the programs call no ATen op as an extern except ``externs``
    (``{packet: reason}``, each of which must still be an extern: a new lowering rule
    for one makes this fail until its entry goes)."""
    externs = {} if externs is None else externs
    torch._dynamo.reset()
    f, programs = compiled(fn, dynamic)
    got, want = f(*args), fn(*args)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, **tol)
    ran_as_externs = extern_ops(programs)
    unexpected = sorted(str(op) for op in ran_as_externs - set(externs))
    assert not unexpected, f"target {TARGET}: {unexpected} ran as ATen extern calls, not in a kernel"
    lowered_now = sorted(str(op) for op in set(externs) - ran_as_externs)
    assert not lowered_now, (f"target {TARGET}: {lowered_now} now run in kernels; drop them from the "
                             "expected externs")
    assert kernel_count(programs) >= 1
    return programs


unary_float = shared_helpers.unary_float



# every dtype x layout x static/dynamic, except the dynamic sliced/broadcast layouts of
# the non-float32 dtypes: layout handling is dtype-independent, float32 covers it
UNARY_CASES = [(dtype, layout, dynamic)
               for dtype in (torch.float32, torch.float64, torch.bfloat16) for layout in LAYOUTS
               for dynamic in (False, True)
               if dtype == torch.float32 or layout not in ("sliced", "broadcast") or not dynamic]


@pytest.mark.parametrize("dtype,layout,dynamic", UNARY_CASES)
def test_unary_float(dtype, layout, dynamic):
    x = make(layout, dtype)
    check(unary_float, (x,), dynamic, TOL[dtype], expected_externs("elu", "leaky_relu"))


def binary_float(x, y, ny):
    # ny (positive divisor) is an input: floor/trunc/fmod are discontinuous, so a
    # fused kernel's unrounded bf16 intermediate would legitimately flip results.
    return (x + y, x - y, x * y, x / ny, x + 2 * y, torch.add(x, y, alpha=3), torch.div(x, ny, rounding_mode="floor"),
            torch.div(x, ny, rounding_mode="trunc"), torch.pow(x.abs() + 0.1, y), x ** 2, 2 ** x,
            torch.maximum(x, y), torch.minimum(x, y), torch.fmod(x, ny), torch.remainder(x, ny),
            torch.atan2(x, y), torch.copysign(x, y), x < y, x <= y, x > y, x >= y, x == y, x != y,
            torch.where(x > y, x, y), torch.where(x > 0, x, 0.5), torch.lerp(x, y, 0.3),
            torch.hypot(x, y), x * 0.5 + 1)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # bf16: unary/reduction/norm tests
def test_binary_float(dtype, layout, dynamic):
    x = make(layout, dtype)
    y = make("contiguous", dtype)[0]  # (m,) broadcast against (n, m)
    ny = make("contiguous", dtype)[1].abs() + 0.5
    check(binary_float, (x, y, ny), dynamic, TOL[dtype], expected_externs("hypot"))


def integer_ops(a, b):
    nb = b.abs() + 1
    return (a + b, a - b, a * b, a // nb, torch.div(a, nb, rounding_mode="trunc"), a % nb,
            torch.fmod(a, nb), a.abs(), -a, a.sign(), torch.maximum(a, b), torch.minimum(a, b),
            a & b, a | b, a ^ b, ~a, a << (nb % 5), a >> (nb % 5), a < b, a == b, a.clamp(-3, 3),
            a.to(torch.float32) / nb, torch.where(a > b, a, b), a.float().mul(0.5).to(a.dtype))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer(dtype, dynamic):
    a = torch.randint(-50, 50, (31, 17), dtype=dtype)
    b = torch.randint(-50, 50, (31, 17), dtype=dtype)
    check(integer_ops, (a, b), dynamic, dict(rtol=0, atol=0), expected_externs())


def bool_ops(p, q):
    return (p & q, p | q, p ^ q, ~p, torch.logical_and(p, q), torch.logical_or(p, q),
            torch.logical_xor(p, q), torch.logical_not(p), p == q, torch.where(p, 1.5, -2.0),
            p.to(torch.int64) + q.to(torch.int64))


@pytest.mark.parametrize("dynamic", [False, True])
def test_bool(dynamic):
    p, q = torch.rand(23, 9) > 0.5, torch.rand(23, 9) > 0.5
    check(bool_ops, (p, q), dynamic, dict(rtol=0, atol=0))


def reductions(x):
    return (x.sum(0), x.sum(1), x.sum(), x.sum(1, keepdim=True), x.mean(0), x.mean(1),
            x.mean(), x.amax(0), x.amax(1), x.amin(1), x.max(), x.min(), x.argmax(1), x.argmin(0),
            x.argmax(0, keepdim=True), x.var(1), x.var(0, correction=0), x.std(1), x.var(),
            *torch.var_mean(x, 1), (x > 0.5).any(1), (x > -3).all(0), x.logsumexp(1),
            torch.softmax(x, -1), torch.log_softmax(x, -1), torch.softmax(x, 0),
            x.prod(1) if x.dtype != torch.bfloat16 else x.sum(1),
            x.sum(1) / x.abs().amax(1))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_reductions(dtype, layout, dynamic):
    x = make(layout, dtype, shape=(29, 67))
    tol = dict(TOL[dtype])
    if dtype == torch.float32:
        tol = dict(rtol=1e-4, atol=1e-4)
    check(reductions, (x,), dynamic, tol)


def norms(x, w, b, r):
    h = x + r
    rms = h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype) * w
    return (torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b), h, rms,
            torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5) if hasattr(torch.nn.functional, "rms_norm") else h)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms(dtype, dynamic):
    x, r = torch.randn(33, 96).to(dtype), torch.randn(33, 96).to(dtype)
    w, b = torch.randn(96).to(dtype), torch.randn(96).to(dtype)
    check(norms, (x, w, b, r), dynamic, dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else TOL[dtype])


def views(x):
    y = x.sin() + 1
    return (y.t() * 2, y[2:7, 1::3].exp(), y[3] + 1, y.unsqueeze(1).expand(-1, 4, -1) * 3,
            y.reshape(-1) * 2, y.reshape(x.shape[1], x.shape[0]) + 1, y.permute(1, 0)[::2] - 1,
            y.view(-1, 4, 2).sum(1) if x.shape[1] % 8 == 0 else y, torch.cat([y, x], 0) * 2,
            torch.nn.functional.pad(y, (1, 2, 3, 0)) + 1, y.flip(0) * 1)


@pytest.mark.parametrize("dynamic", [False, True])
def test_views(dynamic):
    x = torch.randn(12, 16)
    check(views, (x,), dynamic, dict(rtol=1e-5, atol=1e-5), expected_externs("flip"))


def test_index_ops():
    x, idx = torch.randn(10, 6), torch.randint(0, 10, (7,))
    emb = torch.randn(10, 8)
    fn = lambda x, idx, emb: (torch.gather(x, 0, idx[:6].view(1, 6).expand(3, 6)),  # noqa: E731
                              torch.nn.functional.embedding(idx, emb) * 2, torch.arange(7) * 2 + idx,
                              torch.full((3, 4), 2.5) + x[:3, :4], x[idx] + 1)
    check(fn, (x, idx, emb), False, dict(rtol=1e-6, atol=1e-6))


def test_input_mutation_copy_():
    def f(x, y):
        x.add_(y)
        x.mul_(2)
        return x.sum()
    torch._dynamo.reset()
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    x_ref = x.clone()
    g, _ = compiled(f, False)
    out = g(x, y)
    want = f(x_ref, y)
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(out, want)


def test_pointwise_chain_is_one_kernel_without_externs():
    torch._dynamo.reset()
    x, y = torch.randn(64, 128), torch.randn(64, 128)
    fn = lambda x, y: (x * torch.sigmoid(x) + torch.exp(y) - 1) * 0.5  # noqa: E731
    f, programs = compiled(fn, False)
    torch.testing.assert_close(f(x, y), fn(x, y))
    nodes = [n for p in programs for n in p.graph_module.graph.nodes if n.op == "call_function"]
    assert kernel_count(programs) == 1
    assert not [n for n in nodes if isinstance(n.target, torch._ops.OpOverload)]


@pytest.mark.parametrize("fn, kernels", [
    (lambda x: torch.softmax(x, -1), 1),
    (lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)), 1),
    (lambda x: x.sum(0), 1),
])
def test_fused_kernel_counts(fn, kernels):
    torch._dynamo.reset()
    x = torch.randn(48, 80)
    f, programs = compiled(fn, False)
    torch.testing.assert_close(f(x), fn(x), rtol=1e-5, atol=1e-5)
    assert kernel_count(programs) == kernels


SOURCES_IN_A_FRESH_PROCESS = """
import json, torch, fxwrap
fn = lambda x: torch.softmax(x * 2, -1) + x.mean(0)
for dynamic in (False, True):
    program = fxwrap.lower(fn, torch.randn(16, 32), target="cpu", dynamic=dynamic)
    sources = [n.target.source for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
print(json.dumps([sources, program.code()]))
"""


def test_kernel_sources_are_deterministic():
    """Two processes that share nothing (hash seeds, caches) render the same kernels and program."""
    first, second = shared_helpers.in_two_processes(SOURCES_IN_A_FRESH_PROCESS)
    assert json.loads(first)[0] and first == second

