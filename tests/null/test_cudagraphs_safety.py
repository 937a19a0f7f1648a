"""Which programs ``mode="cudagraphs"`` captures, decided from the Wrapper IR (no GPU needed).

Replays themselves are checked on a GPU in tests/cuda/test_cudagraphs.py.
"""
from types import SimpleNamespace

import pytest
import sympy
import torch

import fxwrap
from fxwrap.runtime.cudagraphs import CudaGraphRunner
from fxwrap.wrapper_ir.cudagraph_safety import graph_safety
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, DefineSymbol, Return, SizeInput,
)

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)


def _buf(name, device=CUDA):
    return Buffer(name, (8, 8), (8, 1), torch.float32, device)


def _program(inputs, lines):
    return SimpleNamespace(inputs=inputs, lines=lines)


def test_a_plain_program_may_be_captured():
    x, out = _buf("arg0"), _buf("buf0")
    lines = [Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),)), Return((out,))]
    assert graph_safety(_program([x], lines)) is None


@pytest.mark.parametrize("case", ["dynamic", "cpu_input", "mutation", "scalar_readback", "data_size"])
def test_unsafe_programs_name_their_reason(case):
    x, out = _buf("arg0"), _buf("buf0")
    inputs, lines = [x], [Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),))]
    want = {"dynamic": "dynamic sizes", "cpu_input": "not on a CUDA device",
            "mutation": "writes into a program input", "scalar_readback": "reads a value back",
            "data_size": "depends on data"}[case]
    if case == "dynamic":
        inputs = [SizeInput(sympy.Symbol("s0", integer=True), 8), x]
    elif case == "cpu_input":
        inputs = [_buf("arg0", torch.device("cpu"))]
    elif case == "mutation":
        lines.append(CallExtern(aten.add_.Tensor, (x, out), (), None))
    elif case == "scalar_readback":
        lines += [CallExtern(aten._local_scalar_dense.default, (out,), (), "scalar0")]
    elif case == "data_size":
        lines.append(DefineSymbol(sympy.Symbol("u0", integer=True), sympy.Integer(3)))
    reason = graph_safety(_program(inputs, lines + [Return((out,))]))
    assert reason is not None and want in reason, reason


def test_metadata_reads_do_not_block_capture():
    x, out = _buf("arg0"), _buf("buf0")
    lines = [CallExtern(aten.sym_storage_offset.default, (x,), (), "arg0_offset"),
             Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),)), Return((out,))]
    assert graph_safety(_program([x], lines)) is None


def _never():
    raise AssertionError("a runner that records nothing has nothing to synchronize")


def test_an_unsafe_runner_just_runs_the_program():
    calls = []
    runner = CudaGraphRunner(lambda *a: calls.append(a) or a[0] * 2, "dynamic sizes", synchronize=_never)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(runner(x), x * 2)
    assert len(calls) == 3 and runner.recordings == []


def test_non_cuda_inputs_fall_back_without_capture():
    runner = CudaGraphRunner(lambda x: x + 1, None, synchronize=_never)
    x = torch.randn(5)
    torch.testing.assert_close(runner(x), x + 1)
    assert runner.fallback_reason == "an input is not a CUDA tensor" and runner.recordings == []


def test_cudagraphs_mode_needs_a_cuda_target():
    fn = fxwrap.compile(lambda x: x.relu(), target="cpu", options={"mode": "cudagraphs"})
    with pytest.raises(Exception, match="mode 'cudagraphs' needs a CUDA target, not target 'cpu'"):
        fn(torch.randn(4))


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="no mode 'turbo'"):
        fxwrap.Backend("cpu", {"mode": "turbo"})


def test_index_checks_stay_capturable_and_other_python_calls_do_not():
    """Embedding and indexing put ``check_index_bounds`` (a Python function, no ATen
    schema) before their kernels; on a GPU it asserts on the device, so the program may
    still be captured.  Any other Python callable may read back: not captured."""
    from fxwrap.runtime.checks import check_index_bounds

    x, idx, out = _buf("arg0"), _buf("arg1"), _buf("buf0")
    checked = [CallExtern(check_index_bounds, (idx, 8, 0, False), (), None),
               Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),)), Return((out,))]
    assert graph_safety(_program([x, idx], checked)) is None
    other = [CallExtern(print, (x,), (), None)] + checked
    reason = graph_safety(_program([x, idx], other))
    assert reason is not None and "not an ATen op" in reason, reason
