"""Symbolic sizes: size inputs, arithmetic nodes, one GraphModule for many sizes."""
from __future__ import annotations

import operator

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor

from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, DefineSymbol, Return, SizeInput, View,
)
from fxwrap.wrapper_ir.printer import program_source

import null_helpers as H

aten = torch.ops.aten


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_dynamic_program_has_size_inputs_and_runs_at_two_sizes():
    program = H.lower(H.mlp, *H.mlp_inputs(_gen(1)), dynamic=True)
    sizes = [i for i in program.inputs if isinstance(i, SizeInput)]
    assert [s.hint for s in sizes] == [8, 16, 32, 4]
    assert len({s.symbol for s in sizes}) == 4
    gm = program.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in placeholders] == [i.name for i in program.inputs]
    for n, inp in zip(placeholders, program.inputs):
        if isinstance(inp, SizeInput):
            assert isinstance(n.meta["val"], torch.SymInt)
            assert n.meta["val"].node.expr == inp.symbol and n.meta["val"].node.hint == inp.hint
        else:
            assert isinstance(n.meta["val"], FakeTensor)
    # allocations are sized by the symbols, never by the hints
    allocs = [n for n in gm.graph.nodes if n.target is torch.empty_strided]
    assert allocs
    for n in allocs:
        assert any(isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in n.args[0])
    assert "empty_strided((s" in program.code()
    for shape in ((5, 12, 20, 3), (9, 7, 11, 6), (8, 16, 32, 4)):
        tensors = H.mlp_inputs(_gen(sum(shape)), *shape)
        args = H.graph_args(program.inputs, tensors)
        out = gm(*args)
        assert out[0].shape == (shape[0], shape[3])
        H.assert_close_all(out, (H.mlp(*tensors),))


def test_dynamic_views_program_at_two_sizes():
    program = H.lower(H.views, torch.randn(6, 8, generator=_gen(2)), dynamic=True)
    assert any(isinstance(i, SizeInput) for i in program.inputs)
    for shape in ((7, 9), (10, 12)):
        x = torch.randn(*shape, generator=_gen(shape[0]))
        H.assert_close_all(program.graph_module(*H.graph_args(program.inputs, [x])), H.views(x))


def _symbolic_lines():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    n = SizeInput(s0, 3)
    x = Buffer("arg1", (s0,), (1,), H.F32, H.CPU)
    buf0 = Buffer("buf0", (2 * s0,), (1,), H.F32, H.CPU)
    odd = Buffer("buf1", (s0,), (2,), H.F32, H.CPU, offset=sympy.Integer(1))
    tail = Buffer("buf2", (s0 - 1,), (1,), H.F32, H.CPU, offset=s0 + 1)
    u0 = sympy.Symbol("u0", integer=True)
    lines = [
        Allocate(buf0),
        CallExtern(aten.cat.out, ([x, x],), (("out", buf0),)),
        View(odd, buf0),
        View(tail, buf0),
        DefineSymbol(u0, 3 * s0 + 1),
        Return((odd, tail, u0, s0 * 2 - 1)),
    ]
    return [n, x], lines


def test_symbolic_allocate_renders_arithmetic_nodes():
    inputs, lines = _symbolic_lines()
    gm = to_graph_module(inputs, lines)
    nodes = {n.name: n for n in gm.graph.nodes}
    s0 = nodes["s0"]
    size_arg = nodes["buf0"].args[0][0]
    assert size_arg.op == "call_function" and size_arg.target is operator.mul
    assert sorted(map(str, size_arg.args)) == ["2", "s0"]
    tail = nodes["buf2"]
    assert tail.target is torch.as_strided
    size, offset = tail.args[1][0], tail.args[3]
    assert size.target is operator.add and offset.target is operator.add
    assert s0 in size.args and -1 in size.args and s0 in offset.args and 1 in offset.args
    arith = [n for n in gm.graph.nodes if n.target in (operator.add, operator.mul)]
    assert len(arith) == len({(n.target, n.args) for n in arith})  # each expression computed once
    sym = s0.meta["val"]
    assert isinstance(sym, torch.SymInt)
    e = sym.node.expr
    assert nodes["buf0"].meta["val"].shape[0].node.expr == 2 * e
    assert [d.node.expr for d in tail.meta["val"].shape] == [e - 1]
    assert tail.meta["val"].storage_offset().node.expr == e + 1
    assert nodes["buf1"].meta["val"].stride() == (2,)
    text = program_source(inputs, lines)
    assert "buf0 = empty_strided((2*s0,), (1,), dtype=torch.float32, device='cpu')" in text
    assert "buf2 = as_strided(buf0, (s0 - 1,), (1,), s0 + 1)  # view" in text
    assert "u0 = 3*s0 + 1" in text
    for n in (3, 7):
        x = torch.randn(n, generator=_gen(n))
        odd, tail_out, u0, last = gm(n, x)
        torch.testing.assert_close(odd, torch.cat([x, x])[1::2])
        torch.testing.assert_close(tail_out, torch.cat([x, x])[n + 1:])
        assert (u0, last) == (3 * n + 1, 2 * n - 1)


