"""Input guards and ``Program.run``'s arguments and results through the Triton target
(``triton-interpret`` on CPU tensors here, ``cuda`` on a GPU); the cases are those of
``tests/guard_cases.py`` that ``tests/null`` runs on the CPU targets."""
import functools

import pytest

import fxwrap
import guard_cases
from triton_helpers import DEVICE, TARGET


@pytest.mark.parametrize("case", guard_cases.CASES, ids=lambda c: c.__name__[5:])
def test_guard_case(case):
    case(functools.partial(fxwrap.lower, target=TARGET), DEVICE)
