"""Combo kernels on the C++ target (``core/combo.py``, ``targets/cstyle_combo.py``):
independent pointwise kernels of different sizes run as one function; optimizer steps and
``_foreach_*`` lists give eager's numbers in fewer launches."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch._dynamo

import fxwrap
from combo_cases import (assert_same_step, few_kernels_a_step, foreach_lists, no_combo_kernels,
                         one_kernel_a_parameter, optimizer_step)
from fxwrap.ir.combo import ComboLimits
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from shared_helpers import kernels

LIMITS = CppEmitter.combo_kernels


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
def test_optimizer_step_as_eager_in_few_kernels(optimizer, foreach):
    launched = few_kernels_a_step("cpu", "cpu", CppEmitter, optimizer, foreach)
    assert any(k.name.startswith("fxwrap_combo") for k in launched)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
def test_foreach_step_one_loop_nest_a_parameter(optimizer):
    """The ``foreach`` step runs op by op over every tensor; each tensor's chain still becomes one
    loop nest (``scheduler.BufferUsers``: the tensor's earlier kernel, however many kernels of
    tensors of its shape came since)."""
    one_kernel_a_parameter("cpu", "cpu", optimizer)


def test_foreach_lists_one_kernel_per_limit():
    got, expected, launched = foreach_lists("cpu", "cpu", count=40)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    # 40 adds and 40 products over 40 sizes (each size's two fused): 40 kernels alone; a
    # kernel holds as many as the member and argument limits allow (4 arguments a size)
    per_kernel = min(LIMITS.max_members, LIMITS.max_arguments // 4)
    assert len(launched) <= math.ceil(40 / per_kernel), [k.name for k in launched]
    with no_combo_kernels(CppEmitter):
        _, _, separate = foreach_lists("cpu", "cpu", count=40)
    assert len(separate) == 40


def test_foreach_lists_dynamic_sizes():
    got, expected, launched = foreach_lists("cpu", "cpu", count=6, dynamic=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert len(launched) == 1
    assert launched[0].signature[-1].role == "size"  # the sizes are arguments, not baked in


def _compiled(fn, *args):
    torch._dynamo.reset()
    programs: list = []
    out = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "cache": False}))(*args)
    return out, kernels(programs)


def test_write_after_read_stays_apart():
    """A kernel reading ``x`` and one writing ``x`` in place are not one launch (a GPU would run
    their programs at once)."""
    x, y = torch.randn(7, 3), torch.randn(5)

    def fn(x, y):
        u = x.reshape(21)[:5] * y
        x.mul_(3)
        return u

    x_ref = x.clone()
    u, launched = _compiled(fn, x, y)
    torch.testing.assert_close(u, x_ref.reshape(21)[:5] * y)
    torch.testing.assert_close(x, x_ref * 3)
    assert not any(k.name.startswith("fxwrap_combo") for k in launched)


def test_independent_kernels_of_other_sizes_are_one_function():
    x, y = torch.randn(7, 3), torch.randn(11)
    (a, b), launched = _compiled(lambda x, y: (x.sin() * 2, y.exp() + 1), x, y)
    torch.testing.assert_close(a, x.sin() * 2)
    torch.testing.assert_close(b, y.exp() + 1)
    assert [k.name for k in launched] == ["fxwrap_combo_0"]
    source = launched[0].source
    assert "omp parallel" not in source  # two small nests, serial, one after the other
    assert source.index("// fxwrap_combo_0_m0: ranges (7, 3)") < source.index("// fxwrap_combo_0_m1: ranges (11,)")


def test_an_emitter_that_cannot_render_a_combo_launches_each_kernel(monkeypatch):
    monkeypatch.setattr(CppEmitter, "render_combo", lambda self, kernel: None)
    got, expected, launched = foreach_lists("cpu", "cpu", count=5)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert len(launched) == 5


def test_argument_limit(monkeypatch):
    counts = []
    for limit in (5, 6, 64):
        monkeypatch.setattr(CppEmitter, "combo_kernels", ComboLimits(max_members=16, max_arguments=limit))
        got, expected, launched = foreach_lists("cpu", "cpu", count=10)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert all(len(k.signature) <= limit for k in launched)
        counts.append(len(launched))
    # a size's kernel takes 3 arguments: x (read, and written in place), y and the product
    # (the sum, read by nobody else, is not stored: it is no argument): 5 takes one size a
    # kernel, 6 two, 64 all ten
    assert counts == [10, 5, 1]


def test_combo_limits_are_checked():
    with pytest.raises(ValueError, match="max_members"):
        ComboLimits(max_members=1)


def test_addcmul_and_addcdiv_in_place_are_kernels():
    """Dynamo traces ``addcmul_`` / ``addcdiv_`` with a value as ``prims.fma``: one kernel of
    the update, no extern call."""
    gen = torch.Generator().manual_seed(3)
    p, m, v, g = (torch.randn(33, 7, generator=gen) for _ in range(4))
    v = v.abs()

    def update(p, m, v, g):
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m, v.sqrt() + 1e-8, value=-0.01)

    ref = [t.clone() for t in (p, m, v, g)]
    update(*ref)
    torch._dynamo.reset()
    programs: list = []
    torch.compile(update, backend=fxwrap.Backend("cpu", {"on_program": programs.append, "cache": False}))(p, m, v, g)
    torch.testing.assert_close(p, ref[0])
    torch.testing.assert_close(v, ref[2])
    lines = [type(line).__name__ for program in programs for line in program.lines]
    assert "CallExtern" not in lines and len(kernels(programs)) == 1


def test_the_documented_listing():
    """docs/programs.md, "Many small tensors: combo kernels": its code prints its listing."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "programs.md"
    section = doc.read_text().split("## Many small tensors: combo kernels")[1].split("\n## ")[0]
    code = section.split("```python\n")[1].split("```")[0]
    listing = section.split("```text\n")[1].split("```")[0]
    torch._dynamo.reset()
    namespace: dict = {}
    exec(compile(code.replace("print(program.code())", ""), "programs.md", "exec"), namespace)
    program = namespace["program"]
    assert program.code().strip() == listing.strip()
    params, grads = [p.clone() for p in namespace["params"]], namespace["grads"]
    expected = [p - 0.1 * g for p, g in zip(params, grads)]
    program.run(params, grads)
    for got, want in zip(params, expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("foreach", [True, False])
def test_reference_target_evaluates_combo_members_in_turn(foreach):
    """The reference target (loop IR evaluated with torch) runs a combo's members one by one:
    the golden model of the combo path."""
    from fxwrap.targets.reference.emitter import ReferenceEmitter
    *result, launched = optimizer_step("reference", "cpu", "AdamW", foreach)
    assert_same_step(*result)
    assert any(k.name.startswith("fxwrap_combo") for k in launched)
    with no_combo_kernels(ReferenceEmitter):
        *_, separate = optimizer_step("reference", "cpu", "AdamW", foreach, steps=1)
    assert len(launched) < len(separate)
