"""Sympy integer index expressions -> source text: the walk every target shares.

``SympyIndexPrinter.expr(e)`` dispatches on the sympy node and decides which form is
legal where (the same for every target): floor division and modulo take the native
operator only where both sides are known non-negative, a helper call otherwise;
``min``/``max`` fold right over their sorted arguments; a rational coefficient is an
exact division; anything else is an error naming the target.  Subclasses spell the
forms (``div``, ``mod``, ``floordiv_call``, ``group``, ...): the C-family emitters in
``fxwrap.targets.cstyle``, Triton in ``fxwrap.targets.cuda_triton.printer``.  With
``x0`` a loop variable (non-negative) and ``s0`` an integer of unknown sign,
``FloorDiv(x0, 4) + PythonMod(s0, 8)`` prints as::

    (x0 / 4) + fx_imod(s0, 8)        # C (CppEmitter().render_index)
    x0 // 4 + _fx_imod(s0, 8)        # Triton (IndexPrinter().render)
"""
from __future__ import annotations

import sympy
from sympy.logic.boolalg import BooleanFalse, BooleanTrue
from torch.utils._sympy import functions as symfn

_RELATIONS = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
              sympy.GreaterThan: ">=", sympy.Equality: "==", sympy.Unequality: "!="}
_BITWISE = {"BitwiseFn_bitwise_and": "&", "BitwiseFn_bitwise_or": "|",
            "BitwiseFn_bitwise_xor": "^"}


def nonneg(e) -> bool:
    """True when sympy knows ``e`` is >= 0."""
    return bool(sympy.sympify(e).is_nonnegative)


def positive(e) -> bool:
    """True when sympy knows ``e`` is > 0."""
    return bool(sympy.sympify(e).is_positive)


