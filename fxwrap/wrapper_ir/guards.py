"""A program's inputs -> the ``InputGuard`` its GraphModule checks first.

For the inputs ``SizeInput(s0, 8), Buffer("arg1", (s0, 16), (16, 1), float32, cpu)``
and a ShapeEnv that recorded ``s0 >= 2``::

    InputGuard(SizeInputSpec("s0"),
               TensorInputSpec("arg1", float32, cpu, ("s0", 16), (16, 1)),
               conditions=[SizeCondition("s0 >= 2", ...)])

Storage offsets and storage sizes are left unchecked (see ``fxwrap.runtime.guards``
for why); sizes and strides are printed as Python over the size-input
names (``fxwrap.runtime.guards`` evaluates them without sympy).  Each printed
expression is checked against sympy at the compile-time hints; one that does not
print faithfully is left unchecked (a condition) or raises (a layout).
"""
from __future__ import annotations

from collections.abc import Sequence

import sympy
from torch.utils._sympy.printers import PythonPrinter

from fxwrap.runtime.guards import (
    InputGuard, OtherInputSpec, SizeCondition, SizeInputSpec, SymbolBinding, TensorInputSpec,
)
from fxwrap.ir.lines import Buffer, SizeInput

_PRINTER = PythonPrinter()
_EVAL_NAMES = {"__builtins__": {}, "max": max, "min": min, "abs": abs, "int": int}


def build_input_guard(inputs: Sequence, shape_env=None, lines: Sequence | None = None,
                      size_assumptions: Sequence = ()) -> InputGuard:
    """The guard for a program's ``inputs`` (``Buffer`` / ``SizeInput`` / other values),
    with the ranges and guards of ``shape_env`` (the ShapeEnv of the traced graph) over
    the program's size symbols, and the ``size_assumptions`` its lowering made
    (``core.lowering.SizeAssumption``: ``s0 == 3`` where ``index_put`` reads values of
    size ``(s5, s0)`` as ``(s5, 3)``).  Given its ``lines``, an input no kernel reads also
    accepts a CPU scalar in place of its device (see ``fxwrap.runtime.guards``), and the errors name the target of the
    kernels they launch."""
    kernel_reads = read_by_kernels(lines) if lines is not None else None
    size_names = {i.name for i in inputs if isinstance(i, SizeInput)}
    hints = {i.name: int(i.hint) for i in inputs if isinstance(i, SizeInput)
             if isinstance(i.hint, int) and not isinstance(i.hint, bool)}
    bindings = _bindings(inputs, size_names)
    for b in bindings:
        buf = next(i for i in inputs if isinstance(i, Buffer) and i.name == b.name)
        hint = _hint_of(buf.size[b.dim], shape_env)
        if hint is not None:
            hints[b.symbol] = hint
    known = size_names | {b.symbol for b in bindings}
    specs = []
    for inp in inputs:
        if isinstance(inp, SizeInput):
            specs.append(SizeInputSpec(inp.name) if inp.name in hints else OtherInputSpec(inp.name))
        elif isinstance(inp, Buffer):
            extern_only = kernel_reads is not None and inp.name not in kernel_reads
            specs.append(TensorInputSpec(
                inp.name, inp.dtype, inp.device,
                tuple(_layout_expr(e, known, hints) for e in inp.size),
                tuple(_layout_expr(e, known, hints) for e in inp.stride),
                None, None,  # offset and storage bytes: see fxwrap.runtime.guards
                cpu_scalar_ok=extern_only))
        else:
            specs.append(OtherInputSpec(getattr(inp, "name", str(inp))))
    targets = sorted({line.kernel.target for line in lines or () if line.kernel is not None})
    conditions = _conditions(shape_env, known, hints)
    for condition in _assumed(size_assumptions, known, hints):  # each relation once: the first op's words
        if all(c.code != condition.code for c in conditions):
            conditions.append(condition)
    return InputGuard(specs, conditions, bindings,
                      target=", ".join(targets) if targets else None)


def read_by_kernels(lines: Sequence) -> set[str]:
    """Names of the buffers whose storage a kernel launch of ``lines`` reads or writes,
    directly or through views."""
    root: dict[str, str] = {}
    used: set[str] = set()
    for line in lines:
        base = line.view_base
        if base is not None:
            root.update((b.name, root.get(base.name, base.name)) for b in line.defines())
        elif line.binds_device:
            used |= {root.get(b.name, b.name) for b in line.reads()}
    return used


