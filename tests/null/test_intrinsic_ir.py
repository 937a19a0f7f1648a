"""Intrinsics without a compiler: the ``Intrinsic`` record (``fxwrap/ir/intrinsics.py``), the
loop-IR node it builds, and the lowering table's layer over the ATen op it replaces."""
from __future__ import annotations

import pickle

import pytest
import torch

import fxwrap
from fxwrap.programs.cache_key import encode
from fxwrap.core.lowering import DeclinableRule, IntrinsicRule, bound_arguments, call_operands
from fxwrap.ir.intrinsics import Intrinsic
from fxwrap.ir.loops import Op
from fxwrap.plugins.manager import PluginManager

aten = torch.ops.aten
F32 = torch.float32
GELU = Intrinsic("my_gelu", "my_gelu({0})", replaces=aten.gelu.default, when={"approximate": "none"})


def test_the_node_is_interned_and_pickles():
    x = Op.load("arg0", 0, F32)
    node = GELU(x)
    assert node.op == "intrinsic" and node.arg == "my_gelu" and node.src == (x,) and node is GELU(x)
    assert pickle.loads(pickle.dumps(node)) is node
    assert "my_gelu" in repr(node)
    with pytest.raises(TypeError, match="intrinsic's name"):
        Op("intrinsic", F32, (x,), "my gelu")


@pytest.mark.parametrize("kwargs, message", [
    (dict(replaces=aten.gelu), "overload"),
    (dict(when={"approximate": ["none"]}), "literal values"),
    (dict(dtypes=("float32",)), "torch dtypes"),
    (dict(operands=-1), "count"),
])
def test_a_malformed_declaration_says_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Intrinsic("g", "g({0})", **kwargs)


def test_the_record_is_key_data():
    """Cache keys encode it field by field: another spelling is another key."""
    assert encode(GELU) == encode(Intrinsic("my_gelu", "my_gelu({0})", replaces="aten.gelu.default",
                                            when=(("approximate", "none"),)))
    assert encode(GELU) != encode(Intrinsic("my_gelu", "fast_gelu({0})", replaces=aten.gelu.default,
                                            when={"approximate": "none"}))


def test_operands_are_the_tensor_and_scalar_arguments():
    assert call_operands(aten.gelu.default) == ("self",)
    assert call_operands(aten.add.Tensor) == ("self", "other", "alpha")
    assert call_operands(aten.mul.Scalar) == ("self", "other")
    assert bound_arguments(aten.gelu.default, ["x"], {}) == {"self": "x", "approximate": "none"}
    assert GELU.matches({"self": "x", "approximate": "none"}, F32)
    assert not GELU.matches({"self": "x", "approximate": "tanh"}, F32)
    assert not GELU.matches({"self": "x", "approximate": "none"}, torch.float64)


def test_the_lowering_table_puts_the_intrinsic_over_the_ops_rule():
    class Emitter(fxwrap.CStyleEmitter):
        intrinsics = (GELU,)

    target = fxwrap.Target("gelu-null", "cpu", fxwrap.CpuDevice(), Emitter)
    session = PluginManager().load().session(target)
    rule = session.lowerings.rule(aten.gelu.default)
    assert isinstance(rule, DeclinableRule) and rule.chain[0] == IntrinsicRule((GELU,))
    assert session.intrinsics == (GELU,)
    plain = PluginManager().load().session(fxwrap.Target("plain-null", "cpu", fxwrap.CpuDevice(),
                                                         fxwrap.CStyleEmitter))
    assert not isinstance(plain.lowerings.rule(aten.gelu.default), DeclinableRule) and plain.intrinsics == ()
