"""The GraphModule the CPU and CUDA targets run (``fxwrap.runtime.direct``): matrix
products call torch's Python bindings instead of ATen OpOverloads, with the same
results; ``program.graph_module`` keeps the ATen form."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.runtime.direct import DIRECT_CALLS, direct_graph_module

aten = torch.ops.aten


def _inputs(name: str):
    r = torch.randn
    return {
        "mm": ((r(7, 5), r(5, 3)), (7, 3)),
        "bmm": ((r(2, 7, 5), r(2, 5, 3)), (2, 7, 3)),
        "addmm": ((r(7, 3), r(7, 5), r(5, 3)), (7, 3)),
        "baddbmm": ((r(2, 7, 3), r(2, 7, 5), r(2, 5, 3)), (2, 7, 3)),
    }[name]


_MATMULS = sorted((op for op in DIRECT_CALLS if isinstance(op, torch._ops.OpOverload)
                   and not op._schema.name.startswith("aten::sym_")), key=str)


@pytest.mark.parametrize("op", _MATMULS, ids=str)
def test_binding_equals_the_aten_overload(op):
    name = op._schema.name.split("::")[1]
    args, out_shape = _inputs(name)
    kwargs = {"beta": 0.5, "alpha": 1.5} if name in ("addmm", "baddbmm") else {}
    binding = DIRECT_CALLS[op]
    if op._overloadname == "out":
        want, got = torch.full(out_shape, float("nan")), torch.full(out_shape, float("nan"))
        op(*args, **kwargs, out=want)
        binding(*args, **kwargs, out=got)
    else:
        want, got = op(*args, **kwargs), binding(*args, **kwargs)
    assert torch.equal(got, want)


def test_metadata_reads_equal_the_aten_overloads():
    base = torch.randn(6, 40)
    views = [base, base[2:, 3:], base.t(), base[1::2, ::3], base.view(2, 3, 40)[1]]
    for t in views:
        assert DIRECT_CALLS[aten.sym_storage_offset.default](t) == aten.sym_storage_offset.default(t)
        for d in range(t.dim()):
            assert DIRECT_CALLS[aten.sym_size.int](t, d) == aten.sym_size.int(t, d)
            assert DIRECT_CALLS[aten.sym_stride.int](t, d) == aten.sym_stride.int(t, d)
    assert len(_MATMULS) + 4 == len(DIRECT_CALLS)  # + the three reads and as_strided


def test_views_equal_as_strided():
    """The runner's views (no storage bounds check) equal ``torch.as_strided``: same
    storage, sizes, strides and offset, with and without an offset argument."""
    view_of = DIRECT_CALLS[torch.as_strided]
    storage = torch.randn(300)
    for base in (storage, storage[7:], storage[3:250].view(13, 19)[2:]):
        for size, stride, offset in (((4, 5), (5, 1), None), ((5, 4), (1, 5), 11), ((3, 2, 2), (1, 3, 17), 40)):
            args = (base, size, stride) if offset is None else (base, size, stride, offset)
            got, want = view_of(*args), torch.as_strided(*args)
            assert (got.data_ptr(), got.shape, got.stride(), got.storage_offset()) == \
                (want.data_ptr(), want.shape, want.stride(), want.storage_offset())
            assert torch.equal(got, want)


def test_view_offsets_are_read_directly_and_right():
    def f(x):
        return torch.exp(x[1:, 2:]) * 2 + x[:-1, :-2]

    x = torch.randn(9, 12)
    program = fxwrap.lower(f, x[1:], target="cpu")  # an input with a storage offset
    contract, runner = _targets(program.graph_module), _targets(program.runner)
    assert aten.sym_storage_offset.default in contract
    assert DIRECT_CALLS[aten.sym_storage_offset.default] in runner and aten.sym_storage_offset.default not in runner
    y = torch.randn(10, 12)  # same shape as x[1:], another storage offset
    got = program.run(y[2:])
    torch.testing.assert_close(got, f(y[2:]))


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_cpu_runner_calls_torch_mm_and_matches_eager():
    def f(x, w, b):
        return torch.relu(x @ w) @ w.t() + torch.addmm(b, x, w).sum()

    x, w, b = torch.randn(16, 8), torch.randn(8, 8), torch.randn(8)
    program = fxwrap.lower(f, x, w, b, target="cpu")
    contract, runner = _targets(program.graph_module), _targets(program.runner)
    assert aten.mm.out in contract and torch.mm not in contract
    assert torch.mm in runner and aten.mm.out not in runner
    runner = _targets(direct_graph_module(program.graph_module))  # calls retargeted one for one
    assert len(contract) == len(runner)
    assert all(c == r or DIRECT_CALLS.get(c) is r for c, r in zip(contract, runner))
    x2, w2, b2 = torch.randn(16, 8), torch.randn(8, 8), torch.randn(8)
    got = program.run(x2, w2, b2)
    # the sum of 128 products (magnitude ~100) is added to every element: fp32 summation
    # order alone moves the result by ~1e-5 absolute
    torch.testing.assert_close(got, f(x2, w2, b2), rtol=1e-5, atol=1e-4)


def test_graph_without_matrix_products_is_run_as_is():
    program = fxwrap.lower(lambda x: torch.exp(x) * 2, torch.randn(8), target="cpu")
    assert direct_graph_module(program.graph_module) is program.graph_module


def test_prologue_runs_first_on_every_call():
    calls = []

    def prologue():
        calls.append(len(calls))

    torch.fx.node.has_side_effect(prologue)
    program = fxwrap.lower(lambda x: torch.exp(x) * 2, torch.randn(8), target="cpu")
    direct = direct_graph_module(program.graph_module, prologue=prologue)
    nodes = list(direct.graph.nodes)
    first = next(n for n in nodes if n.op != "placeholder")
    assert first.op == "call_function" and first.target is prologue
    direct.graph.eliminate_dead_code()  # a call with no users, kept as a side effect
    assert any(n.target is prologue for n in direct.graph.nodes)
    direct.recompile()
    x = torch.randn(8)
    for _ in range(2):
        (got,) = direct(x)
        torch.testing.assert_close(got, torch.exp(x) * 2)
    assert calls == [0, 1]