def test_shared_symbols_across_buffers_without_builder_fakes():
    """Hand-made symbolic lines still give every buffer node a FakeTensor, and the buffers
    share the size symbol: one ShapeEnv, and each size is an expression of the placeholder
    s0's own symbol (``2*s0``, ``s0``, ``s0 - 1``), not a fresh symbol per buffer."""
    inputs, lines = _symbolic_lines()
    gm = to_graph_module(inputs, lines)
    nodes = {n.name: n for n in gm.graph.nodes}
    fakes = {name: nodes[name].meta.get("val") for name in ("arg1", "buf0", "buf1", "buf2")}
    assert all(isinstance(v, FakeTensor) for v in fakes.values()), fakes
    s0 = nodes["s0"].meta["val"]
    assert isinstance(s0, torch.SymInt)
    symbol = s0.node.expr
    assert isinstance(symbol, sympy.Symbol)
    envs = {id(v.fake_mode.shape_env) for v in fakes.values()} | {id(s0.node.shape_env)}
    assert len(envs) == 1
    sizes = {name: v.size(0).node.expr if isinstance(v.size(0), torch.SymInt) else v.size(0)
             for name, v in fakes.items()}
    assert sizes == {"arg1": symbol, "buf0": 2 * symbol, "buf1": symbol, "buf2": symbol - 1}
    assert fakes["buf1"].stride() == (2,) and fakes["buf2"].storage_offset().node.expr == symbol + 1


def _eval_index(expr, point):
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing
    value = expr.xreplace({k: sympy.Integer(v) for k, v in point.items()})
    return int(value.replace(FloorDiv, lambda a, b: a // b)
               .replace(ModularIndexing, lambda a, b, c: (a // b) % c))


def test_simplify_index_removes_reshape_round_trips():
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from fxwrap.ir.symbolic import simplify_index
    x0, x1 = sympy.Symbol("x0", integer=True, nonnegative=True), sympy.Symbol("x1", integer=True, nonnegative=True)
    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    flat = 768 * x0 + x1  # (1024, 768) read as (8, 128, 768) and back
    e = 98304 * FloorDiv(flat, 98304) + ModularIndexing(x1, 1, 768) + 768 * ModularIndexing(flat, 768, 128)
    assert simplify_index(e, {x0: 1024, x1: 768}) == flat
    dyn = s0 * s1 * FloorDiv(s0 * x0 + x1, s0 * s1) + ModularIndexing(x1, 1, s0) + s0 * ModularIndexing(
        s0 * x0 + x1, s0, s1)
    assert simplify_index(dyn, {x0: 8 * s1, x1: s0}) == s0 * x0 + x1
    # what the ranges do not make trivial stays
    kept = ModularIndexing(x0, 1, 7) + FloorDiv(x1, 3)
    assert simplify_index(kept, {x0: 10, x1: 9}) == kept
    assert simplify_index(kept, {x0: 10, x1: 2}) == ModularIndexing(x0, 1, 7)


def test_simplify_index_keeps_every_value():
    """Random reshapes of random sizes: the simplified index equals the original at
    every point of the loop ranges."""
    import random

    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from fxwrap.ir.symbolic import simplify_index
    rng = random.Random(3)
    xs = [sympy.Symbol(f"x{i}", integer=True, nonnegative=True) for i in range(3)]
    for _ in range(60):
        sizes = [rng.choice([1, 2, 3, 4, 6, 8]) for _ in range(3)]
        strides = [rng.choice([1, 2, 5, 12, 24]) for _ in range(3)]
        flat = sizes[1] * sizes[2] * xs[0] + sizes[2] * xs[1] + xs[2]
        total = sizes[0] * sizes[1] * sizes[2]
        # view the flat index as another shape (a, b) then read it with strides
        a = rng.choice([d for d in range(1, total + 1) if total % d == 0])
        b = total // a
        expr = strides[0] * FloorDiv(flat, b) + strides[1] * ModularIndexing(flat, 1, b) \
            + strides[2] * ModularIndexing(flat, rng.choice([1, 2, 3]), rng.choice([2, 3, 4]))
        ranges = dict(zip(xs, sizes))
        simple = simplify_index(expr, ranges)
        for i in range(sizes[0]):
            for j in range(sizes[1]):
                for k in range(sizes[2]):
                    point = {xs[0]: i, xs[1]: j, xs[2]: k}
                    assert _eval_index(simple, point) == _eval_index(expr, point), (expr, simple, point)


def test_divides_without_cancel_agrees_with_cancel():
    """``symbolic._divides`` skips ``sympy.cancel`` for an integer times atoms; its answer is
    cancel's on every such term (and on the terms that still go through cancel)."""
    import random

    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from fxwrap.ir.symbolic import _divides

    def by_cancel(d, term):
        quotient = sympy.cancel(term / d)
        if sympy.fraction(quotient)[1] != 1:
            return None
        return quotient if quotient.as_coeff_Mul()[0].is_Integer else None

    x0, x1, s0 = sympy.Symbol("x0", integer=True, nonnegative=True), sympy.Symbol("x1", integer=True,
                                                                                  nonnegative=True), \
        sympy.Symbol("s0", integer=True, positive=True)
    atoms = [x0, x1, s0, FloorDiv(x0, 3), ModularIndexing(x1, 1, 7), sympy.Integer(1)]
    rng = random.Random(0)
    checked = 0
    for _ in range(300):
        coeff = rng.choice([1, 2, 3, 6, 48, 96, 256, 768, -512, 1000])
        term = sympy.Integer(coeff) * sympy.Mul(*rng.sample(atoms, rng.randint(1, 3)))
        for d in (sympy.Integer(rng.choice([2, 3, 16, 256, 7])), s0, 2 * s0):
            _divides.cache_clear()
            assert _divides(d, term) == by_cancel(d, term), (d, term)
            checked += 1
    assert checked == 900
