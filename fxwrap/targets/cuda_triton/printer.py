"""Sympy index expressions -> Triton (Python) integer arithmetic.

Loop variables (``x0``, ``r1``) and size symbols (``s0``) are kernel locals;
everything else is integer arithmetic with C semantics on the GPU, so floor
division and modulo use ``//`` / ``%`` only where both sides are known
non-negative, and the ``_fx_ifloordiv`` / ``_fx_imod`` helpers otherwise::

    >>> import sympy
    >>> from torch.utils._sympy.functions import ModularIndexing
    >>> x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    >>> IndexPrinter().render(64*x0 + ModularIndexing(x1, 1, 8))
    '64*x0 + x1 % 8'

``helpers`` collects the helper names a rendering used (so the kernel module
defines only those).
"""
from __future__ import annotations

from fxwrap.targets.cstyle import EmitError  # the builder keeps such kernels as ATen externs

import sympy

from fxwrap.targets.index_printer import SympyIndexPrinter


class IndexError_(EmitError):
    """An index expression the Triton emitter cannot print."""


class IndexPrinter(SympyIndexPrinter):
    """``IndexPrinter().render(expr) -> str``; symbol names print as themselves."""

    error = IndexError_
    true_false = ("True", "False")
    max_fn, min_fn = "tl.maximum", "tl.minimum"

    def __init__(self, target_name: str = "triton"):
        self.target_name = target_name
        self.helpers: set[str] = set()

    def render(self, expr) -> str:
        return self.expr(sympy.sympify(expr))

    def operand(self, e) -> str:
        text = self.expr(e)
        if isinstance(e, (sympy.Symbol, sympy.Integer)) or text.isidentifier():
            return text
        return f"({text})"

    def group(self, text: str) -> str:
        return text

    def add_term(self, t, first: bool) -> str:
        text = self.expr(t)
        return f"({text})" if not first and isinstance(t, sympy.Add) else text

    def exact_div(self, num, q: int) -> str:
        return f"({self.expr(num)}) // {q}"

    def product(self, e, coeff, rest) -> str:
        if coeff == -1:
            return f"-{self.add_term(rest, False)}"
        return "*".join(self.operand(f) for f in e.as_ordered_factors())

    def power(self, base, n: int) -> str:
        return "*".join([self.operand(base)] * n) if n else "1"

    def div(self, a, b) -> str:
        return f"{self.operand(a)} // {self.operand(b)}"

    def quotient(self, a, b) -> str:
        return f"({self.div(a, b)})"

    def mod(self, a_text: str, b) -> str:
        return f"{a_text} % {self.operand(b)}"

    def ceildiv(self, a, b) -> str:
        return f"({self.expr(a)} + {self.operand(b)} - 1) // {self.operand(b)}"

    def negate(self, text: str) -> str:
        return f"-{text}"

    def need(self, *helpers: str) -> None:
        self.helpers.update(f"_fx_i{h}" for h in helpers)

    def floordiv_call(self, a_text: str, b_text: str) -> str:
        return f"_fx_ifloordiv({a_text}, {b_text})"

    def mod_call(self, a_text: str, b_text: str) -> str:
        return f"_fx_imod({a_text}, {b_text})"

    def where(self, c, a, b) -> str:
        return f"tl.where({self.expr(c)}, {self.expr(a)}, {self.expr(b)})"

    def compare(self, op: str, lhs, rhs) -> str:
        return f"({self.infix(op, (lhs, rhs))})"

    def logical_not(self, a) -> str:
        return f"({self.operand(a)} == 0)"
