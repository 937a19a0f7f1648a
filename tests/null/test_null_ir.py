"""The loop IR (``fxwrap.ir.loops``): interned nodes, O(1) hashing, one rewrite engine.

The DAGs here share sub-expressions the way ``x = x * sigmoid(x)`` repeated does:
depth ``n`` is ``2n + 1`` distinct nodes but a tree of about ``2**n``; every walk
must cost the former.
"""
from __future__ import annotations

import gc
import pickle
import time

import pytest
import sympy
import torch

from fxwrap.ir.loops import (BOOL_RESULT, EXACT_16BIT, OP_INFO, Op, OpCode, acc_key, format_ssa, load_buffer,
                            load_index, load_mask, result_dtype, rewrite, tree_size, value_deps, walk, xvar)

F32, I64 = torch.float32, torch.int64
x0, x1 = xvar(0), xvar(1)


def silu_chain(depth: int, leaf: Op | None = None) -> Op:
    """``x * sigmoid(x)`` applied ``depth`` times: each level uses the one below twice."""
    v = Op.load("arg0", x0, F32) if leaf is None else leaf
    for _ in range(depth):
        v = Op("mul", F32, (v, Op("sigmoid", F32, (v,))))
    return v


def test_equal_nodes_are_the_same_object():
    a = Op("add", F32, (Op.load("arg0", 64 * x0 + x1, F32), Op.const(1.0, F32)))
    b = Op("add", F32, (Op.load("arg0", 64 * x0 + x1, F32), Op.const(1.0, F32)))
    assert a is b and hash(a) == hash(b)
    assert Op(OpCode.ADD, F32, a.src) is a  # a name or an OpCode: the same node
    assert Op("add", torch.float64, a.src) is not a  # the dtype is part of the node
    assert Op.load("arg0", 64 * x0 + x1, F32) is not Op.load("arg1", 64 * x0 + x1, F32)
    # constants are normalized to their dtype: 2 and 2.0 of float32 are one constant...
    assert Op.const(2, F32) is Op.const(2.0, F32) and Op.const(2.0, F32).arg == 2.0
    assert Op.const(3.0, I64) is Op.const(3, I64) and Op.const(1, torch.bool).arg is True
    # ...but 0.0 and -0.0 (equal in Python) are two, and every NaN is one
    assert Op.const(0.0, F32) is not Op.const(-0.0, F32)
    assert Op.const(float("nan"), F32) is Op.const(float("nan"), F32)


def test_nodes_are_immutable_and_copy_to_themselves():
    import copy
    a = Op("neg", F32, (Op.const(1.0, F32),))
    with pytest.raises(AttributeError, match="immutable"):
        a.op = OpCode.ABS
    assert copy.copy(a) is a and copy.deepcopy(a) is a
    assert pickle.loads(pickle.dumps(a)) is a  # unpickling interns again


def test_hashing_a_deep_chain_does_not_recurse():
    """Depth 10000, no sharing: a recursive hash or == would overflow the stack."""
    v = Op.load("arg0", x0, F32)
    start = time.perf_counter()
    for i in range(10000):
        v = Op("add", F32, (v, Op.const(float(i % 7), F32)))
    table = {v: 1}
    again = Op("add", F32, v.src)  # rebuilding the root finds it
    assert again is v and table[again] == 1
    assert len(walk(v)) == 10000 + 1 + 7
    assert pickle.loads(pickle.dumps(v)) is v
    assert time.perf_counter() - start < 10


def test_shared_subexpressions_cost_their_distinct_nodes():
    """Depth 300: a tree of ~2**300 nodes, a DAG of 601; everything must see the DAG."""
    small, calls = silu_chain(12), []
    rewrite(small, calls.append)  # first small: a tree walk fails here instead of hanging
    assert len(calls) == len(walk(small)) == 25
    start = time.perf_counter()
    v = silu_chain(300)
    assert len({v, silu_chain(300)}) == 1
    assert len(walk(v)) == 601
    assert tree_size(v, limit=1000) == 1001  # capped, never expanded
    calls = []

    def count(node):
        calls.append(node)
    rewrite(v, count)
    assert len(calls) == 601  # the rule sees each distinct node once
    lines = format_ssa([v])
    assert len(lines) == 601 and lines[-1] == "%600 = mul.f32 %598 %599"
    assert value_deps(v, {}) == frozenset({"x0"})
    assert "%600 = mul.f32" in repr(v)  # a big DAG prints as SSA, not as a tree
    assert time.perf_counter() - start < 10


