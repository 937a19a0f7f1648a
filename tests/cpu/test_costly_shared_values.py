"""A lazy value computed with a math-library call the C++ vector loops cannot inline
(``CppEmitter.costly_ops``: ``std::cos``, ``std::sin``, ``std::log``...) and read by several
nodes is stored once (``core.scheduler.worth_storing``), not computed again in every
reader's kernel: HF Llama's rotary tables ``cos(position * inv_freq)``, read by q's and
k's rotation in every layer, were computed once per batch, head and layer (four rope
kernels of hf_llama: 1.7 ms where Inductor's vectorized ones take 0.5 ms)."""
from __future__ import annotations

import torch

import fxwrap
from fxwrap.ir.lines import CallKernel


def _body(kernel) -> str:
    """The kernel's own function (its source opens with the shared prelude)."""
    return kernel.source[kernel.source.index('extern "C"'):]


def _kernels_calling(programs, call):
    return [ln.kernel for p in programs for ln in p.lines
            if isinstance(ln, CallKernel) and call in _body(ln.kernel)]


def _compile(fn):
    torch._dynamo.reset()
    programs = []
    return torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "cache": False}),
                         fullgraph=True), programs


def _rope_like(q, k, pos, inv):
    angles = pos[:, None] * inv[None, :]                 # [T, D]
    cos, sin = angles.cos(), angles.sin()
    q_out = q * cos + q.flip(-1) * sin                     # [B, H, T, D]: cos, sin read twice
    k_out = k * cos + k.flip(-1) * sin
    return q_out, k_out


def test_rotary_tables_computed_once():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 64, 16, generator=g), torch.randn(2, 1, 64, 16, generator=g)
    pos, inv = torch.arange(64, dtype=torch.float32) * 0.37, torch.rand(16, generator=g) + 0.1
    compiled, programs = _compile(_rope_like)
    got = compiled(q, k, pos, inv)
    want = _rope_like(q, k, pos, inv)
    for g_, w in zip(got, want):
        torch.testing.assert_close(g_, w, atol=1e-5, rtol=1e-5)
    # one kernel computes the tables (64 x 16 elements each); q's and k's kernels load them
    for call in ("std::cos(", "std::sin("):
        (kernel,) = _kernels_calling(programs, call)
        assert "ranges: (64, 16)" in kernel.source


def test_a_costly_value_read_once_stays_inlined():
    """One reader: nothing is computed twice, the value stays in its reader's kernel."""
    def fn(x, pos):
        return x * pos.log1p()[None, :]
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(8, 32, generator=g), torch.rand(32, generator=g)
    compiled, programs = _compile(fn)
    torch.testing.assert_close(compiled(x, pos), fn(x, pos), atol=1e-6, rtol=1e-6)
    kernels = [ln.kernel for p in programs for ln in p.lines if isinstance(ln, CallKernel)]
    assert len(kernels) == 1 and "std::log1p(" in _body(kernels[0])


def test_vectorized_math_stays_inlined_into_each_reader():
    """``exp`` renders as the prelude's inline ``fx_expf`` (it vectorizes): a shared ``exp``
    value is cheap to compute again and stays in each reader's kernel (no extra buffer)."""
    def fn(x, y, t):
        e = t.exp()
        return x * e, y + e
    g = torch.Generator().manual_seed(2)
    x, y, t = (torch.randn(16, 64, generator=g) for _ in range(3))
    compiled, programs = _compile(fn)
    for got, want in zip(compiled(x, y, t), fn(x, y, t)):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert not _kernels_calling(programs, "std::exp(") and len(_kernels_calling(programs, "fx_exp(")) == 1
    assert all(len([ln for ln in p.lines if isinstance(ln, CallKernel)]) == 1 for p in programs)
