"""Sympy index expressions -> Triton (Python) integer arithmetic.

Loop variables (``x0``, ``r1``) and size symbols (``s0``) are kernel locals;
everything else is integer arithmetic with C semantics on the GPU, so floor
division and modulo use ``//`` / ``%`` only where both sides are known
non-negative, and the ``_fx_ifloordiv`` / ``_fx_imod`` helpers otherwise::

    >>> IndexPrinter().render(64*x0 + ModularIndexing(x1, 1, 8))
    '64*x0 + x1 % 8'

``helpers`` collects the helper names a rendering used (so the kernel module
defines only those).
"""
from __future__ import annotations

from fxwrap.targets.cstyle import EmitError  # the builder keeps such kernels as ATen externs

import sympy
from torch.utils._sympy import functions as symfn


class IndexError_(EmitError):
    """An index expression the Triton emitter cannot print."""


def _nonneg(e) -> bool:
    return bool(sympy.sympify(e).is_nonnegative)


def _positive(e) -> bool:
    return bool(sympy.sympify(e).is_positive)


class IndexPrinter:
    """``IndexPrinter().render(expr) -> str``; symbol names print as themselves."""

    def __init__(self, target_name: str = "triton"):
        self.target_name = target_name
        self.helpers: set[str] = set()

    def render(self, expr) -> str:
        return self._p(sympy.sympify(expr))

    def _paren(self, e) -> str:
        text = self._p(e)
        if isinstance(e, (sympy.Symbol, sympy.Integer)) or text.isidentifier():
            return text
        return f"({text})"

    def _p(self, e) -> str:
        if isinstance(e, bool) or e in (sympy.true, sympy.false):
            return "True" if bool(e) else "False"
        if isinstance(e, int):
            return str(e)
        if e.is_Integer:
            return str(int(e))
        if e.is_Symbol:
            return e.name
        if isinstance(e, sympy.Add):
            terms = e.as_ordered_terms()
            out = self._p(terms[0])
            for t in terms[1:]:
                coeff, _ = t.as_coeff_Mul()
                if coeff.is_negative:
                    out += f" - {self._term(-t)}"
                else:
                    out += f" + {self._term(t)}"
            return out
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if coeff.is_Rational and not coeff.is_Integer:
                # p/q * rest: the lowering promises the division is exact
                return f"({self._p(sympy.Integer(coeff.p) * rest)}) // {int(coeff.q)}"
            if coeff == -1:
                return f"-{self._term(rest)}"
            return "*".join(self._paren(f) for f in e.as_ordered_factors())
        if isinstance(e, (sympy.Pow, symfn.PowByNatural)):
            base, exp = e.args
            if exp.is_Integer and int(exp) >= 0:
                return "*".join([self._paren(base)] * int(exp)) if int(exp) else "1"
            raise IndexError_(f"index expression {e} (a non-constant power) cannot be rendered on "
                              f"target {self.target_name}; precompute it on the host (DefineSymbol)")
        if isinstance(e, symfn.FloorDiv):
            a, b = e.args
            if _nonneg(a) and _positive(b):
                return f"{self._paren(a)} // {self._paren(b)}"
            self.helpers.add("_fx_ifloordiv")
            return f"_fx_ifloordiv({self._p(a)}, {self._p(b)})"
        if isinstance(e, symfn.CleanDiv):
            a, b = e.args
            return f"{self._paren(a)} // {self._paren(b)}"
        if isinstance(e, symfn.CeilDiv):
            a, b = e.args
            if _nonneg(a) and _positive(b):
                return f"({self._p(a)} + {self._paren(b)} - 1) // {self._paren(b)}"
            self.helpers.add("_fx_ifloordiv")
            return f"-_fx_ifloordiv({self._p(-a)}, {self._p(b)})"
        if isinstance(e, symfn.ModularIndexing):
            base, div, mod = e.args
            if _nonneg(base) and _positive(div) and _positive(mod):
                q = self._paren(base) if div == 1 else f"({self._paren(base)} // {self._paren(div)})"
                return f"{q} % {self._paren(mod)}"
            self.helpers.update(("_fx_ifloordiv", "_fx_imod"))
            return f"_fx_imod(_fx_ifloordiv({self._p(base)}, {self._p(div)}), {self._p(mod)})"
        if isinstance(e, (symfn.Mod, symfn.PythonMod, sympy.Mod)):
            a, b = e.args
            if _nonneg(a) and _positive(b):
                return f"{self._paren(a)} % {self._paren(b)}"
            self.helpers.add("_fx_imod")
            return f"_fx_imod({self._p(a)}, {self._p(b)})"
        if isinstance(e, (symfn.Max, sympy.Max, symfn.Min, sympy.Min)):
            fn = "tl.maximum" if isinstance(e, (symfn.Max, sympy.Max)) else "tl.minimum"
            args = sorted(e.args, key=sympy.default_sort_key)
            out = self._p(args[-1])
            for a in reversed(args[:-1]):
                out = f"{fn}({self._p(a)}, {out})"
            return out
        if isinstance(e, symfn.Identity):
            return self._p(e.args[0])
        if isinstance(e, symfn.Where):
            c, a, b = e.args
            return f"tl.where({self._p(c)}, {self._p(a)}, {self._p(b)})"
        if isinstance(e, (symfn.LShift, symfn.RShift)):
            op = "<<" if isinstance(e, symfn.LShift) else ">>"
            return f"{self._paren(e.args[0])} {op} {self._paren(e.args[1])}"
        bitwise = {"BitwiseFn_bitwise_and": "&", "BitwiseFn_bitwise_or": "|",
                   "BitwiseFn_bitwise_xor": "^"}
        if type(e).__name__ in bitwise:
            return f" {bitwise[type(e).__name__]} ".join(self._paren(a) for a in e.args)
        rel = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}
        if type(e) in rel:
            return f"({self._paren(e.lhs)} {rel[type(e)]} {self._paren(e.rhs)})"
        if isinstance(e, sympy.And):
            return " & ".join(self._paren(a) for a in sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Or):
            return " | ".join(self._paren(a) for a in sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Not):
            return f"({self._paren(e.args[0])} == 0)"
        raise IndexError_(f"index expression {e} ({type(e).__name__}) cannot be rendered on target "
                          f"{self.target_name}; precompute it on the host (a DefineSymbol line) and "
                          "pass it in as a size symbol")

    def _term(self, t) -> str:
        text = self._p(t)
        return f"({text})" if isinstance(t, sympy.Add) else text