def test_rewrite_is_bottom_up_and_keeps_what_it_does_not_change():
    v = silu_chain(3)
    swapped = rewrite(v, {OpCode.LOAD: lambda n: Op.load("arg1", load_index(n), n.dtype)})
    assert swapped is silu_chain(3, Op.load("arg1", x0, F32))
    assert rewrite(v, lambda n: None) is v  # nothing changed: the same node back
    # the rule sees operands already rewritten: sigmoid -> 1 / (1 + exp(-x)) everywhere
    expanded = rewrite(v, {"sigmoid": lambda n: Op("reciprocal", F32, (Op("add", F32, (
        Op.const(1.0, F32), Op("exp", F32, (Op("neg", F32, n.src),)))),))})
    assert not any(n.op == OpCode.SIGMOID for n in walk(expanded))
    assert sum(n.op == OpCode.EXP for n in walk(expanded)) == 3
    memo: dict = {}
    first = rewrite(v, lambda n: None, memo)
    assert rewrite(v.src[0], lambda n: pytest.fail("memo not used"), memo) is first.src[0]


def test_load_fields():
    direct = Op.load("a", 4 * x0 + 1, F32)
    assert direct.src == () and direct.arg == ("a", 4 * x0 + 1)
    assert (load_buffer(direct), load_index(direct), load_mask(direct)) == ("a", 4 * x0 + 1, None)
    offset = Op("add", I64, (Op.index(x1), Op("mul", I64, (Op.load("i", x0, I64), Op.index(64)))))
    mask = Op("lt", torch.bool, (Op.index(x0), Op.index(5)))
    indirect = Op.load("w", offset, F32, mask)
    assert indirect.src == (offset, mask) and indirect.arg == ("w", None)
    assert load_index(indirect) is offset and load_mask(indirect) is mask
    masked_direct = Op.load("a", x0, F32, mask)
    assert load_index(masked_direct) == x0 and load_mask(masked_direct) is mask
    assert acc_key(Op.acc("acc0", 1, F32)) == ("acc0", 1)
    assert format_ssa([indirect]) == [
        "%0 = index.i64 x1", "%1 = load.i64 i[x0]", "%2 = index.i64 64", "%3 = mul.i64 %1 %2",
        "%4 = add.i64 %0 %3", "%5 = index.i64 x0", "%6 = index.i64 5", "%7 = lt.bool %5 %6",
        "%8 = load.f32 w[%4] if %7"]


def test_malformed_nodes_fail_where_they_are_built():
    with pytest.raises(TypeError, match="goes in arg"):
        Op("load", F32, ("arg0", x0))  # the old (name, index) operand form
    with pytest.raises(TypeError, match="takes 2 operand"):
        Op("add", F32, (Op.const(1.0, F32),))
    with pytest.raises(ValueError, match="'frobnicate' is not a loop-IR op"):
        Op("frobnicate", F32, ())


def test_interning_keeps_no_dead_nodes():
    gc.collect()
    before = len(Op._interned)
    v = silu_chain(50, Op.load("fresh_buffer_for_this_test", x0, F32))
    assert len(Op._interned) == before + 101
    del v
    gc.collect()
    assert len(Op._interned) == before


def test_one_table_of_op_properties():
    assert set(BOOL_RESULT) == {"lt", "le", "gt", "ge", "eq", "ne", "isnan", "isinf", "signbit",
                                "logical_not", "logical_and", "logical_or", "logical_xor"}
    assert set(EXACT_16BIT) == set("neg abs where maximum minimum copysign sign floor ceil round trunc".split())
    assert set(OpCode) == set(OP_INFO)
    assert result_dtype("lt", F32) == torch.bool and result_dtype(OpCode.ADD, F32) == F32
    # the emitters and the lowering read these sets: none keeps a copy of its own
    import fxwrap.core.lowering as lowering
    import fxwrap.targets.cstyle as cstyle
    import fxwrap.targets.cuda_triton.ops as triton_ops
    for module in (lowering, cstyle, triton_ops):
        assert not [name for name, value in vars(module).items()
                    if isinstance(value, frozenset) and value in (set(BOOL_RESULT), set(EXACT_16BIT))
                    and value is not BOOL_RESULT and value is not EXACT_16BIT], module.__name__


def test_index_payloads_are_sympy():
    assert Op.index(5).arg == sympy.Integer(5) and isinstance(Op.index(5).arg, sympy.Integer)
    assert Op.load("a", 3, F32).arg[1] == sympy.Integer(3)
