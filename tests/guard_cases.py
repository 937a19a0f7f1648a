"""The input-guard cases of ``fxwrap.lower`` programs, run per target.

Each ``case_*`` function takes ``(lower, device)`` (``lower``: ``fxwrap.lower`` with the
target and options under test) and asserts that a program either
returns eager's numbers or raises a clear error for an input it was not compiled for
(``fxwrap.InputMismatchError`` / ``TypeError``), naming the argument.  ``tests/null``
runs them on the CPU targets, ``tests/cuda`` on the Triton target (``triton-interpret``
under CI, ``cuda`` on a GPU).
"""
from __future__ import annotations

import pickle

import pytest
import torch

import fxwrap
from fxwrap.runtime.guards import check_inputs
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.ir.lines import DefineKernel


def _sin1(x):
    return x.sin() + 1


def _scaled(x, s):
    return x * s


def _mm_relu(x, w):
    return torch.relu(x @ w) * 2 + x.sum(1, keepdim=True)


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def case_static_layouts(lower, device):
    """Other strides, a slice, a smaller or larger size, another dtype or rank: errors
    that name ``x (argument 0)``; a slice with the compiled strides at another storage
    offset runs and is right."""
    x = torch.randn(8, 16, device=device)
    program = lower(_sin1, x)
    _close(program.run(x), _sin1(x))
    bad = {
        "strides": torch.randn(16, 8, device=device).t(),
        "strides \\(17, 1\\)": torch.randn(8, 17, device=device)[:, 1:],
        "size \\(2, 16\\)": torch.randn(2, 16, device=device),
        "size \\(9, 16\\)": torch.randn(9, 16, device=device),
        "dtype torch.float64": torch.randn(8, 16, device=device, dtype=torch.float64),
        "3 dimensions": torch.randn(8, 16, 1, device=device),
    }
    for what, value in bad.items():
        with pytest.raises(fxwrap.InputMismatchError, match=f"x \\(argument 0\\).*{what}"):
            program.run(value)
    with pytest.raises(fxwrap.InputMismatchError, match="x \\(argument 0\\) must be a tensor"):
        program.run(3.0)
    y = torch.randn(10, 16, device=device)[2:]  # compiled strides, storage offset 32
    _close(program.run(y), _sin1(y))


def case_large_program_small_input(lower, device):
    """A program lowered for 5M elements, run on 16: an error, no read past the input."""
    program = lower(_sin1, torch.randn(5_000_000, device=device))
    with pytest.raises(fxwrap.InputMismatchError, match=r"size \(16,\).*compiled for size \(5000000,\)"):
        program.run(torch.randn(16, device=device))


def case_argument_count(lower, device):
    x = torch.randn(4, device=device)
    program = lower(_scaled, x, 3.0)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments \(x, s\).*missing s"):
        program.run(x)
    with pytest.raises(TypeError, match="1 extra"):
        program.run(x, 3.0, 1)


def case_baked_scalar(lower, device):
    """Under ``dynamic=False`` dynamo bakes a Python float in: the same value runs, another
    one raises instead of silently computing with the old one; ``dynamic=True`` makes it
    a program input, so a new value gives eager's numbers."""
    x = torch.randn(4, device=device)
    program = lower(_scaled, x, 3.0)
    _close(program.run(x, 3.0), x * 3.0)
    with pytest.raises(fxwrap.InputMismatchError, match=r"s \(argument 1\) was baked into the program as 3.0"):
        program.run(x, 5.0)
    dynamic = lower(_scaled, x, 3.0, dynamic=True)
    x2 = torch.randn(7, device=device)
    _close(dynamic.run(x2, 5.0), x2 * 5.0)
    _close(dynamic.run(x2, -0.25), x2 * -0.25)


