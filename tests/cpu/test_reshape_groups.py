"""A reshape of a lazy value maps each group of dims of equal element count on its own
(fxwrap/core/rules/views.py): the source index of a split is a sum of its own new dims,
the one of a merge a floor-division/modulo of its own new dim -- never a modulo of the
whole flat index (Swin-T's window partitions built such expressions for every load, and
sympy spent most of the model's lowering simplifying them).  Numbers against eager."""
from types import SimpleNamespace

import pytest
import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

import fxwrap
from fxwrap.core.lowering import Loops
from fxwrap.core.rules import views
from fxwrap.ir.loops import Op

I = sympy.Integer


@pytest.mark.parametrize("old, new, groups", [
    ((2, 12, 5), (2, 3, 4, 5), [([0], [0]), ([1], [1, 2]), ([2], [3])]),
    ((2, 3, 4, 5), (2, 60), [([0], [0]), ([1, 2, 3], [1])]),
    ((1, 6, 1, 4), (3, 1, 8), [([1, 3], [0, 2])]),               # 24 in one group, size-1 dims out
    ((2, 7, 2, 7, 3), (4, 49, 3), [([0, 1, 2, 3], [0, 1]), ([4], [2])]),  # 2*7*2*7 = 4*49
    ((6, 4), (4, 6), [([0, 1], [0, 1])]),                         # no common boundary inside
    ((1,), (1, 1), []),
])
def test_groups(old, new, groups):
    assert views._reshape_groups(tuple(map(I, old)), tuple(map(I, new))) == groups


def test_symbolic_sizes_pair_up_or_fall_back():
    s0, s1 = sympy.symbols("s0 s1", positive=True, integer=True)
    assert views._reshape_groups((s0, I(12)), (s0, I(3), I(4))) == [([0], [0]), ([1], [1, 2])]
    assert views._reshape_groups((s0, s1), (s0 * s1,)) is None  # not decided without the sizes: flat index


def _source_index(old, new):
    """The index ``views._reshape`` reads its input at for the output index (x0, x1, ...)."""
    seen = []
    x = Loops(tuple(map(I, old)), torch.float32, torch.device("cpu"),
              lambda i: seen.append(i) or Op.const(1.0, torch.float32))
    out = views._reshape(SimpleNamespace(out_size=tuple(map(I, new)), device=torch.device("cpu")), x, list(new))
    index = sympy.symbols(f"x0:{len(new)}", nonnegative=True, integer=True)
    out(index)
    return index, seen[0]


def test_split_reads_a_sum_of_its_own_dims():
    (x0, x1, x2, x3), src = _source_index((2, 12, 5), (2, 3, 4, 5))
    assert src == (x0, 4 * x1 + x2, x3)


def test_merge_reads_its_own_dim_only():
    (x0, x1), src = _source_index((2, 3, 4, 5), (2, 60))
    assert src == (x0, FloorDiv(x1, 20), ModularIndexing(x1, 5, 4), ModularIndexing(x1, 1, 5))


def _window_partition(x):
    b, h, w, c = x.shape
    y = x.sin().view(b, h // 7, 7, w // 7, 7, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, 49, c)
    y = y * 2 + 1
    return y.view(b, h // 7, w // 7, 7, 7, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c).cos()


def _mixed(x):
    b, h, w, c = x.shape
    y = x.exp().reshape(b, h * w, c).transpose(1, 2).reshape(b * c, h, w)
    return y.unsqueeze(1).reshape(b, c, h * w).flatten().view(-1, 2).sum(1)


def _unaligned(x):
    return x.tanh().reshape(-1).view(6, -1).t().reshape(-1, 4)[:, 1:].reshape(-1) + 1


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", [_window_partition, _mixed, _unaligned])
def test_reshape_chains_match_eager(fn, dynamic):
    torch._dynamo.reset()
    x = torch.randn(2, 14, 21, 4)
    got = fxwrap.compile(fn, target="cpu", dynamic=dynamic, options={"cache": False})(x)
    torch.testing.assert_close(got, fn(x))
