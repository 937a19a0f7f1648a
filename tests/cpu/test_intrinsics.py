"""Target-defined ops (intrinsics, ``fxwrap/ir/intrinsics.py``): a C++ target whose prelude
defines its own exact GELU, ``my_gelu``, declared as the intrinsic of ``aten.gelu``
(``approximate="none"``, float32).  Its kernels call ``my_gelu`` inside fused kernels where
the ``cpu`` target computes gelu's erf decomposition; the numbers are eager's on both, and
``my_gelu`` is told apart by computing in double (its float32 results are the float64 GELU
rounded once).  The conformance kit runs on the target, gelu included."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.programs.cache_key import KeyHasher
from fxwrap.core.lowering import LoweringError, intrinsic_rules
from fxwrap.ir.intrinsics import Intrinsic
from fxwrap.ir.loops import Op, format_ssa
from fxwrap.plugins.manager import PluginManager
from shared_helpers import defined_kernels, target_registered
from fxwrap.testing import ConformanceSuite
from fxwrap.testing.ops import OP_CASES

aten = torch.ops.aten
DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-device.md"

# <!-- intrinsic-listing --> (docs/adding-a-device.md shows these lines, test_the_doc_shows_this_target)
MY_GELU = r"""
static inline float my_gelu(float x)  // exact GELU, computed in double: rounded once
{
  const double v = x;
  return (float)(0.5 * v * (1.0 + std::erf(v * 0.7071067811865476)));
}
"""


class GeluIntrinsicEmitter(fxwrap.CppEmitter):
    prelude = fxwrap.CppEmitter.prelude + MY_GELU
    intrinsics = (fxwrap.Intrinsic("my_gelu", "my_gelu({0})", replaces=torch.ops.aten.gelu.default,
                                   when={"approximate": "none"}, dtypes=(torch.float32,)),)


TARGET = fxwrap.Target("cpu-gelu", "cpu", fxwrap.CpuDevice(), GeluIntrinsicEmitter, fxwrap.DirectCallWrapper,
                       priority=-10)
# <!-- end intrinsic-listing -->


@pytest.fixture(autouse=True, scope="module")
def gelu_target():
    with target_registered(TARGET):
        yield


def _externs(program):
    return [str(n.target) for n in program.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _function(kernel) -> str:
    """The kernel's function, without the prelude (which defines helpers such as ``fx_erff``)."""
    return kernel.source.split('extern "C"', 1)[1]


def sin_gelu_mul(x, y):
    return F.gelu(x.sin()) * y


def linear_gelu(x, w, b):
    return F.gelu(x @ w + b) * 2


def test_gelu_is_the_targets_own_instruction_inside_one_fused_kernel():
    x, y = torch.randn(37, 65), torch.randn(37, 65)
    program = fxwrap.lower(sin_gelu_mul, x, y, target=TARGET.name)
    (kernel,) = defined_kernels(program)
    assert _externs(program) == [], _externs(program)
    body = _function(kernel)
    assert re.search(r"= my_gelu\(tmp\d+\);", body), body
    assert "erf" not in body and "std::sin" in body  # sin, gelu and mul: one loop
    x, y = torch.randn(37, 65), torch.randn(37, 65)
    torch.testing.assert_close(program.run(x, y), sin_gelu_mul(x, y))


def test_gelu_after_a_matrix_product_is_the_epilogue_kernel():
    x, w, b = torch.randn(9, 16), torch.randn(16, 33), torch.randn(33)
    program = fxwrap.lower(linear_gelu, x, w, b, target=TARGET.name)
    (kernel,) = defined_kernels(program)
    assert re.search(r"my_gelu\(", _function(kernel)) and "erf" not in _function(kernel)
    x, w, b = torch.randn(9, 16), torch.randn(16, 33), torch.randn(33)
    torch.testing.assert_close(program.run(x, w, b), linear_gelu(x, w, b))


def test_gelu_fuses_into_a_reduction_and_its_epilogue():
    """softmax(gelu(x)): the intrinsic is computed inside the reduction kernel's passes."""
    x = torch.randn(16, 300)
    program = fxwrap.lower(lambda v: torch.softmax(F.gelu(v), -1), x, target=TARGET.name)
    (kernel,) = defined_kernels(program)
    assert "my_gelu(" in _function(kernel) and "erf" not in _function(kernel)
    x = torch.randn(16, 300)
    torch.testing.assert_close(program.run(x), torch.softmax(F.gelu(x), -1))


def test_the_intrinsic_is_what_computes():
    """``my_gelu`` computes in double: its float32 results are the float64 GELU rounded once,
    where the erf decomposition of a target without it, in float32, differs in many elements."""
    x = torch.randn(20000) * 3
    exact = F.gelu(x.double()).float()
    ours = fxwrap.lower(F.gelu, x, target=TARGET.name).run(x)
    cpu = fxwrap.lower(F.gelu, x, target="cpu").run(x)
    torch.testing.assert_close(ours, F.gelu(x))
    torch.testing.assert_close(cpu, F.gelu(x))
    assert (ours != exact).sum() <= 2, "my_gelu is not what computed gelu"
    assert (cpu != exact).sum() > 200, "the decomposition is indistinguishable from my_gelu: the test proves nothing"


