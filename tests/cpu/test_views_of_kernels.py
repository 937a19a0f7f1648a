"""A view of a value computed in a kernel, needed by an extern, is a ``View`` of the
kernel's output, not a second kernel storing the same values in the view's layout."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallKernel, View


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_transposed_use_of_a_kernel_output_is_a_view(dynamic):
    def f(a, b, w, x):
        g = torch.tanh(a) * b            # one kernel
        return g.t() @ x, g @ w          # mm(g.t(), x) first, then mm(g, w): a gradient's two uses

    args = (torch.randn(64, 48), torch.randn(64, 48), torch.randn(48, 16), torch.randn(64, 8))
    program = fxwrap.lower(f, *args, dynamic=dynamic)
    launches = [line for line in program.lines if isinstance(line, CallKernel)]
    assert len(launches) == 1
    assert [a.role for a in launches[0].kernel.signature].count("output") == 1  # g, stored once
    (stored,) = [a for a in launches[0].args if getattr(a, "name", "").startswith("buf")]
    views = [line for line in program.lines if isinstance(line, View) and line.base.name == stored.name]
    assert views and tuple(views[0].buf.stride) == (1, stored.size[1])  # g.t() over g's storage
    out = program.run(*args)
    want = f(*args)
    for got, expected in zip(out, want):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