class SympyIndexPrinter:
    """Prints one sympy index expression through the hooks below (see the module doc).

    ``expr`` is the whole expression, ``arg`` one as a call argument, ``operand`` one as
    an operand of an infix operator; ``group`` wraps a compound result (C-style
    printers parenthesise every compound, Triton's leaves that to ``operand``).
    """

    error: type[Exception] = NotImplementedError  # subclasses raise their EmitError
    true_false = ("true", "false")
    max_fn, min_fn = "max", "min"
    and_op, or_op = "&", "|"
    pow_error = "a non-constant power"
    target_name = "?"

    # ------------------------------------------------------------------ hooks
    def int_literal(self, v: int) -> str:
        return str(v)

    def symbol(self, e: sympy.Symbol) -> str:
        return e.name

    def arg(self, e) -> str:
        return self.expr(e)

    def operand(self, e) -> str:
        raise NotImplementedError

    def group(self, text: str) -> str:
        raise NotImplementedError

    def add_term(self, t, first: bool) -> str:
        raise NotImplementedError

    def exact_div(self, num, q: int) -> str:
        raise NotImplementedError

    def product(self, e, coeff, rest) -> str:
        raise NotImplementedError

    def power(self, base, n: int) -> str:
        raise NotImplementedError

    def symbolic_power(self, e, base, exp) -> str:
        raise self.error(f"index expression {e} ({self.pow_error}) cannot be rendered on "
                         f"target {self.target_name}; the kernel's nodes run as ATen extern calls")

    def div(self, a, b) -> str:
        raise NotImplementedError

    def quotient(self, a, b) -> str:
        """``div(a, b)`` as the left operand of ``%``."""
        raise NotImplementedError

    def mod(self, a_text: str, b) -> str:
        raise NotImplementedError

    def ceildiv(self, a, b) -> str:
        raise NotImplementedError

    def negate(self, text: str) -> str:
        raise NotImplementedError

    def need(self, *helpers: str) -> None:
        """Called with ``"floordiv"`` / ``"mod"`` before a ``floordiv_call`` / ``mod_call``
        is rendered: a target that defines such helpers per kernel records them."""

    def floordiv_call(self, a_text: str, b_text: str) -> str:
        raise NotImplementedError

    def mod_call(self, a_text: str, b_text: str) -> str:
        raise NotImplementedError

    def where(self, c, a, b) -> str:
        raise NotImplementedError

    def infix(self, op: str, args) -> str:
        return self.group(f" {op} ".join(self.operand(a) for a in args))

    def compare(self, op: str, lhs, rhs) -> str:
        return self.infix(op, (lhs, rhs))

    def logical_not(self, a) -> str:
        raise NotImplementedError

    # ------------------------------------------------------------------ the walk
    def expr(self, e) -> str:
        if isinstance(e, (bool, BooleanTrue, BooleanFalse)):
            return self.true_false[0] if bool(e) else self.true_false[1]
        if isinstance(e, int):
            return self.int_literal(e)
        if e.is_Integer:
            return self.int_literal(int(e))
        if e.is_Symbol:
            return self.symbol(e)
        if isinstance(e, sympy.Add):
            terms = e.as_ordered_terms()
            out = self.add_term(terms[0], True)
            for t in terms[1:]:
                coeff, _ = t.as_coeff_Mul()
                if coeff.is_negative:
                    out += f" - {self.add_term(-t, False)}"
                else:
                    out += f" + {self.add_term(t, False)}"
            return self.group(out)
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if coeff.is_Rational and not coeff.is_Integer:
                # p/q * rest: the lowering promises the division is exact
                return self.exact_div(sympy.Integer(coeff.p) * rest, int(coeff.q))
            return self.product(e, coeff, rest)
        if isinstance(e, symfn.PowByNatural):
            base, exp = e.args
            if not exp.is_Integer:
                return self.symbolic_power(e, base, exp)
            e = sympy.Pow(base, exp, evaluate=False)
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if exp.is_Integer and int(exp) >= 0:
                return self.power(base, int(exp))
            raise self.error(f"index expression {e} ({self.pow_error}) cannot be rendered on "
                             f"target {self.target_name}; the kernel's nodes run as ATen extern calls")
        if isinstance(e, symfn.FloorDiv):
            a, b = e.args
            if nonneg(a) and positive(b):
                return self.div(a, b)
            self.need("floordiv")
            return self.floordiv_call(self.arg(a), self.arg(b))
        if isinstance(e, symfn.CleanDiv):
            a, b = e.args
            return self.div(a, b)
        if isinstance(e, symfn.CeilDiv):
            a, b = e.args
            if nonneg(a) and positive(b):
                return self.ceildiv(a, b)
            self.need("floordiv")
            return self.negate(self.floordiv_call(self.arg(-a), self.arg(b)))
        if isinstance(e, symfn.ModularIndexing):
            base, div, mod = e.args
            if nonneg(base) and positive(div) and positive(mod):
                q = self.operand(base) if div == 1 else self.quotient(base, div)
                return self.mod(q, mod)
            self.need("floordiv", "mod")
            return self.mod_call(self.floordiv_call(self.arg(base), self.arg(div)), self.arg(mod))
        if isinstance(e, (symfn.Mod, symfn.PythonMod, sympy.Mod)):
            a, b = e.args
            if nonneg(a) and positive(b):
                return self.mod(self.operand(a), b)
            self.need("mod")
            return self.mod_call(self.arg(a), self.arg(b))
        if isinstance(e, (symfn.Max, sympy.Max, symfn.Min, sympy.Min)):
            fn = self.max_fn if isinstance(e, (symfn.Max, sympy.Max)) else self.min_fn
            args = sorted(e.args, key=sympy.default_sort_key)
            out = self.arg(args[-1])
            for a in reversed(args[:-1]):
                out = f"{fn}({self.arg(a)}, {out})"
            return out
        if isinstance(e, symfn.Identity):
            return self.expr(e.args[0])
        if isinstance(e, symfn.Where):
            c, a, b = e.args
            return self.where(c, a, b)
        if isinstance(e, (symfn.LShift, symfn.RShift)):
            return self.infix("<<" if isinstance(e, symfn.LShift) else ">>", e.args[:2])
        if type(e).__name__ in _BITWISE:
            return self.infix(_BITWISE[type(e).__name__], e.args)
        if type(e) in _RELATIONS:
            return self.compare(_RELATIONS[type(e)], e.lhs, e.rhs)
        if isinstance(e, sympy.And):
            return self.infix(self.and_op, sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Or):
            return self.infix(self.or_op, sorted(e.args, key=sympy.default_sort_key))
        if isinstance(e, sympy.Not):
            return self.logical_not(e.args[0])
        raise self.error(f"index expression {e} ({type(e).__name__}) cannot be rendered on target "
                         f"{self.target_name}; the kernel's nodes run as ATen extern calls")