def case_dynamic_layouts(lower, device):
    """``dynamic=True``: other sizes run with eager's numbers; a transposed input, or an
    inner size that disagrees with the other argument, raises and says which symbol the
    other argument set."""
    x, w = torch.randn(8, 16, device=device), torch.randn(16, 4, device=device)
    program = lower(_mm_relu, x, w, dynamic=True)
    for rows in (5, 8, 13):
        x2 = torch.randn(rows, 16, device=device)
        _close(program.run(x2, w), _mm_relu(x2, w))
    with pytest.raises(fxwrap.InputMismatchError, match=r"x \(argument 0\) has strides \(1, 8\)"):
        program.run(torch.randn(16, 8, device=device).t(), w)
    with pytest.raises(fxwrap.InputMismatchError,
                       match=r"w \(argument 1\) has size \(16, 4\).*expected 15, where s\d+ = 15 is .*x\.shape\[1\]"):
        program.run(torch.randn(5, 15, device=device), w)
    x3 = torch.randn(6, 16, device=device)
    with pytest.raises(fxwrap.InputMismatchError, match="w \\(argument 1\\) has dtype"):
        program.run(x3, w.double())


def case_graph_module_is_guarded(lower, device):
    """The GraphModule itself (called directly, and after pickling) checks its inputs;
    without the guard the same call gives wrong numbers, which is what it prevents."""
    x = torch.randn(8, 16, device=device)
    program = lower(_sin1, x)
    (name,) = [i.name for i in program.inputs]
    transposed = torch.randn(16, 8, device=device).t()
    for gm in (program.graph_module, program.runner, pickle.loads(pickle.dumps(program.graph_module))):
        with pytest.raises(fxwrap.InputMismatchError, match="x \\(argument 0\\) has strides"):
            gm(transposed)
        _close(gm(x)[0], _sin1(x))
    first = next(n for n in program.graph_module.graph.nodes if n.op == "call_function")
    assert first.target is check_inputs and first.args[0].op == "get_attr", first.format_node()
    unguarded = to_graph_module(program.inputs, program.lines, program.constants, guard=False)
    assert "check_inputs" not in unguarded.code
    if any(isinstance(line, DefineKernel) for line in program.lines):  # an extern takes any strides
        got = unguarded(transposed)[0]
        assert not torch.allclose(got, _sin1(transposed), atol=1e-3), f"{name}: a kernel read strides it was not given"


def case_pytree_outputs(lower, device):
    """``run`` returns the function's own structure: a dict, a nested tuple, an argument
    returned as it is, a constant folded into the result."""
    def f(x, y):
        return {"sum": x + y, "pair": (x.exp(), [y * 2, 7]), "x": x}

    x, y = torch.randn(5, 3, device=device), torch.randn(5, 3, device=device)
    program = lower(f, x, y)
    x2, y2 = torch.randn(5, 3, device=device), torch.randn(5, 3, device=device)
    got, want = program.run(x2, y2), f(x2, y2)
    assert set(got) == {"sum", "pair", "x"} and isinstance(got["pair"], tuple) and isinstance(got["pair"][1], list)
    _close(got["sum"], want["sum"])
    _close(got["pair"][0], want["pair"][0])
    _close(got["pair"][1][0], want["pair"][1][0])
    assert got["pair"][1][1] == 7 and got["x"] is x2

    def views(x):  # views of an input: AOTAutograd regenerates them outside the graph
        return x.t(), {"rows": x[1:]}, x.sin()

    for dynamic in (False, True):
        program = lower(views, x, dynamic=dynamic)
        x3 = torch.randn(7 if dynamic else 5, 3, device=device)
        got, want = program.run(x3), views(x3)
        assert got[0].shape == want[0].shape and torch.equal(got[0], want[0])
        assert got[0].untyped_storage().data_ptr() == x3.untyped_storage().data_ptr()  # still a view
        assert torch.equal(got[1]["rows"], want[1]["rows"])
        _close(got[2], want[2])


CASES = [case_static_layouts, case_large_program_small_input, case_argument_count, case_baked_scalar,
         case_dynamic_layouts, case_graph_module_is_guarded, case_pytree_outputs]
