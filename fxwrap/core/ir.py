"""Loop IR: frozen, hashable records ``(op, dtype, args)`` and the scheduled kernels
made of them.

``torch.relu(x) * 2`` over a contiguous ``(s0, 64)`` float tensor is the kernel::

    ScheduledKernel(name="fxwrap_kernel_0",
        ranges=(s0, 64), reduction_ranges=(),
        stores=(Store(buf1, 64*x0 + x1,
            Op("mul", f32, (Op("maximum", f32, (Op("load", f32, ("arg0", 64*x0 + x1)),
                                               Op("const", f32, (0.0,)))),
                            Op("const", f32, (2.0,))))),))

Iteration variables are the sympy symbols ``x0, x1, ...`` (one per entry of
``ranges``, outermost first) and ``r0, r1, ...`` (one per entry of
``reduction_ranges``).  Index expressions are sympy expressions over them and over
the program's size symbols.  Because nodes are structural records, equal
sub-expressions are equal objects: CSE and cache keys come for free.

Ops (``Op.op``) and their ``args``:

* ``load``: ``(buffer_name, index)`` or ``(buffer_name, index, mask)``, see *Loads*
  below; ``const``: ``(python_value,)``;
  ``index``: ``(int_expr,)`` the value of an index expression (iota/arange);
  ``acc``: ``(reduction_name, field)``, the result of a reduction of this kernel
  (field 0 except for ``welford``: 0 mean, 1 m2, 2 count; and ``argmax``/``argmin``:
  0 index, 1 value).
* unary (``args=(x,)``): see ``UNARY``; ``cast`` converts ``x`` to ``dtype``.
* binary (``args=(a, b)``): see ``BINARY``; comparisons give ``torch.bool``.
* ``where``: ``(cond, a, b)``.

Loads.  ``index`` is the element offset from the buffer's data pointer:

* *direct*: a sympy expression over the iteration variables and size symbols,
  ``Op("load", f32, ("arg0", 64*x0 + x1))``;
* *indirect*: an integer ``Op`` computed in the kernel, for offsets that depend on
  loaded data (gather, embedding, ``x[idx]``).  ``F.embedding(idx, w)`` with ``w`` of
  size ``(V, 64)`` reads, at output index ``(x0, x1)``::

      Op("load", f32, ("arg1", Op("add", i64, (
          Op("index", i64, (x1,)),
          Op("mul", i64, (Op("load", i64, ("arg0", x0)), Op("index", i64, (64,))))))))

  The index values are checked on the host before the kernel runs (a
  ``check_index_bounds`` extern, ``fxwrap.runtime.checks``), so an indirect load
  never reads outside its buffer;
* *masked*: a third argument, a ``torch.bool`` ``Op``: where it is false nothing is
  read and the load's value is 0 (``cat``, ``constant_pad_nd``: a value defined
  piecewise over the output index is a ``where`` over masked loads).

``load_index(op)`` / ``load_mask(op)`` read those fields; ``index_symbols(index)``
gives the symbols an index (direct or indirect) uses.

Reductions (``Reduction.kind``): ``sum prod max min any all argmax argmin welford``.
bf16/fp16 values are loaded and stored in their type and computed in float32 (the
lowerings insert the casts).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

UNARY = frozenset("""
neg abs exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh
tanh asinh acosh atanh erf erfc erfinv floor ceil round trunc sigmoid sign reciprocal
logical_not bitwise_not isnan isinf signbit cast
""".split())

BINARY = frozenset("""
add sub mul truediv floordiv truncdiv mod fmod pow maximum minimum atan2 copysign
logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor lshift rshift
lt le gt ge eq ne
""".split())

COMPARISONS = frozenset("lt le gt ge eq ne isnan isinf signbit logical_not logical_and logical_or logical_xor".split())

REDUCTIONS = frozenset("sum prod max min any all argmax argmin welford".split())


@dataclass(frozen=True)
class Op:
    """One loop-IR value: ``Op("add", torch.float32, (a, b))``."""

    op: str
    dtype: torch.dtype
    args: tuple = ()

    def children(self) -> tuple["Op", ...]:
        return tuple(a for a in self.args if isinstance(a, Op))


def xvar(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"x{i}", integer=True, nonnegative=True)


def rvar(i: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{i}", integer=True, nonnegative=True)


@dataclass(frozen=True)
class Reduction:
    """``Reduction("acc0", "sum", value)``: accumulate ``value`` over every ``r`` var.

    ``value`` is an ``Op`` over x and r vars; it may read earlier reductions'
    ``acc`` of the same kernel (softmax: max, then sum of exp(x - max)).
    """

    name: str
    kind: str
    value: Op
    dtype: torch.dtype  # the accumulator's dtype


@dataclass(frozen=True)
class Store:
    """``Store("buf1", 64*x0 + x1, value)``.

    In a reduction kernel a store whose index uses r vars runs in a final pass over
    the reduction range (the pointwise epilogue: softmax's ``exp(x-max)/sum``);
    one that uses only x vars runs once per output row.
    """

    buffer: str
    index: sympy.Expr
    value: Op


@dataclass(frozen=True)
class ScheduledKernel:
    """A fused kernel, ready for a ``KernelEmitter.render``.

    ``inputs``/``outputs`` are the buffers (``fxwrap.lines.Buffer``) the kernel
    reads and writes, in argument order; ``size_symbols`` follow them as scalar
    arguments.  ``origins`` are the ATen nodes it came from.
    """

    name: str
    inputs: tuple
    outputs: tuple
    size_symbols: tuple[sympy.Symbol, ...]
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    reductions: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    origins: tuple[str, ...] = ()

    @property
    def is_reduction(self) -> bool:
        return bool(self.reductions)


def walk(root: Op):
    """Every distinct node under ``root``, children before parents (deterministic)."""
    seen: set[Op] = set()
    order: list[Op] = []
    stack: list[tuple[Op, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if node in seen:
            continue
        if expanded:
            seen.add(node)
            order.append(node)
            continue
        stack.append((node, True))
        for child in reversed(node.children()):
            if child not in seen:
                stack.append((child, False))
    return order


def load_index(load: Op):
    """A ``load``'s index: a sympy expression (direct) or an integer ``Op`` (indirect)."""
    return load.args[1]


def load_mask(load: Op) -> Op | None:
    """A ``load``'s mask (a bool ``Op``), or None when it reads unconditionally."""
    return load.args[2] if len(load.args) > 2 else None


def is_indirect(index) -> bool:
    """True for an index computed in the kernel (an ``Op``) rather than a sympy expression."""
    return isinstance(index, Op)


def index_symbols(index) -> set[sympy.Symbol]:
    """Every sympy symbol (loop variables, size symbols) an index uses.

    For an indirect index: those of the ``index`` and ``load`` nodes it is made of.
    """
    if not is_indirect(index):
        return set(sympy.sympify(index).free_symbols)
    out: set[sympy.Symbol] = set()
    for node in walk(index):
        if node.op == "index":
            out |= sympy.sympify(node.args[0]).free_symbols
        elif node.op == "load" and not is_indirect(node.args[1]):
            out |= sympy.sympify(node.args[1]).free_symbols
    return out


def is_loop_var(s: sympy.Symbol) -> bool:
    """True for a loop variable (``x0``, ``r1``); false for a size symbol (``s0``)."""
    return s.name[:1] in ("x", "r") and s.name[1:].isdigit()


def loop_var_names(expr) -> frozenset[str]:
    """The names of the loop variables a sympy index expression uses."""
    return frozenset(s.name for s in sympy.sympify(expr).free_symbols if is_loop_var(s))


def value_deps(op: Op, cache: dict) -> frozenset:
    """What ``op`` needs to be computed inside a kernel: the names of the loop variables
    its indices (and masks) use, and ``("acc", name)`` for each reduction result it
    reads.  Emitters declare a value in the outermost scope that provides all of it.
    Memoised in ``cache`` (an ``{Op: frozenset}`` shared by one kernel's scopes)."""
    hit = cache.get(op)
    if hit is not None:
        return hit
    if op.op in ("load", "index"):
        expr = op.args[1] if op.op == "load" else op.args[0]
        if isinstance(expr, Op):  # indirect load: the index is a value of the kernel
            d = value_deps(expr, cache)
        else:
            d = loop_var_names(expr)
        if op.op == "load" and len(op.args) > 2 and isinstance(op.args[2], Op):
            d |= value_deps(op.args[2], cache)
    elif op.op == "acc":
        d = frozenset([("acc", op.args[0])])
    else:
        d = frozenset()
        for child in op.children():
            d |= value_deps(child, cache)
    cache[op] = d
    return d


def split_stores(stores, rvars) -> tuple[list[Store], list[Store]]:
    """A reduction kernel's stores as ``(r_stores, x_stores)``: those whose index uses one
    of the r vars ``rvars`` (they run in a final pass over the reduction range), and
    those that run once per output row; each in kernel order."""
    rnames = {v.name for v in rvars}
    r_stores: list[Store] = []
    x_stores: list[Store] = []
    for st in stores:
        uses_r = any(s.name in rnames for s in sympy.sympify(st.index).free_symbols)
        (r_stores if uses_r else x_stores).append(st)
    return r_stores, x_stores
