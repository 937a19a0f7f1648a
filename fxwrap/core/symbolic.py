"""Sympy helpers for sizes, strides and index math.

Every size, stride and offset fxwrap handles is a sympy expression; static shapes
are expressions without free symbols.  PyTorch hands us ``SymInt``s whose
``node.expr`` is such an expression::

    >>> to_expr(7), to_expr(fake.shape[0])
    (7, s77)
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import sympy
import torch

Expr = sympy.Expr


def to_expr(value) -> sympy.Expr:
    """An ``int``, ``SymInt`` or sympy expression as a sympy expression."""
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    if isinstance(value, bool):
        raise TypeError("a bool is not a size")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, sympy.Expr):
        return value
    raise TypeError(f"not a size expression: {value!r}")


def to_exprs(values: Iterable) -> tuple[sympy.Expr, ...]:
    return tuple(to_expr(v) for v in values)


def simplest(expr: sympy.Expr):
    """A python ``int`` when ``expr`` has no free symbols, else the expression."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    return expr


def free_symbols(exprs: Iterable[sympy.Expr]) -> set[sympy.Symbol]:
    out: set[sympy.Symbol] = set()
    for e in exprs:
        out |= sympy.sympify(e).free_symbols
    return out


def evaluate(expr, hints: Mapping[sympy.Symbol, int]) -> int:
    """``expr`` with every symbol replaced by its hint, as an ``int``."""
    expr = sympy.sympify(expr)
    if expr.free_symbols:
        expr = expr.xreplace({s: sympy.Integer(hints[s]) for s in expr.free_symbols})
    return int(expr)


def storage_elements(size: Sequence[sympy.Expr], stride: Sequence[sympy.Expr],
                     offset: sympy.Expr = sympy.Integer(0)) -> sympy.Expr:
    """Elements of storage a strided tensor spans: ``offset + 1 + sum((n-1)*s)``.

    Zero when any dimension is empty.
    """
    span = sympy.Integer(1) + sympy.Integer(0)
    for n, s in zip(size, stride):
        span = span + (sympy.sympify(n) - 1) * sympy.sympify(s)
    if any(sympy.sympify(n) == 0 for n in size):
        return sympy.Integer(0)
    return sympy.expand(sympy.sympify(offset) + span)


def contiguous_strides(size: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    strides: list[sympy.Expr] = []
    running = sympy.Integer(1)
    for n in reversed(size):
        strides.append(running)
        running = running * sympy.Max(sympy.sympify(n), 1)
    return tuple(reversed(strides))


def is_non_overlapping_and_dense(size: Sequence[int], stride: Sequence[int]) -> bool:
    """True when the strided layout covers a dense block with no element twice.

    Takes concrete sizes (evaluate symbolic ones at their hints first).
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
