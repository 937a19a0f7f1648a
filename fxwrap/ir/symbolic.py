"""Sympy helpers for sizes, strides and index math.

Every size, stride and offset fxwrap handles is a sympy expression; static shapes
are expressions without free symbols.  PyTorch hands us ``SymInt``s whose
``node.expr`` is such an expression (``fake``: a fake tensor of a dynamic first size)::

    to_expr(7), to_expr(fake.shape[0])     # -> (7, s77)
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing
from torch.utils._sympy.interp import sympy_interp
from torch.utils._sympy.printers import PythonPrinter

from fxwrap.runtime.layout import is_non_overlapping_and_dense  # noqa: F401  (concrete sizes; re-exported)


class SizeArithmetic:
    """The operations of integer size and index expressions, for torch's sympy
    interpreter (``torch.utils._sympy.interp.sympy_interp``), which walks an expression
    and calls one method per node.  Every evaluator of sizes in fxwrap subclasses this
    (FX nodes for the GraphModule, tensors for the reference target) and spells
    ``add``, ``mul``, ``floordiv``, ``mod``, ``minimum`` and ``maximum``; the rest is
    derived here.  ``evaluate_with(arith, ModularIndexing(x0, 4, 8) + s0, env)`` calls
    ``arith.add(arith.mod(arith.floordiv(x0, 4), 8), s0)`` with ``x0`` and ``s0`` from
    ``env``.  Printing size expressions as source text is the job of the index printer
    (``fxwrap.targets.index_printer``) for kernels and of ``python_source`` for Python.
    """

    def constant(self, value, dtype):
        if dtype is torch.int64:
            return int(value)
        if dtype is torch.bool:
            return bool(value)
        return float(value)

    def modular_indexing(self, x, div, mod):
        return self.mod(self.floordiv(x, div), mod)

    def python_mod(self, a, b):
        return self.mod(a, b)

    def pow_by_natural(self, base, exp):
        if not isinstance(exp, int) or exp < 1:
            raise NotImplementedError(f"power {exp} of a size expression")
        out = base
        for _ in range(exp - 1):
            out = self.mul(out, base)
        return out


def evaluate_with(arithmetic: SizeArithmetic, expr, env: Mapping) -> object:
    """``expr`` computed by ``arithmetic``; ``env`` maps a symbol (or its name) to its value."""
    def missing(sym: sympy.Symbol):
        if sym.name in env:
            return env[sym.name]
        raise KeyError(f"size symbol {sym} has no value here")
    return sympy_interp(arithmetic, env, sympy.sympify(expr), missing_handler=missing)


_PYTHON_SIZE_FUNCTIONS = frozenset({"FloorDiv", "CeilDiv", "ModularIndexing", "PythonMod", "Mod", "Max", "Min"})


def python_source(expr) -> str:
    """A size expression as Python source over the symbols' names (torch's printer)::

        python_source(FloorDiv(s0 + 7, 8) * s1)   # 's1*((7 + s0) // 8)'

    Raises ``NotImplementedError`` naming the function for anything else.
    """
    e = sympy.sympify(expr)
    for fn in e.atoms(sympy.Function):
        if type(fn).__name__ not in _PYTHON_SIZE_FUNCTIONS:
            raise NotImplementedError(f"{type(fn).__name__} in size expression {e} has no Python form")
    if any(not (p.exp.is_Integer and p.exp >= 0) for p in e.atoms(sympy.Pow)):
        raise NotImplementedError(f"size expression {e} has a non-natural power")
    return PythonPrinter().doprint(e)


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


def evaluate(expr, hints: Mapping[sympy.Symbol, int]) -> int:
    """``expr`` with every symbol replaced by its hint, as an ``int``."""
    expr = sympy.sympify(expr)
    if expr.free_symbols:
        expr = expr.xreplace({s: sympy.Integer(hints[s]) for s in expr.free_symbols})
    return int(expr)


def storage_elements(size: Sequence[sympy.Expr], stride: Sequence[sympy.Expr],
                     offset: sympy.Expr = sympy.Integer(0)) -> sympy.Expr:
    """Elements of storage a strided tensor spans: ``offset + 1 + sum((n-1)*s)``.

    Zero when any dimension is empty.  Memoised: the memory plan asks for every buffer's
    span at each candidate reuse (thousands of times for a model of a few hundred lines).
    """
    return _storage_elements(tuple(size), tuple(stride), offset)


@functools.lru_cache(maxsize=8192)
def _storage_elements(size: tuple, stride: tuple, offset) -> sympy.Expr:
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


@functools.lru_cache(maxsize=8192)
def _divides(d: sympy.Expr, term: sympy.Expr) -> sympy.Expr | None:
    """``term / d`` when it is an integer polynomial (``768*x0`` by 256: ``3*x0``), else None."""
    if d == 1:
        return term
    if d.is_Integer and d > 0:  # an integer times atoms (a term of an expanded index): no cancel
        coeff, rest = term.as_coeff_Mul()
        if coeff.is_Integer and all(f.is_Atom or isinstance(f, (FloorDiv, ModularIndexing))
                                    for f in sympy.Mul.make_args(rest)):
            return coeff // d * rest if coeff % d == 0 else None
    quotient = sympy.cancel(term / d)
    numer, denom = sympy.fraction(quotient)
    if denom != 1:
        return None
    coeff, _ = quotient.as_coeff_Mul()
    return quotient if coeff.is_Integer else None


def _is_loop_atom(factor, ranges) -> bool:
    """A loop variable, or a floor division / modulo of an expression over them."""
    if isinstance(factor, sympy.Symbol):
        return factor in ranges
    return isinstance(factor, (FloorDiv, ModularIndexing)) and bool(factor.free_symbols & set(ranges))


def _nonnegative(expr: sympy.Expr) -> bool:
    """Sizes are positive: products of numbers >= 0, size symbols and their quotients."""
    if expr.is_nonnegative:
        return True
    return all(f.is_nonnegative or isinstance(f, sympy.Symbol) and f.is_positive
               or isinstance(f, FloorDiv) and all(_nonnegative(a) for a in f.args)
               for f in sympy.Mul.make_args(expr))


def _bounds(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]):
    """``(lo, hi)`` with ``lo <= expr <= hi`` over ``0 <= v < ranges[v]``, or None when
    ``expr`` is not a sum of non-negative multiples of loop variables, floor divisions
    and modulos of them, and terms without them (numbers, sizes, ``Mod(e, n)`` of them)."""
    lo = hi = sympy.Integer(0)
    for term in sympy.Add.make_args(expr):
        factors = sympy.Mul.make_args(term)
        atoms = [f for f in factors if _is_loop_atom(f, ranges)]
        if not atoms:
            if term.free_symbols & set(ranges):
                return None
            if isinstance(term, sympy.Mod) and term.args[1].is_positive:  # a roll's start: Mod(n - k, n)
                hi = hi + term.args[1] - 1
                continue
            lo, hi = lo + term, hi + term  # the same at every position: a number, or of the sizes
            continue
        scale = sympy.Mul(*[f for f in factors if f is not atoms[0]])
        if len(atoms) != 1 or not _nonnegative(scale):
            return None
        atom = atoms[0]
        if isinstance(atom, ModularIndexing):
            top = atom.args[2] - 1
        elif isinstance(atom, FloorDiv):
            inner = _bounds(atom.args[0], ranges)
            if inner is None:
                return None
            top = FloorDiv(inner[1], atom.args[1])
        else:
            top = ranges[atom] - 1
        hi = hi + scale * top
    return lo, hi


def _below(expr: sympy.Expr, bound: sympy.Expr, ranges) -> bool:
    """``0 <= expr < bound`` for every value of the loop variables."""
    found = _bounds(expr, ranges)
    if found is None:
        return False
    lo, hi = found
    return bool(sympy.sympify(lo).is_nonnegative) and bool(sympy.simplify(bound - 1 - _relaxed(hi)).is_nonnegative)


def _relaxed(hi: sympy.Expr) -> sympy.Expr:
    """An upper bound of ``hi`` with each ``c*(a//d)`` (``c`` a positive multiple of ``d``)
    as ``(c/d)*a``, which is no smaller: ``2*((s0 + 1)//2) - 2`` -> ``s0 - 1`` (the last
    index of ``arange(0, s0, 2)``)."""
    terms = []
    for term in sympy.Add.make_args(sympy.expand(hi)):
        coeff, rest = term.as_coeff_Mul()
        if isinstance(rest, FloorDiv) and rest.args[1].is_Integer and rest.args[1] > 0 \
                and coeff.is_Integer and coeff > 0 and coeff % rest.args[1] == 0:
            term = coeff // rest.args[1] * rest.args[0]
        terms.append(term)
    return sympy.Add(*terms)


def index_in_range(expr: sympy.Expr, bound: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    """``0 <= expr < bound`` for every value of the loop variables, ``0 <= v < ranges[v]``:
    ``index_in_range(ModularIndexing(x0 + 2, 1, s0), s0, {x0: s0})`` is True (a roll's
    index); False where it cannot tell."""
    return _below(sympy.sympify(expr), sympy.sympify(bound), ranges)


def index_nonnegative(expr: sympy.Expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    """``expr >= 0`` for every value of the loop variables (False where it cannot tell)."""
    found = _bounds(sympy.sympify(expr), ranges)
    return found is not None and bool(sympy.sympify(found[0]).is_nonnegative)


def _floordiv(a: sympy.Expr, d: sympy.Expr, ranges) -> sympy.Expr:
    if d == 1:
        return a
    whole, rest = [], []
    for term in sympy.Add.make_args(sympy.expand(a)):
        q = _divides(d, term)
        (whole if q is not None else rest).append(q if q is not None else term)
    rest_sum = sympy.Add(*rest)
    if rest_sum == 0 or _below(rest_sum, d, ranges):
        return sympy.Add(*whole)
    if whole:  # floor((d*k + r) / d) == k + floor(r / d) for an integer k
        return sympy.Add(*whole) + _floordiv(rest_sum, d, ranges)
    # floor(a / (g*e)) == floor(floor(a / g) / e): a factor g of d that splits off
    for term in rest:
        g = sympy.gcd(term, d)
        if g != 1 and g != d and _divides(g, d) is not None:
            inner = _floordiv(a, g, ranges)
            if not isinstance(inner, FloorDiv):
                return _floordiv(inner, _divides(g, d), ranges)
    return FloorDiv(a, d)


def _mod(a: sympy.Expr, m: sympy.Expr, ranges) -> sympy.Expr:
    if m == 1:
        return sympy.Integer(0)
    kept = [t for t in sympy.Add.make_args(sympy.expand(a)) if _divides(m, t) is None]
    rest = sympy.Add(*kept)
    if _below(rest, m, ranges):
        return rest
    return ModularIndexing(rest, 1, m)


def _split_atom(term: sympy.Expr, ranges):
    """``(atom, scale)`` for a term holding exactly one floor division or modulo of
    the loop variables."""
    factors = sympy.Mul.make_args(term)
    atoms = [f for f in factors if _is_loop_atom(f, ranges) and not isinstance(f, sympy.Symbol)]
    if len(atoms) != 1:
        return None, term
    return atoms[0], sympy.Mul(*[f for f in factors if f is not atoms[0]])


def _recombine(expr: sympy.Expr, ranges) -> sympy.Expr:
    """``c*m*((a//k)//m) + c*((a//k) % m)`` -> ``c*(a//k)`` (``c*a`` when ``k`` is 1)."""
    changed = True
    while changed and expr.is_Add:
        changed = False
        split = [_split_atom(t, ranges) for t in sympy.Add.make_args(expr)]
        for atom, scale in split:
            if not isinstance(atom, ModularIndexing):
                continue
            base, div, mod = atom.args
            partner = FloorDiv(base, div * mod)
            for other, other_scale in split:
                if other == partner and sympy.expand(other_scale - scale * mod) == 0:
                    expr = sympy.expand(expr - scale * atom - other_scale * other) \
                        + scale * FloorDiv(base, div)
                    changed = True
                    break
            if changed:
                break
    return expr


def simplify_index(expr, ranges: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """``expr`` with the floor divisions and modulos that the loop ranges make
    trivial removed: with ``0 <= x1 < 768`` and ``0 <= x0 < 1024``::

        98304*((768*x0 + x1)//98304) + 768*ModularIndexing(768*x0 + x1, 768, 128)
            + ModularIndexing(x1, 1, 768)          ->     768*x0 + x1

    (a reshape to ``(8, 128, 768)`` and back).  Loads whose index is affine in the
    innermost loop variable vectorize; a division or modulo in it does not.
    """
    expr = sympy.sympify(expr)
    if not expr.free_symbols & set(ranges):
        return expr
    return _simplify_index(expr, tuple(ranges.items()))


@functools.lru_cache(maxsize=8192)
def _simplify_index(expr: sympy.Expr, range_items: tuple) -> sympy.Expr:
    """``simplify_index`` (memoized: the layers of a model repeat their indices)."""
    ranges = dict(range_items)

    def walk(e):
        if e.is_Atom:
            return e
        args = [walk(a) for a in e.args]
        if isinstance(e, FloorDiv):
            return _floordiv(args[0], args[1], ranges)
        if isinstance(e, ModularIndexing):
            return _mod(_floordiv(args[0], args[1], ranges), args[2], ranges)
        e = e.func(*args)
        return _recombine(sympy.expand(e), ranges) if e.is_Add else e

    return walk(expr)
