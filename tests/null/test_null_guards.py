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