def test_a_target_without_the_intrinsic_never_sees_it():
    x, y = torch.randn(37, 65), torch.randn(37, 65)
    program = fxwrap.lower(sin_gelu_mul, x, y, target="cpu")
    (kernel,) = defined_kernels(program)
    assert "my_gelu" not in kernel.source and "erf" in _function(kernel)
    torch.testing.assert_close(program.run(x, y), sin_gelu_mul(x, y))


def test_calls_the_declaration_does_not_cover_keep_their_lowering():
    """tanh GELU (another ``approximate``), float64 (another dtype) and gelu's backward
    (decomposed into erf and exp) lower as on any target; bf16 computes in float32 and
    so calls ``my_gelu``."""
    x = torch.randn(8, 24)
    tanh = fxwrap.lower(lambda v: F.gelu(v, approximate="tanh"), x, target=TARGET.name)
    double = fxwrap.lower(F.gelu, x.double(), target=TARGET.name)
    half = fxwrap.lower(F.gelu, x.bfloat16(), target=TARGET.name)
    assert all("my_gelu(" not in _function(k) for k in defined_kernels(tanh) + defined_kernels(double))
    assert all("my_gelu(" in _function(k) for k in defined_kernels(half))
    torch.testing.assert_close(tanh.run(x), F.gelu(x, approximate="tanh"))
    torch.testing.assert_close(double.run(x.double()), F.gelu(x.double()))
    torch.testing.assert_close(half.run(x.bfloat16()), F.gelu(x.bfloat16()))

    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    programs = fxwrap.lower(model, x, training=True, target=TARGET.name)
    assert any("my_gelu(" in _function(k) for k in defined_kernels(programs.forward))
    xs = torch.randn(8, 24, requires_grad=True)
    compiled = fxwrap.compile(model, target=TARGET.name)
    compiled(xs).square().sum().backward()
    got = xs.grad.clone()
    xs.grad = None
    model(xs).square().sum().backward()
    torch.testing.assert_close(got, xs.grad)


def test_the_loop_ir_node_carries_the_name():
    (intrinsic,) = GeluIntrinsicEmitter.intrinsics
    x = Op.load("arg0", 0, torch.float32)
    node = intrinsic(Op("sin", torch.float32, (x,)))
    assert node is intrinsic(Op("sin", torch.float32, (x,)))  # interned
    assert format_ssa([node])[-1] == "%2 = intrinsic.f32 my_gelu(%1)"
    assert intrinsic.replaces == "aten.gelu.default" and intrinsic.overload is aten.gelu.default
    with pytest.raises(TypeError, match="computes in"):
        intrinsic(Op.load("arg0", 0, torch.float64))


def test_program_keys_cover_the_intrinsics():
    """Two targets of one name, device and options whose emitters differ only in their
    intrinsics never share a cached program."""
    plain = fxwrap.Target(TARGET.name, "cpu", fxwrap.CpuDevice(), fxwrap.CppEmitter, fxwrap.DirectCallWrapper)
    keys = []
    for target in (TARGET, plain):
        key = KeyHasher("test")
        key.add_session(PluginManager().load().session(target))
        keys.append(key.hexdigest())
    assert keys[0] != keys[1]


@pytest.mark.parametrize("declaration, message", [
    (Intrinsic("g", "g({0}, {1})", operands=2, replaces=aten.gelu.default), "1 operand"),
    (Intrinsic("g", "g({0})", replaces=aten.gelu.default, when={"approximat": "none"}), "approximat"),
    (Intrinsic("g", "g({0})", replaces=aten.var_mean.correction), "one tensor"),
])
def test_a_declaration_that_cannot_replace_its_op_names_it(declaration, message):
    with pytest.raises(LoweringError, match=message) as caught:
        intrinsic_rules("npu", [declaration])
    assert "intrinsic 'g' of target 'npu'" in str(caught.value)


def test_a_spelling_naming_no_operand_is_refused():
    with pytest.raises(ValueError, match=r"names \['1'\]"):
        Intrinsic("g", "g({0}, {1})")


def test_the_doc_shows_this_target():
    """docs/adding-a-device.md's intrinsic listing is this module's target, line for line."""
    source = Path(__file__).read_text()
    listing = source.split("# <!-- intrinsic-listing -->", 1)[1].split("# <!-- end intrinsic-listing -->")[0]
    shown = re.search(r"<!-- intrinsic-listing -->\n```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    code = [line for line in listing.splitlines()[1:] if line.strip()]
    shown = [line for line in shown.splitlines() if line.strip()]
    assert shown[0] == "# tests/cpu/test_intrinsics.py" and code == shown[1:]


class TestGeluIntrinsicConformance(ConformanceSuite):
    """The kit on the target: its kernels are the ``cpu`` target's but where gelu is
    ``my_gelu``, so the op cases are the pointwise ones (gelu among them; the rest run on
    ``cpu`` in tests/conformance) and the OpInfo is gelu's; the models (GELU MLPs) whole."""
    target = TARGET.name
    op_cases = tuple(case for case in OP_CASES if case.group == "pointwise")
    opinfo_ops = ("nn.functional.gelu",)