def _bindings(inputs, size_names) -> list[SymbolBinding]:
    """Symbols in input layouts that are not size inputs, bound to their first plain use."""
    bindings: dict[str, SymbolBinding] = {}
    for inp in inputs:
        if isinstance(inp, Buffer):
            for dim, n in enumerate(inp.size):
                n = sympy.sympify(n)
                if isinstance(n, sympy.Symbol) and n.name not in size_names and n.name not in bindings:
                    bindings[n.name] = SymbolBinding(n.name, inp.name, dim)
    return list(bindings.values())


def _hint_of(expr, shape_env):
    if shape_env is None:
        return None
    values = {s.name: v for s, v in _var_values(shape_env).items()}
    expr = sympy.sympify(expr)
    if isinstance(expr, sympy.Symbol) and expr.name in values:
        return int(values[expr.name])
    return None


def _var_values(shape_env) -> dict:
    """The ShapeEnv's symbol -> hint (``backed_var_to_val`` where torch has it)."""
    backed = getattr(shape_env, "backed_var_to_val", None)
    return dict(backed if backed is not None else shape_env.var_to_val)


def python_source(expr, hints: dict[str, int]) -> str | int | None:
    """``expr`` as an int or as Python source over symbol names; None when printing it
    would not give sympy's value at ``hints`` (or a symbol has no hint)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    if expr in (sympy.true, sympy.false):
        return None
    names = {s.name for s in expr.free_symbols}
    if not names <= set(hints):
        return None
    try:
        source = _PRINTER.doprint(expr)
        got = eval(source, _EVAL_NAMES, dict(hints))  # noqa: S307 -- printed by us
        want = expr.xreplace({s: sympy.Integer(hints[s.name]) for s in expr.free_symbols})
        if isinstance(want, sympy.logic.boolalg.Boolean):
            return source if bool(want) == bool(got) else None
        return source if int(want) == got else None
    except Exception:  # an expression the printer or eval cannot handle: not checked
        return None


def _layout_expr(expr, known: set[str], hints: dict[str, int]):
    """A size/stride/offset as the guard checks it; symbols outside ``known`` (never bound
    at run time) leave it unchecked (None)."""
    expr = sympy.sympify(expr)
    if {s.name for s in expr.free_symbols} - known:
        return None
    return python_source(expr, hints)


def _conditions(shape_env, known: set[str], hints: dict[str, int]) -> list[SizeCondition]:
    """The ranges of the program's symbols and the ShapeEnv's guards over them."""
    if shape_env is None or not known:
        return []
    conditions: dict[str, SizeCondition] = {}
    by_name = {s.name: s for s in _var_values(shape_env)}
    for name in sorted(known):
        symbol = by_name.get(name)
        bounds = shape_env.var_to_range.get(symbol) if symbol is not None else None
        if bounds is None:
            continue
        for bound, op in ((bounds.lower, ">="), (bounds.upper, "<=")):
            bound = sympy.sympify(bound)
            if not bound.is_Integer:  # +-oo (int_oo) or not a number: no check
                continue
            code = f"{name} {op} {int(bound)}"
            conditions.setdefault(code, SizeCondition(code, code, "the range dynamo gave the symbol"))
    for guard in getattr(shape_env, "guards", ()):
        expr = getattr(guard, "expr", guard)
        try:
            expr = shape_env.simplify(expr)
        except Exception:  # noqa: BLE001 -- a guard we cannot simplify: left out
            continue
        if expr in (sympy.true, sympy.false) or not isinstance(expr, sympy.Basic):
            continue
        if {s.name for s in expr.free_symbols} - known:
            continue
        code = python_source(expr, hints)
        if code is not None and code not in conditions:
            conditions[code] = SizeCondition(code, str(expr), "the guards dynamo recorded while tracing")
    return list(conditions.values())




def _assumed(size_assumptions: Sequence, known: set[str], hints: dict[str, int]) -> list[SizeCondition]:
    """A condition per size assumption over symbols the guard knows at run time.  One that
    does not print as Python faithfully would be left unchecked: an error, as a layout the
    guard cannot check is (the kernels would read out of bounds)."""
    conditions = []
    for assumption in size_assumptions:
        expr = assumption.condition
        if {s.name for s in expr.free_symbols} - known:
            continue  # a symbol the program computes (an unbacked size): no input sets it
        code = python_source(expr, hints)
        if code is None:
            raise ValueError(f"fxwrap: the input guard cannot check the size relation {expr} "
                             f"({assumption.what}) as Python")
        conditions.append(SizeCondition(code, code, assumption.what))
    return conditions
