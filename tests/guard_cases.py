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
import tempfile

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


def _scatter_rows(x, rows, slots):
    # index_put's values (rows.shape[0], rows.shape[1], x.shape[1]) must broadcast to (2, 3, 7):
    # torch's shape function does not check it, so dynamo records no guard for it
    picked = x[rows] * 2
    return torch.zeros(3, 3, 7, device=x.device).index_put((slots,), picked, accumulate=True)


def case_size_relation_the_kernels_rely_on(lower, device):
    """``dynamic=True``: a size that breaks a relation the program relies on and that no
    guard of dynamo's states (here: ``rows.shape[1] == 3``, ``x.shape[1] == 7``, which
    ``index_put`` needs for its values to broadcast) raises ``InputMismatchError`` naming the
    input and dimension, in the program and in its saved-and-loaded copy, where eager raises
    too; without the check the kernel read the values with the wrong strides and returned
    numbers.  (An ATen ``index_put`` extern raises eager's own error.)"""
    gen = torch.Generator().manual_seed(941330)
    x = torch.randn(8, 7, generator=gen).to(device)
    rows = torch.randint(0, 8, (2, 3), generator=gen).to(device)
    slots = torch.randint(0, 3, (2,), generator=gen).to(device)
    program = lower(_scatter_rows, x, rows, slots, dynamic=True)
    # a kernel relies on the relation; the ATen index_put extern (no kernels) raises eager's own error
    extern = any("index_put" in str(line.op) for line in program.lines if line.op is not None)
    refused = (fxwrap.InputMismatchError, RuntimeError) if extern else fxwrap.InputMismatchError
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/program.fxwrap"
        program.save(path)
        loaded = fxwrap.load(path)
        for run in (program.run, loaded.run):
            x2 = torch.randn(5, 7, generator=gen).to(device)
            rows2 = torch.randint(0, 5, (4, 3), generator=gen).to(device)
            slots2 = torch.randint(0, 3, (4,), generator=gen).to(device)
            _close(run(x2, rows2, slots2), _scatter_rows(x2, rows2, slots2))
            wide_rows = torch.randint(0, 8, (2, 4), generator=gen).to(device)
            with pytest.raises(RuntimeError, match="cannot be broadcast|must match the existing size"):
                _scatter_rows(x, wide_rows, slots)  # eager refuses it (CPU and CUDA word it apart)
            named = r"s\d+ = 4 \(the size s\d+ = rows\.shape\[1\] \(argument 1\)\): the program \(target .*" \
                    r"== 3 \(aten\.index_put"
            with pytest.raises(refused, match=None if extern else named):
                run(x, wide_rows, slots)
            wide_x = torch.randn(8, 9, generator=gen).to(device)
            with pytest.raises(refused, match=None if extern else r"x\.shape\[1\] \(argument 0\)\).* == 7"):
                run(wide_x, rows, slots)


def _add_rows_mean(x, y):
    return torch.add(y, x, alpha=2).mean(1, keepdim=True)


def case_scalar_for_a_tensor_whose_sizes_are_read(lower, device):
    """``dynamic=True``: a Python scalar, None or a tensor of lower rank for an argument the
    program reads size symbols off (its sizes, its storage offset) is an
    ``InputMismatchError`` naming the argument, before any runner computes with the
    symbols (the arena target's runner planned its arena from None sizes: TypeError)."""
    gen = torch.Generator().manual_seed(940670)
    x = torch.randn(4, 8, generator=gen).to(device)
    y = torch.randn(40, generator=gen).to(device)[3:35].view(4, 8)  # a storage offset: a symbol too
    program = lower(_add_rows_mean, x, y, dynamic=True)
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/program.fxwrap"
        program.save(path)
        for run in (program.run, fxwrap.load(path).run):
            x2 = torch.randn(6, 8, generator=gen).to(device)
            y2 = torch.randn(60, generator=gen).to(device)[5:53].view(6, 8)
            _close(run(x2, y2), _add_rows_mean(x2, y2))
            for bad, shown in ((1.5, "float 1.5"), (2, "int 2")):
                reads = rf"y \(argument 1\) must be a tensor \(the program reads its size symbol s\d+ = y\.\S+\)"
                with pytest.raises(fxwrap.InputMismatchError, match=rf"{reads}, got {shown}"):
                    run(x2, bad)
            with pytest.raises(fxwrap.InputMismatchError, match=r"y \(argument 1\) is None"):
                run(x2, None)
            with pytest.raises(fxwrap.InputMismatchError, match=r"y \(argument 1\) has 1 dimensions"):
                run(x2, y2[0])


def _first_rows(x, n):
    return x[:n] * 2


def case_size_argument_of_another_type(lower, device):
    """``dynamic=True`` makes an int argument a size symbol: any int runs, anything else is an
    ``InputMismatchError`` naming it (never a size computed from a float or a tensor)."""
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(5)).to(device)
    program = lower(_first_rows, x, 5, dynamic=True)
    for rows in (3, 7):
        _close(program.run(x, rows), _first_rows(x, rows))
    for bad in (2.0, None, torch.tensor(3)):
        with pytest.raises(fxwrap.InputMismatchError, match=r"n \(argument 1\) is a size .* must be an int"):
            program.run(x, bad)


CASES = [case_static_layouts, case_large_program_small_input, case_argument_count, case_baked_scalar,
         case_dynamic_layouts, case_graph_module_is_guarded, case_pytree_outputs,
         case_size_relation_the_kernels_rely_on, case_scalar_for_a_tensor_whose_sizes_are_read,
         case_size_argument_of_another_type]
