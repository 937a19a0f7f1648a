"""Input guards and ``Program.run``'s arguments and results on the CPU targets (the
cases are in ``tests/guard_cases.py``; ``tests/cuda`` runs them through Triton)."""
import functools

import pytest

import fxwrap
import guard_cases

LOWERS = {
    "cpu": functools.partial(fxwrap.lower, target="cpu"),
    "cpu-extern": functools.partial(fxwrap.lower, target="cpu", options={"kernels": False}),
    "reference": functools.partial(fxwrap.lower, target="reference"),
}


@pytest.mark.parametrize("case", guard_cases.CASES, ids=lambda c: c.__name__[5:])
@pytest.mark.parametrize("target", list(LOWERS))
def test_guard_case(case, target):
    case(LOWERS[target], "cpu")


def test_device_is_checked_for_inputs_kernels_read():
    """Only extern calls read ``x`` and ``w`` (the matrix product), which run on whatever
    device a tensor is on (SDPA's backward on CUDA gets its dropout seed as a CPU tensor
    where the traced graph said CUDA); ``b`` is read by a kernel, whose addresses must be
    on the compiled device."""
    import torch

    def f(x, w, b):
        return (x @ w).sin() + b

    program = fxwrap.lower(f, torch.randn(4, 8), torch.randn(8, 3), torch.randn(3), target="cpu")
    devices = {program.arguments.describe(source[1]).split()[0]: spec.device
               for spec, source in zip(program.input_guard.inputs, program.arguments.sources)}
    assert devices == {"x": None, "w": None, "b": torch.device("cpu")}, devices
    with pytest.raises(fxwrap.InputMismatchError, match=r"b \(argument 2\) is on device meta"):
        program.run(torch.randn(4, 8), torch.randn(8, 3), torch.randn(3, device="meta"))
