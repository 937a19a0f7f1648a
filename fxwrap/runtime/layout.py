"""Concrete layout facts the runtime checks on real tensors (no sympy here)."""
from __future__ import annotations

from collections.abc import Sequence


def is_non_overlapping_and_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the strided layout covers a dense block with no element twice.

    Takes concrete sizes (the compiler evaluates symbolic ones at their hints first)::

        is_non_overlapping_and_dense((2, 3), (3, 1))   # True: contiguous
        is_non_overlapping_and_dense((2, 3), (1, 2))   # True: the transpose of (3, 2)
        is_non_overlapping_and_dense((2, 3), (0, 1))   # False: an expanded dim
    """
    dims = sorted((s, n) for n, s in zip(size, stride) if n != 1)
    expected = 1
    for s, n in dims:
        if n == 0:
            return True
        if s != expected:
            return False
        expected *= n
    return True
