"""The C-family engine: one renderer of which C99, C++ (``cpu_cpp``) and Metal (``mps_metal``)
are dialects (and the C99 example target, ``examples/fxwrap-c99``, a fourth).

The engine writes plain C; a dialect only spells syntax, through class attributes (helper
``prefix``, ``cast``, ``typed_value``, ``generic`` / ``overload`` helper calls, ``out_arg``,
qualifiers, type names, prelude) and the one dict ``code_for_op`` of op renderings built
by ``c_ops``; the value walk (``targets/values.py``), the SSA locals, the sympy index
printer, loads, stores, casts, 16-bit float handling, the accumulators of every reduction
and scan kind and a serial ``render_body`` are shared.  ``HELPERS`` lists every helper the
engine calls, which a dialect's prelude defines under its prefix; ``targets/c_helpers.py``
defines each once, with PyTorch's semantics, and renders it in a dialect's spelling.

A kernel over a contiguous ``(s0, 64)`` float tensor computing ``relu(x) * 2``::

    ScheduledKernel("fxwrap_kernel_0", inputs=(arg0,), outputs=(buf1,), size_symbols=(s0,),
        ranges=(s0, 64), reduction_ranges=(), reductions=(),
        stores=(Store("buf1", 64*x0 + x1, Op("mul", f32, (Op("maximum", f32, (
            Op.load("arg0", 64*x0 + x1, f32), Op.const(0.0, f32))),
            Op.const(2.0, f32)))),),
        origins=(Origin("relu", "aten.relu.default", "model.py:7", "forward"),
                 Origin("mul", "aten.mul.Tensor", "model.py:7", "forward")))

renders (``CppEmitter``; loop-invariant values are hoisted to the outermost level
where everything they use exists) as::

    const float tmp1 = 0.0f;
    const float tmp3 = 2.0f;
    ...
        for (int64_t x1 = 0; x1 < 64; ++x1) {
          const float tmp0 = in_ptr0[64*x0 + x1];
          const float tmp2 = fx_max(tmp0, tmp1);
          const float tmp4 = tmp2 * tmp3;
          out_ptr0[64*x0 + x1] = tmp4;
        }

Value conventions shared by every C-family target:

* one ``const`` local per distinct ``Op`` (equal Ops are one local: CSE for free);
* the kernel arrives legalized (``fxwrap.core.numerics``): every op is in the dtype it
  is computed in, over operands of that dtype, and every rounding to bf16/fp16 is a
  ``cast``; the emitter renders ops and casts as given, nothing implicit;
* a local holds its dtype's ``compute_dtype``: a bf16/fp16 value lives in a float,
  rounded to its precision (loads convert, a ``cast`` to bf16/fp16 rounds, stores
  convert back to the 16-bit storage type);
* index arithmetic is ``index_type`` (``int64_t``); size symbols are kernel params.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable

import sympy
import torch

from fxwrap.core.errors import EmitError
from fxwrap.ir.loops import (BOOL_RESULT, REDUCTIONS, Op, OpCode, Reduction, ScheduledKernel, acc_key, is_indirect,
                            is_loop_var, load_buffer, load_index, load_mask, rvar, split_stores, value_deps, walk,
                            xvar)
from fxwrap.core.numerics import compute_dtype, holds_exact, illegal
from fxwrap.core.templates import accumulators
from fxwrap.runtime.kernel import KernelArg
from fxwrap.runtime.launch import KernelLaunch
from fxwrap.targets.base import (KernelEmitter, KernelSource, Workspace, kernel_function_name, kernel_header,
                                  kernel_signature)
from fxwrap.targets.c_helpers import HelperPrelude
from fxwrap.targets.index_printer import SympyIndexPrinter
from fxwrap.targets.values import ValueWalker


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _infix(op: str) -> Callable[..., str]:
    return lambda a, b, dtype: f"{a} {op} {b}"


def _is_bool(dtype: torch.dtype) -> bool:
    return dtype == torch.bool


#: Every helper the shared engine calls, without the dialect's prefix: a dialect's prelude
#: defines each as ``<prefix><name>`` (C++: ``fx_imin``; the C99 example: ``c99_imin``), as an
#: overload / template (C++, Metal) or once per type (C: ``<prefix><name>_<type>``, see
#: ``CStyleEmitter.overload`` and ``generic``).  ``index``: the index printer's integer
#: helpers (int64 arguments, never per type); ``ops``: the op table's (``c_ops``);
#: ``reductions`` / ``scans``: the accumulators' (``ReductionAccumulator``, ``ScanState``).
#: tests/null/test_c_dialects.py checks that each built-in dialect's prelude defines them.
HELPERS: dict[str, tuple[str, ...]] = {
    "index": ("imin", "imax", "ifloordiv", "imod", "ipow_index"),
    "ops": ("abs", "rsqrt", "erfinv", "floor", "ceil", "round", "trunc", "sigmoid", "sign", "reciprocal",
            "isnan", "isinf", "signbit", "floordiv", "truncdiv", "mod", "fmod", "pow", "max", "min",
            "lshift", "rshift"),
    "reductions": ("lowest", "highest", "sum_upd", "prod_upd", "max_upd", "min_upd", "any_upd", "all_upd",
                   "argmax_upd", "argmin_upd", "welford_upd", "welford_cmb"),
    "scans": ("logcumsumexp_upd", "cummax_upd", "cummin_upd"),
}

#: the ops a dialect's math library computes (``math`` + name: ``std::exp``, ``metal::exp``,
#: C99 ``<tgmath.h>``'s type-generic ``exp``)
LIBM_OPS = ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan", "asin",
            "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "atan2", "copysign")


#: the C99 types of each dtype (<stdint.h>, <stdbool.h>); C has no 16-bit float
C_TYPES: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double",
    torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t",
    torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
    torch.uint16: "uint16_t", torch.uint32: "uint32_t", torch.uint64: "uint64_t",
}


def c_ops(prefix: str = "fx_", math: str = "", overload: str = "{f}_{t}",
          type_name: Callable[[torch.dtype], str] = C_TYPES.__getitem__) -> dict[str, Callable[..., str]]:
    """One rendering per op of ``fxwrap.ir.loops``: argument strings (C locals, already of the
    op's compute type) -> a C expression.  A dialect builds its table with its spellings:
    helpers are ``overload.format(f=prefix + name, t=type_name(dtype))`` (``fx_abs`` in C++,
    ``c99_abs_float`` in C), libm calls ``math + name``; then it copies and replaces entries.
    The defaults are plain C's (no overloading, ``<tgmath.h>`` math); a dialect that changes
    nothing but its spelling attributes gets its table from them (``DialectOps``)."""

    def helper(name: str) -> Callable[..., str]:
        return lambda *args, dtype: (f"{overload.format(f=prefix + name, t=type_name(dtype))}"
                                     f"({', '.join(args)})")

    def libm(name: str) -> Callable[..., str]:
        return lambda *args, dtype: f"{math}{name}({', '.join(args)})"

    ops: dict[str, Callable[..., str]] = {name: helper(name) for name in HELPERS["ops"]}
    ops.update({name: libm(name) for name in LIBM_OPS})
    del ops["max"], ops["min"]  # helpers of the ops maximum / minimum
    ops.update({
        "maximum": helper("max"), "minimum": helper("min"),
        "neg": lambda x, dtype: f"!{x}" if _is_bool(dtype) else f"-{x}",
        "logical_not": lambda x, dtype: f"!{x}",
        "bitwise_not": lambda x, dtype: f"!{x}" if _is_bool(dtype) else f"~{x}",
        "add": lambda a, b, dtype: f"{a} || {b}" if _is_bool(dtype) else f"{a} + {b}",
        "sub": lambda a, b, dtype: f"{a} != {b}" if _is_bool(dtype) else f"{a} - {b}",
        "mul": lambda a, b, dtype: f"{a} && {b}" if _is_bool(dtype) else f"{a} * {b}",
        "truediv": _infix("/"),
        "logical_and": lambda a, b, dtype: f"({a} != 0) && ({b} != 0)",
        "logical_or": lambda a, b, dtype: f"({a} != 0) || ({b} != 0)",
        "logical_xor": lambda a, b, dtype: f"({a} != 0) != ({b} != 0)",
        "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"),
        "lt": _infix("<"), "le": _infix("<="), "gt": _infix(">"), "ge": _infix(">="),
        "eq": _infix("=="), "ne": _infix("!="),
        "where": lambda c, a, b, dtype: f"{c} ? {a} : {b}",
    })
    return ops


class DialectOps:
    """A dialect's ``code_for_op`` built from its own spelling attributes (``prefix``, ``math``,
    ``overload``, ``type_names``): ``c_ops(cls.prefix, cls.math, cls.overload, ...)`` for the
    class it is read on, so a dialect that only respells sets nothing here."""

    def __init__(self):
        self._tables: dict[type, dict[str, Callable[..., str]]] = {}

    def __get__(self, obj, owner) -> dict[str, Callable[..., str]]:
        if owner not in self._tables:
            self._tables[owner] = c_ops(owner.prefix, owner.math, owner.overload, owner.type_names.__getitem__)
        return self._tables[owner]


class CStyleEmitter(KernelEmitter, ValueWalker):
    """The shared C-family renderer; ``render(kernel) -> KernelSource``.

    The engine writes plain C99 (what a dialect that sets nothing gets); a **dialect** is a
    subclass that only spells syntax, through the class attributes below: its helper
    ``prefix``, type names, casts, typed values, helper instantiation (``generic`` /
    ``overload``), in-out arguments, qualifiers, the op table ``code_for_op`` (``c_ops``)
    and the ``prelude`` defining every helper of ``HELPERS`` under its prefix.  The values
    (``Scope``), loads, stores, constants, casts, the index printer and the accumulators of
    every reduction and scan kind (``ReductionAccumulator``, ``ScanState``) are written once
    here, and so is a serial ``render_body`` (loop nests; reductions and scans one row at a
    time, the rows a loop or, where the dialect sets ``work_item_index``, one per work item:
    ``over_rows``).  C++/OpenMP (``cpu_cpp``) and Metal (``mps_metal``) replace ``render_body`` with
    their parallel schedules over the same accumulators; the C99 example
    (``examples/fxwrap-c99``) keeps it.  What a dialect that sets nothing gets is C99 with
    ``fx_`` helpers: the op table and the prelude follow the spelling attributes
    (``DialectOps``; ``c_helpers.HelperPrelude``: the helpers with PyTorch's semantics, written
    once in ``targets/c_helpers.py``), so the C99 dialect's spelling, whole, is::

        class C99Emitter(CStyleEmitter):
            prefix = "c99_"             # c99_abs_float(x), c99_sum_upd_float(&acc, v), ...
    """

    language = "c"
    comment = "//"
    headers: tuple[str, ...] = ()
    # defines every helper of HELPERS, as prefix + name: by default, c_helpers' definitions
    # rendered in this class's spelling (a str, or HelperPrelude(head, overrides))
    prelude: str = HelperPrelude("#include <stdbool.h>\n#include <stdint.h>\n#include <tgmath.h>")
    prefix = "fx_"                          # of every helper the engine calls (HELPERS)
    math = ""                               # of math-library calls: C++ 'std::', Metal 'metal::'
    helper_inline = "static inline"         # of the prelude's helpers; Metal, OpenCL C: 'inline'
    out_param = "{t} *{x}"                  # a helper's in-out parameter; C++ '{t}& {x}'
    helper_cast = "({t}){x}"                # a cast in the prelude's helpers; Metal '{t}({x})'
    kernel_qualifier = ""                   # 'extern "C"' (C++), 'kernel' (Metal)
    buffer_qualifier = ""                   # address space of buffers: Metal 'device '
    const_qualifier = "const "              # read-only buffers
    restrict_qualifier = "restrict"         # C++ '__restrict__'; '' where unsupported
    size_param_type = "const int64_t"       # Metal: 'constant long&'
    index_type = "int64_t"
    long_suffix = "LL"                      # of a 64-bit literal; OpenCL C (64-bit long): 'L'
    unsigned_long_suffix = "ULL"            # of a literal past int64; OpenCL C: 'UL'
    # the row schedule of the serial body (``over_rows``): None, a loop over the rows; else the
    # C expression of this work item's row (OpenCL 'get_global_id(0)'), one row per work item,
    # launched over ``launch.grid`` items (a Python expression of the size symbols)
    work_item_index: str | None = None
    extra_params: tuple[str, ...] = ()      # parameters after the size symbols
    barrier = ""                            # Metal: 'threadgroup_barrier(mem_flags::mem_threadgroup);'
    infinity = "INFINITY"
    nan = "NAN"
    cast = "(({t})({x}))"                   # x converted to C type t; C++: 'static_cast<{t}>({x})'
    typed_value = "(({t}){v})"              # literal v as a value of C type t; C++: '{t}({v})'
    generic = "{f}_{t}"                     # helper f instantiated at C type t; C++: '{f}<{t}>'
    overload = "{f}_{t}"                    # helper f called on values of C type t; C++: '{f}'
    out_arg = "&{x}"                        # an argument a helper updates; C++ (references): '{x}'
    renders_scans = True  # the scans of ir.loops.SCANS (``ScanState``) render on this target
    # the program may write a kernel's output into an input's storage where the kernel
    # allows it (``ScheduledKernel.in_place_pairs``: those pointers lose ``restrict``)
    writes_in_place = False
    # the dtype a sum / product / logcumsumexp scan of a dtype runs in, where it is not the
    # dtype's compute dtype (C++: float32 in double, as eager's CPU kernels do)
    scan_accumulate: dict[torch.dtype, torch.dtype] = {}
    # storage type of each dtype (what pointers point to)
    type_names: dict[torch.dtype, str] = C_TYPES
    # 16-bit floats, held in float locals: (storage -> float, float -> storage, round)
    half_types: dict[torch.dtype, tuple[str, str, str]] = {}
    # 16-bit floats whose exact value a float local holds (a load, a rounding, an exact op
    # of them: ``EXACT_16BIT``) -> the function storing such a local without rounding it
    # again; a dtype not listed is stored through its rounding conversion (``half_types``)
    exact_half_stores: dict[torch.dtype, str] = {}
    code_for_op: dict[str, Callable[..., str]] = DialectOps()  # c_ops in this class's spelling

    def __init__(self, target=None):
        super().__init__(target)

    # ------------------------------------------------------------------ types
    def storage_type(self, dtype: torch.dtype) -> str:
        try:
            return self.type_names[dtype]
        except KeyError:
            raise EmitError(f"dtype {dtype} has no {self.language} type on target "
                            f"{self.target_name}; add it to {type(self).__name__}.type_names "
                            "or let the lowering fall back to ATen") from None

    def ctype(self, dtype: torch.dtype) -> str:
        """The C type a local of ``dtype`` is held in (bf16/fp16: float)."""
        return self.storage_type(compute_dtype(dtype))

    def helper(self, name: str, *args: str, type_name: str | None = None, inout: tuple[str, ...] = (),
               generic: bool = False) -> str:
        """A call of helper ``name`` (one of ``HELPERS``) in this dialect: prefixed, instantiated
        at C type ``type_name`` (``generic``: a template's explicit type, else an overload's),
        the ``inout`` arguments passed for update (``out_arg``) before ``args``::

            fx_sum_upd<float>(rd0_a0, tmp3)      # C++: helper("sum_upd", "tmp3", type_name="float",
            c99_sum_upd_float(&rd0_a0, tmp3)     # C99:        inout=("rd0_a0",), generic=True)
        """
        fn = self.prefix + name
        if type_name is not None:
            fn = (self.generic if generic else self.overload).format(f=fn, t=type_name)
        return f"{fn}({', '.join([*(self.out_arg.format(x=a) for a in inout), *args])})"

    def value_of(self, type_name: str, v) -> str:
        """Literal ``v`` as a value of C type ``type_name``: ``float(0)`` (C++), ``((float)0)`` (C)."""
        return self.typed_value.format(t=type_name, v=v)

    def render_c_cast(self, type_name: str, x: str) -> str:
        return self.cast.format(t=type_name, x=x)

    # ------------------------------------------------------------------ render
    def render(self, kernel: ScheduledKernel) -> KernelSource:
        """Source text of ``kernel``: a provenance comment, the prelude, one function."""
        self.check(kernel)
        self.workspaces: list = []  # (pointer name, targets.base.Workspace), filled by render_body
        cname = self.function_name(kernel)
        sig = self.signature(kernel)
        body = self.render_body(kernel, LocalNames())
        text = "\n".join([
            *self.header_comment(kernel),
            *self.headers,
            self.prelude.strip("\n"),
            "",
            f"{self.function_head(kernel, cname)}",
            "{",
            *("  " + line if line else "" for line in body),
            "}",
            "",
        ])
        common = dict(symbol=cname, language=self.language,
                      pointers=len(kernel.inputs) + len(kernel.outputs) + len(self.workspaces),
                      size_symbols=tuple(s.name for s in kernel.size_symbols),
                      in_place=tuple(self.in_place_pairs(kernel)))
        if self.work_item_index is not None:
            rows = kernel.ranges if kernel.reductions or kernel.is_scan else (*kernel.ranges, *kernel.reduction_ranges)
            common["grid"] = str(sympy.Mul(*rows))
        launch = self.launch_record(kernel, **common)
        return KernelSource(kernel.name, text, self.language, sig, launch,
                            tuple(ws for _, ws in self.workspaces))

    def workspace(self, numel, dtype: torch.dtype) -> str:
        """A scratch buffer of ``numel`` elements (a sympy expression over the kernel's size
        symbols) of ``dtype`` for the kernel being rendered: its pointer parameter's name
        (``ws_ptr0``), a parameter after the outputs.  The program allocates it
        (``targets.base.Workspace``); the kernel never allocates."""
        name = f"ws_ptr{len(self.workspaces)}"
        self.workspaces.append((name, Workspace(sympy.sympify(numel), dtype)))
        return name

    def launch_record(self, kernel: ScheduledKernel, **common) -> KernelLaunch:
        """The kernel's launch record from the fields every target has (``common``: symbol,
        language, pointers, size_symbols, in_place): a dialect returns its own record type
        (C++: ``CppLaunch``, Metal: ``MetalLaunch``) with its fields added."""
        return KernelLaunch(**common)

    # ------------------------------------------------------------------ the serial schedule
    def render_body(self, kernel: ScheduledKernel, names: "LocalNames") -> list[str]:
        """The function body: this serial schedule, which a dialect keeps (C99) or replaces
        with a parallel one over the same ``Scope`` / accumulators (C++/OpenMP, Metal).

        ``render_body`` builds its text from ``Scope``s that nest like its loops (``Scope(self,
        names, parent, declares=[loop var names])``); ``scope.value(op)`` declares an op's local
        in the outermost scope where its loop vars are declared, ``scope.flush_into(lines)``
        moves those declarations to where the scope's loop body starts, ``render_stores``
        writes stores, and a reduction's result becomes readable as its ``acc`` through
        ``ReductionAccumulator.bind`` (``Scope.bind_acc``).  Pointwise: a loop nest::

            for (int64_t x0 = 0; x0 < s0; ++x0) {
              for (int64_t x1 = 0; x1 < 64; ++x1) {
                const float tmp0 = in_ptr0[64*x0 + x1];
                ...
        """
        if kernel.is_scan:
            return self.serial_scan(kernel, names)
        if kernel.reductions:
            return self.serial_reduction(kernel, names)
        fn = Scope(self, names, None, kernel=kernel)
        vars_ = self.xvars(kernel) + self.rvars(kernel)  # without reductions, r vars are more loops
        ranges = tuple(kernel.ranges) + tuple(kernel.reduction_ranges)
        if self.work_item_index is None:
            body = self.loop_nest(fn, vars_, ranges, lambda inner: self.render_stores(kernel, kernel.stores, inner))
            return fn.lines + body
        item = Scope(self, names, fn, declares=[v.name for v in vars_])  # one element per work item
        body = self.decompose("xindex", vars_, ranges, names)
        stores = self.render_stores(kernel, kernel.stores, item)
        item.flush_into(body)
        return fn.lines + self.over_rows(self.numel(ranges), body + stores)

    def over_rows(self, numel: str, body: list[str]) -> list[str]:
        """The schedule hook: ``body`` (one row, of index ``xindex``) for each of ``numel``
        rows; a loop by default, one work item per row where the dialect sets
        ``work_item_index``::

            for (int64_t xindex = 0; xindex < s0; ++xindex) {      // work_item_index = None
              ...
            const int64_t xindex = get_global_id(0);                // = "get_global_id(0)"
            if (xindex < s0) {
              ...
        """
        out: list[str] = []
        if self.work_item_index is None:
            append_block(out, f"for ({self.index_type} xindex = 0; xindex < {numel}; ++xindex)", body)
        else:
            out.append(f"const {self.index_type} xindex = {self.work_item_index};")
            append_block(out, f"if (xindex < {numel})", body)
        return out

    def loop_nest(self, parent: "Scope", vars_, ranges, body: Callable[["Scope"], list[str]]) -> list[str]:
        """``for`` loops over ``vars_`` (outermost first) around ``body(innermost scope)``; each
        loop's scope declares its var, so a value lands in the outermost loop it needs."""
        scopes = [parent]
        for v in vars_:
            scopes.append(Scope(self, parent.names, scopes[-1], declares=[v.name]))
        lines = body(scopes[-1])
        for v, r, scope in reversed(list(zip(vars_, ranges, scopes[1:]))):
            block: list[str] = []
            append_block(block, f"for ({self.index_type} {v.name} = 0; {v.name} < {self.render_index(r)}; "
                                f"++{v.name})", scope.lines + lines)
            lines = block
        return lines

    def serial_reduction(self, kernel: ScheduledKernel, names: "LocalNames") -> list[str]:
        """One output row (``xindex``) after the other: a pass over ``rindex`` per group of
        reductions (``reduction_passes``), then the stores indexed by ``r`` (a last pass),
        then those indexed by ``x`` only::

            for (int64_t xindex = 0; xindex < s0; ++xindex) {
              const int64_t x0 = xindex;
              float rd0_a0 = 0;
              for (int64_t rindex = 0; rindex < 67; ++rindex) {
                const int64_t r0 = rindex;
                const float tmp0 = in_ptr0[67*x0 + r0];
                fx_sum_upd_float(&rd0_a0, tmp0);
              }
              out_ptr0[x0] = rd0_a0;
            }
        """
        xv, rv = self.xvars(kernel), self.rvars(kernel)
        if not rv:
            raise EmitError(f"kernel {kernel.name} has reductions but no reduction_ranges (target {self.target_name})")
        it = self.index_type
        accs = [ReductionAccumulator(self, i, r) for i, r in enumerate(kernel.reductions)]
        r_stores, x_stores = split_stores(kernel.stores, rv)
        fn = Scope(self, names, None, kernel=kernel)
        row = Scope(self, names, fn, declares=[v.name for v in xv])
        r_loop = f"for ({it} rindex = 0; rindex < {self.numel(kernel.reduction_ranges)}; ++rindex)"
        body = self.decompose("xindex", xv, kernel.ranges, names)

        def over_r(statements: Callable[[Scope], list[str]]) -> list[str]:
            inner = Scope(self, names, row, declares=[v.name for v in rv])
            loop = self.decompose("rindex", rv, kernel.reduction_ranges, names)
            done = statements(inner)
            inner.flush_into(loop)
            return loop + done

        for p in reduction_passes(kernel, accs):
            loop = over_r(lambda inner: [r.upd(r.names("a"), r.value(inner), "rindex") for r in p])
            row.flush_into(body)
            body += [f"{t} {a} = {init};" for r in p for (t, init), a in zip(r.states, r.names("a"))]
            append_block(body, r_loop, loop)
            for r in p:
                body += r.finish(r.names("a"))
                r.bind(row, r.names("a"))
        if r_stores:
            loop = over_r(lambda inner: self.render_stores(kernel, r_stores, inner))
            row.flush_into(body)
            append_block(body, r_loop, loop)
        if x_stores:
            stores = self.render_stores(kernel, x_stores, Scope(self, names, row))
            row.flush_into(body)
            body += stores
        return fn.lines + self.over_rows(self.numel(kernel.ranges), body)

    def serial_scan(self, kernel: ScheduledKernel, names: "LocalNames") -> list[str]:
        """One row after the other, each a pass over ``r0`` (``scan_pass``)."""
        fn = Scope(self, names, None, kernel=kernel)
        xv = self.xvars(kernel)
        row = Scope(self, names, fn, declares=[v.name for v in xv])
        head, update, _ = self.scan_pass(kernel, names, row)
        rv = self.rvars(kernel)[0].name
        body = self.decompose("xindex", xv, kernel.ranges, names)
        row.flush_into(body)
        body += head
        append_block(body, f"for ({self.index_type} {rv} = 0; {rv} < {self.render_index(kernel.reduction_ranges[0])}; "
                           f"++{rv})", update)
        return fn.lines + self.over_rows(self.numel(kernel.ranges), body)

    def scan_pass(self, kernel: ScheduledKernel, names: LocalNames, row: Scope):
        """``(state declarations, loop body)`` of one row's pass over ``r0``: the running
        states of every scan of ``kernel`` (``ScanState``) declared in ``row``, the body
        computing each scanned value, updating the states, then storing."""
        if len(kernel.reduction_ranges) != 1:
            raise EmitError(f"scan kernel {kernel.name}: {len(kernel.reduction_ranges)} scanned dims "
                            f"(target {self.target_name})")
        rv = self.rvars(kernel)[0]
        inner = Scope(self, names, row, declares=[rv.name])
        states = [ScanState(self, i, red) for i, red in enumerate(kernel.reductions)]
        head = [f"{t} {n} = {init};" for st in states for (t, init), n in zip(st.states, st.names())]
        update: list[str] = []
        for st in states:
            v = st.value(inner)
            inner.flush_into(update)
            update.append(st.upd(v, rv.name))
        for st in states:
            st.bind(inner)
        update += self.render_stores(kernel, kernel.stores, inner)
        return head, update, inner

    # ------------------------------------------------------------------ pieces
    def check(self, kernel: ScheduledKernel) -> None:
        for red in kernel.reductions:
            if red.kind not in REDUCTIONS and not (red.is_scan and self.renders_scans):
                raise EmitError(f"reduction kind {red.kind!r} of kernel {kernel.name} is not one of "
                                f"{sorted(REDUCTIONS)} (target {self.target_name})")
        names = [b.name for b in kernel.inputs] + [b.name for b in kernel.outputs]
        for name in names:
            if not isinstance(name, str):
                raise EmitError(f"kernel {kernel.name}: buffer name {name!r} is not a string")

    def function_name(self, kernel: ScheduledKernel) -> str:
        return kernel_function_name(kernel)

    def header_comment(self, kernel: ScheduledKernel) -> list[str]:
        return kernel_header(kernel, self.comment)

    def signature(self, kernel: ScheduledKernel) -> tuple[KernelArg, ...]:
        """Arguments in call order: inputs, outputs (``inout`` if also an input), sizes."""
        return kernel_signature(kernel)

    def function_head(self, kernel: ScheduledKernel, cname: str) -> str:
        params = self.params(kernel)
        qual = f"{self.kernel_qualifier} " if self.kernel_qualifier else ""
        return f"{qual}void {cname}({', '.join(params)})"

    def in_place_pairs(self, kernel: ScheduledKernel) -> tuple[tuple[str, str], ...]:
        """``(input, output)`` buffer names the memory planner may give one storage
        (``launch.in_place``, read by ``CallKernel.in_place_pairs``): the kernel's own
        ``in_place_pairs`` where this emitter ``writes_in_place``, else none."""
        return kernel.in_place_pairs() if self.writes_in_place else ()

    def params(self, kernel: ScheduledKernel) -> list[str]:
        in_names = [b.name for b in kernel.inputs]
        out_names = [b.name for b in kernel.outputs]
        aliased = set(in_names) & set(out_names)
        aliased |= {name for pair in self.in_place_pairs(kernel) for name in pair}
        aliased.update(kernel.shared_storage)
        params = []
        for i, buf in enumerate(kernel.inputs):
            params.append(self.pointer_param(f"in_ptr{i}", buf.dtype, const=True,
                                             restrict=buf.name not in aliased, index=len(params)))
        for i, buf in enumerate(kernel.outputs):
            params.append(self.pointer_param(f"out_ptr{i}", buf.dtype, const=False,
                                             restrict=buf.name not in aliased, index=len(params)))
        for name, ws in getattr(self, "workspaces", ()):
            params.append(self.pointer_param(name, ws.dtype, const=False, restrict=True, index=len(params)))
        for sym in kernel.size_symbols:
            params.append(self.size_param(self.symbol_name(sym), index=len(params)))
        params += list(self.extra_params)
        return params

    def pointer_param(self, name: str, dtype: torch.dtype, const: bool, restrict: bool,
                      index: int) -> str:
        cq = self.const_qualifier if const else ""
        rq = f" {self.restrict_qualifier}" if restrict and self.restrict_qualifier else ""
        return f"{self.buffer_qualifier}{cq}{self.storage_type(dtype)}*{rq} {name}"

    def size_param(self, name: str, index: int) -> str:
        return f"{self.size_param_type} {name}"

    def symbol_name(self, sym: sympy.Symbol) -> str:
        name = sym.name
        if not _IDENT.match(name) or re.match(rf"^(tmp|in_ptr|out_ptr|rd|xi|rl|fx_|{re.escape(self.prefix)})", name):
            raise EmitError(f"size symbol {name!r} cannot be a {self.language} parameter name "
                            f"(target {self.target_name}); rename it in the ShapeEnv mapping")
        return name

    # ------------------------------------------------------------------ loops helpers
    def xvars(self, kernel: ScheduledKernel) -> list[sympy.Symbol]:
        return [xvar(i) for i in range(len(kernel.ranges))]

    def rvars(self, kernel: ScheduledKernel) -> list[sympy.Symbol]:
        return [rvar(i) for i in range(len(kernel.reduction_ranges))]

    def numel(self, ranges) -> str:
        return self.render_index(sympy.Mul(*[sympy.sympify(r) for r in ranges])) if ranges else "1"

    def decompose(self, linear: str, vars_, ranges, names: "LocalNames") -> list[str]:
        """Row-major ``linear`` index -> one ``const`` per var (last var fastest)."""
        it = self.index_type
        if not vars_:
            return []
        if len(vars_) == 1:
            return [f"const {it} {vars_[0].name} = {linear};"]
        lines = []
        rest = names.fresh("q")
        lines.append(f"{it} {rest} = {linear};")
        for i in range(len(vars_) - 1, 0, -1):
            size = self.render_index(ranges[i])
            size = size if _IDENT.match(size) or size.isdigit() else f"({size})"  # an operand of % and /
            lines.append(f"const {it} {vars_[i].name} = {rest} % {size};")
            lines.append(f"{rest} = {rest} / {size};")
        lines.append(f"const {it} {vars_[0].name} = {rest};")
        return lines

    # ------------------------------------------------------------------ stores / values
    def buffer_pointers(self, kernel: ScheduledKernel) -> tuple[dict, dict]:
        """``(loads, stores)``: buffer name -> (pointer name, dtype)."""
        loads: dict[str, tuple[str, torch.dtype]] = {}
        stores: dict[str, tuple[str, torch.dtype]] = {}
        for i, b in enumerate(kernel.outputs):
            stores.setdefault(b.name, (f"out_ptr{i}", b.dtype))
            loads.setdefault(b.name, (f"out_ptr{i}", b.dtype))
        for i, b in enumerate(kernel.inputs):
            loads[b.name] = (f"in_ptr{i}", b.dtype)
        return loads, stores

    def render_stores(self, kernel: ScheduledKernel, stores, scope: "Scope") -> list[str]:
        """Statements writing ``stores``; their values are rendered into ``scope``."""
        _, pointers = scope.pointers()
        out = []
        for st in stores:
            if st.buffer not in pointers:
                raise EmitError(f"kernel {kernel.name} stores to {st.buffer!r}, which is not one of "
                                f"its outputs {[b.name for b in kernel.outputs]}")
            ptr, dtype = pointers[st.buffer]
            # an accumulating store adds the value rounded to the buffer's dtype, as eager does
            node = st.value if st.mode == "add" else self.stored_value(st.value, dtype)
            value = self.render_cast(scope.value(node), st.value.dtype, dtype)
            # an indexed store's offset is an integer local of the kernel (as an indirect load's)
            offset = scope.value(st.index) if st.indexed else self.render_index(st.index)
            scope.flush_into(out)
            if st.mode == "add":
                out.append(self.render_accumulate(f"{ptr}[{offset}]", value, dtype))
                continue
            # the local holds a value of the buffer's dtype: a 16-bit one, or a float32 one
            # that is exactly one (relu of a rounded value: holds_exact)
            exact = node.dtype == dtype or holds_exact(node, dtype)
            out.append(f"{ptr}[{offset}] = {self.to_storage(value, dtype, exact)};")
        return out

    def render_accumulate(self, cell: str, value: str, dtype: torch.dtype) -> str:
        """``cell += value`` for a store with ``mode="add"`` (``value`` a local of ``dtype``'s
        compute type); a 16-bit element is read, added in float and rounded back, as eager's
        CPU kernel does.  Whole only where the emitter runs such a kernel's iterations one
        after another (the C++ emitter does); a grid emitter needs its own atomic form::

            out_ptr0[tmp4] += tmp5;
            out_ptr0[tmp4] = fx_float_to_bf16(fx_bf16_to_float(out_ptr0[tmp4]) + tmp5);
        """
        if dtype in self.half_types:
            return f"{cell} = {self.to_storage(f'{self.from_storage(cell, dtype)} + {value}', dtype)};"
        return f"{cell} += {value};"

    def stored_value(self, value: Op, dtype: torch.dtype) -> Op:
        """The node whose local a store of ``value`` into a ``dtype`` buffer converts:
        ``value`` itself, or, where ``value`` is the float32 -> 16-bit ``cast`` to ``dtype``,
        its float operand -- the store's own conversion (``to_storage``) is that same
        rounding, and the rounded local is rendered only if something else reads it::

            out_ptr0[x0] = fx_float_to_bf16(tmp12);   // not fx_float_to_bf16(fx_bf16_round(tmp12))
        """
        if (value.op == OpCode.CAST and value.dtype == dtype and dtype in self.half_types
                and value.src[0].dtype == torch.float32):
            return value.src[0]
        return value

    def to_storage(self, value: str, dtype: torch.dtype, exact: bool = False) -> str:
        """``value`` (a local) as ``dtype``'s storage type; ``exact``: the local already holds
        a value of ``dtype`` (a 16-bit float then needs no rounding: ``exact_half_stores``)::

            out_ptr0[x0] = fx_float_to_bf16(tmp3);   // tmp3 = tmp1 * tmp2, a float32 product
            out_ptr0[x0] = fx_bf16_bits(tmp4);       // tmp4 = fx_max(tmp3, 0.0f), tmp3 rounded
        """
        if exact and dtype in self.exact_half_stores:
            return f"{self.exact_half_stores[dtype]}({value})"
        if dtype in self.half_types:
            return f"{self.half_types[dtype][1]}({value})"
        return value

    def from_storage(self, value: str, dtype: torch.dtype) -> str:
        if dtype in self.half_types:
            return f"{self.half_types[dtype][0]}({value})"
        return value

    def render_load(self, op: Op, scope: "Scope") -> str:
        name, index = load_buffer(op), load_index(op)
        loads, _ = scope.pointers()
        if name not in loads:
            raise EmitError(f"load of {name!r}: not an input or output of kernel "
                            f"{scope.kernel_name} (target {self.target_name})")
        ptr, dtype = loads[name]
        # an indirect index is an integer local of the kernel (declared before the load)
        offset = scope.value(index) if is_indirect(index) else self.render_index(index)
        expr = self.from_storage(f"{ptr}[{offset}]", dtype)
        expr = self.render_cast(expr, dtype, op.dtype)
        if load_mask(op) is not None and load_mask(op) not in scope.known_true:
            # a masked load reads nothing where its mask is false
            mask = scope.value(load_mask(op))
            expr = f"{mask} ? {expr} : {self.value_of(self.ctype(op.dtype), 0)}"
        return expr

    def render_const(self, value, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return "true" if value else "false"
        if dtype.is_floating_point:
            v = float(value)
            if dtype in self.half_types:  # a bf16/fp16 constant is a value of that type
                v = torch.tensor(v, dtype=dtype).item()
            if math.isnan(v):
                return self.nan
            if math.isinf(v):
                return self.infinity if v > 0 else f"-{self.infinity}"
            if compute_dtype(dtype) == torch.float32:
                return self._float32_literal(v)
            text = repr(v)
            return text if any(c in text for c in ".en") else text + ".0"
        if dtype.is_complex:
            raise EmitError(f"complex constant {value!r} on target {self.target_name}")
        return self.int_literal(int(value), dtype)

    @staticmethod
    def _float32_literal(v: float) -> str:
        f = struct.unpack("f", struct.pack("f", v))[0]
        for digits in range(1, 10):  # the shortest decimal that reads back as the same float
            text = f"{f:.{digits}g}"
            if struct.unpack("f", struct.pack("f", float(text)))[0] == f:
                break
        if not any(c in text for c in ".en"):
            text += ".0"
        return text + "f"

    def int_literal(self, v: int, dtype: torch.dtype = torch.int64) -> str:
        """``v`` as a C literal: plain within 32 bits, else with the dialect's 64-bit
        suffix (``long_suffix``; ``unsigned_long_suffix`` past int64)."""
        if v == -(2 ** 63):
            return f"(-9223372036854775807{self.long_suffix} - 1)"
        if v >= 2 ** 63:
            return f"{v}{self.unsigned_long_suffix}"
        return str(v) if -(2 ** 31) <= v < 2 ** 31 else f"{v}{self.long_suffix}"

    def render_cast(self, x: str, src: torch.dtype, dst: torch.dtype) -> str:
        """``x`` (a local of ``src``) as a local of ``dst``, converted as PyTorch does
        (``c10::convert``); a ``cast`` to bf16/fp16 is the rounding."""
        if src == dst:
            return x
        cdst = compute_dtype(dst)
        if dst == torch.bool:
            return f"({x} != 0)"
        if dst in self.half_types:
            # torch goes through float: double -> float -> bf16 rounds twice, like c10
            inner = x if compute_dtype(src) == torch.float32 else self.render_c_cast(self.ctype(torch.float32), x)
            return f"{self.half_types[dst][2]}({inner})"
        if src.is_floating_point and not cdst.is_floating_point:
            # float -> integer truncates; through int64 like c10 (defined for unsigned targets)
            i64 = self.render_c_cast(self.ctype(torch.int64), x)
            return i64 if cdst == torch.int64 else self.render_c_cast(self.ctype(cdst), i64)
        if self.ctype(src) == self.ctype(dst):
            return x
        return self.render_c_cast(self.ctype(dst), x)

    def render_op(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        """The C expression of ``op`` over already-rendered argument locals; the kernel is
        legalized, so the operands already have the dtype ``op`` is computed in."""
        name = op.op
        if name == OpCode.CAST:
            if op.dtype in self.exact_half_stores and holds_exact(op.src[0], op.dtype):
                return args[0]  # the rounding of a value it holds exactly: nothing to round
            return self.render_cast(args[0], arg_dtypes[0], op.dtype)
        if name == OpCode.INTRINSIC:
            return self.render_intrinsic(op, args, arg_dtypes)
        fn = self.code_for_op.get(name)
        if fn is None:
            raise EmitError(f"op {name!r} ({op.dtype}) has no rendering on target {self.target_name}; "
                            f"add it to {type(self).__name__}.code_for_op")
        dtype = compute_dtype(arg_dtypes[-1] if name in BOOL_RESULT else op.dtype)  # comparisons: the operands' type
        if (why := illegal(name, op.dtype, arg_dtypes)) is not None:
            raise EmitError(f"{why} (target {self.target_name})")
        return fn(*args, dtype=dtype)

    def render_intrinsic(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        """A node of the target's own op (``fxwrap.ir.intrinsics``) through the spelling its
        declaration in ``intrinsics`` gives: ``intrinsic.f32 my_gelu(%1)`` -> ``my_gelu(tmp1)``."""
        declared = {i.name: i for i in self.intrinsics}.get(op.arg)
        if declared is None:
            raise EmitError(f"op intrinsic {op.arg!r} ({op.dtype}) is not declared by target {self.target_name}; "
                            f"add an fxwrap.Intrinsic named {op.arg!r} to {type(self).__name__}.intrinsics")
        if (why := illegal(OpCode.INTRINSIC, op.dtype, arg_dtypes)) is not None:
            raise EmitError(f"{why} (target {self.target_name})")
        if op.dtype not in declared.dtypes or len(args) != declared.operands:
            raise EmitError(f"intrinsic {op.arg!r} of target {self.target_name} takes {declared.operands} "
                            f"operand(s) of {[str(d) for d in declared.dtypes]}, got {len(args)} of {op.dtype}")
        return declared.render(args, self.ctype(op.dtype))

    # ------------------------------------------------------------------ the value walk's hooks
    def value_home(self, scope: "Scope", op: Op) -> "Scope":
        return scope.home(op)

    def value_acc(self, home: "Scope", op: Op) -> tuple[str, bool]:
        expr, dtype = Scope._acc_binding(home, op)
        if dtype == op.dtype and _IDENT.match(expr):
            return expr, True
        return self.render_cast(expr, dtype, op.dtype), False

    def value_load(self, home: "Scope", op: Op) -> str:
        return self.render_load(op, home)

    def value_const(self, op: Op) -> str:
        return self.render_const(op.arg, op.dtype)

    def value_index(self, op: Op) -> str:
        return self.render_cast(self.render_index(op.arg), torch.int64, op.dtype)

    def value_op(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        return self.render_op(op, args, arg_dtypes)

    def value_local(self, home: "Scope") -> str:
        return home.names.fresh("tmp")

    def value_declaration(self, name: str, dtype: torch.dtype, expr: str) -> str:
        return f"const {self.ctype(dtype)} {name} = {expr};"

    # ------------------------------------------------------------------ templates
    def template_epilogue(self, kernel: ScheduledKernel, parent: "Scope", accumulator: str) -> list[str]:
        """The statements that store template kernel ``kernel``'s epilogue at one output
        element: ``kernel.stores`` with ``template_out`` read as the C expression
        ``accumulator`` (``acc[i][j]``).  The template declares the loop variables of
        ``kernel.template.index`` (``const int64_t x0 = m0 + i;``) just before them; values
        that need none of them (constants) are declared in ``parent`` (or above), values
        that need them in the returned lines.  ``bias[x1] + acc`` then ``relu``::

            const float tmp1 = in_ptr2[x1];
            const float tmp2 = tmp1 + acc[i][j];
            const float tmp3 = fx_max(tmp2, tmp0);
            out_ptr0[3072*x0 + x1] = tmp3;
        """
        inner = Scope(self, parent.names, parent, declares=[v.name for v in kernel.template.index], kernel=kernel)
        for node in accumulators(kernel):
            inner.env[node] = (accumulator, node.dtype)
        return self.render_stores(kernel, kernel.stores, inner)

    def template_source(self, kernel: ScheduledKernel, body: list[str], helpers: str = "",
                        in_place: tuple = ()) -> KernelSource:
        """A template kernel's ``KernelSource``: this emitter's header comment, headers,
        prelude, the template's ``helpers`` (C++ functions it calls) and the kernel's usual
        signature (``function_head``: inputs -- the call's operands first --, outputs, size
        symbols) around ``body``, with the launch metadata ``load`` expects; so a template
        loads, caches and saves like a generated kernel.  A template takes no workspace:
        the workspaces of the kernel rendered before it are not its parameters.  A combo
        kernel (``cstyle_combo``) is rendered through it too, with its ``in_place`` pairs."""
        self.workspaces = []
        cname = self.function_name(kernel)
        text = "\n".join([
            *self.header_comment(kernel),
            *self.headers,
            self.prelude.strip("\n"),
            helpers.strip("\n"),
            "",
            self.function_head(kernel, cname),
            "{",
            *("  " + line if line else "" for line in body),
            "}",
            "",
        ])
        launch = self.launch_record(kernel, symbol=cname, language=self.language,
                                    pointers=len(kernel.inputs) + len(kernel.outputs),
                                    size_symbols=tuple(s.name for s in kernel.size_symbols), in_place=in_place)
        return KernelSource(kernel.name, text, self.language, self.signature(kernel), launch)

    # ------------------------------------------------------------------ index printer
    def render_index(self, expr) -> str:
        """A sympy integer expression as ``index_type`` C arithmetic."""
        text = _CIndexPrinter(self).expr(sympy.sympify(expr))
        return text[1:-1] if _outer_parens(text) else text


class _CIndexPrinter(SympyIndexPrinter):
    """C spellings of the shared index walk: every compound is parenthesised (the
    outermost pair is dropped where the text is a whole argument); literals and size
    symbols come from the emitter (``int_literal``, ``symbol_name``)."""

    error = EmitError
    and_op, or_op = "&&", "||"
    pow_error = "a non-natural power"

    def __init__(self, emitter: CStyleEmitter):
        self.em = emitter
        self.max_fn, self.min_fn = emitter.prefix + "imax", emitter.prefix + "imin"

    @property
    def target_name(self) -> str:
        return self.em.target_name

    def int_literal(self, v: int) -> str:
        return self.em.int_literal(v)

    def symbol(self, e: sympy.Symbol) -> str:
        return e.name if is_loop_var(e) else self.em.symbol_name(e)

    def arg(self, e) -> str:
        text = self.expr(e)
        return text[1:-1] if _outer_parens(text) else text

    def operand(self, e) -> str:
        return self.expr(e)

    def group(self, text: str) -> str:
        return f"({text})"

    def add_term(self, t, first: bool) -> str:
        text = self.expr(t)  # products bind tighter than +/-: no parentheses needed
        return text[1:-1] if isinstance(t, sympy.Mul) and _outer_parens(text) else text

    def exact_div(self, num, q: int) -> str:
        return f"({self.expr(num)} / {self.em.int_literal(q)})"

    def product(self, e, coeff, rest) -> str:
        factors = [self.expr(f) for f in e.as_ordered_factors()]
        if factors[0] == "-1":
            return f"(-{'*'.join(factors[1:])})"
        return f"({'*'.join(factors)})"

    def power(self, base, n: int) -> str:
        if n == 0:
            return "1"
        b = self.expr(base)
        return f"({'*'.join([b] * n)})"

    def symbolic_power(self, e, base, exp) -> str:
        return self.em.helper("ipow_index", self.arg(base), self.arg(exp))

    def div(self, a, b) -> str:
        return f"({self.expr(a)} / {self.expr(b)})"

    def quotient(self, a, b) -> str:
        return self.div(a, b)

    def mod(self, a_text: str, b) -> str:
        return f"({a_text} % {self.expr(b)})"

    def ceildiv(self, a, b) -> str:
        return f"(({self.expr(a)} + {self.expr(b)} - 1) / {self.expr(b)})"

    def negate(self, text: str) -> str:
        return f"(-{text})"

    def floordiv_call(self, a_text: str, b_text: str) -> str:
        return self.em.helper("ifloordiv", a_text, b_text)

    def mod_call(self, a_text: str, b_text: str) -> str:
        return self.em.helper("imod", a_text, b_text)

    def where(self, c, a, b) -> str:
        return f"({self.expr(c)} ? {self.expr(a)} : {self.expr(b)})"

    def logical_not(self, a) -> str:
        return f"(!{self.expr(a)})"


def _outer_parens(text: str) -> bool:
    """True when ``text`` is one parenthesised group: ``(a + b)`` but not ``(a) + (b)``."""
    if not (text.startswith("(") and text.endswith(")")):
        return False
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(text) - 1:
            return False
    return True


class LocalNames:
    """Fresh, deterministic local names for one kernel."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        n = self.counts.get(prefix, 0)
        self.counts[prefix] = n + 1
        return f"{prefix}{n}"


class Scope:
    """A C block that values can be declared in.

    Scopes nest like the loops: the function, then (say) a row of a reduction, then
    the innermost loop body.  ``value(op)`` declares ``op`` (and its operands) in the
    *outermost* enclosing scope where everything it depends on (loop vars, reduction
    results) is declared, so loop invariants are hoisted out of inner loops for free.
    Declarations land in ``lines`` of their scope at the point the scope has reached;
    build inner code first, then append it to the outer scope's text.
    """

    def __init__(self, emitter: CStyleEmitter, names: LocalNames, parent: "Scope | None",
                 declares=(), kernel: ScheduledKernel | None = None):
        self.emitter = emitter
        self.names = names
        self.parent = parent
        self.kernel = kernel if kernel is not None else (parent.kernel if parent else None)
        self.declared: set = set(declares)
        self.env: dict[Op, tuple[str, torch.dtype]] = {}
        self.lines: list[str] = []
        self.accs: dict[tuple[str, int], tuple[str, torch.dtype]] = {}
        self._deps_cache = parent._deps_cache if parent else {}
        self._ptrs = parent._ptrs if parent else None
        # masks that hold wherever this block runs (the emitter tested them before it): a load
        # declared here under one of them reads unconditionally (``CppEmitter.pointwise``)
        self.known_true: frozenset[Op] = frozenset()

    @property
    def kernel_name(self) -> str:
        return self.kernel.name if self.kernel is not None else "?"

    def pointers(self):
        if self._ptrs is None:
            self._ptrs = self.emitter.buffer_pointers(self.kernel)
        return self._ptrs

    def bind_acc(self, name: str, field: int, expr: str, dtype: torch.dtype) -> None:
        """Make ``Op.acc(name, field, _)`` read ``expr`` (of ``dtype``) in this scope."""
        self.accs[(name, field)] = (expr, dtype)
        self.declared.add(("acc", name))

    def flush_into(self, out: list[str]) -> None:
        """Move this scope's pending declarations to ``out`` (keeps statement order)."""
        out.extend(self.lines)
        self.lines.clear()

    def chain(self) -> list["Scope"]:
        scopes, s = [], self
        while s is not None:
            scopes.append(s)
            s = s.parent
        return scopes[::-1]  # outermost first

    def deps(self, op: Op) -> frozenset:
        return value_deps(op, self._deps_cache)

    def lookup(self, op: Op):
        s = self
        while s is not None:
            if op in s.env:
                return s.env[op]
            s = s.parent
        return None

    def home(self, op: Op) -> "Scope":
        need = set(self.deps(op))
        have: set = set()
        for s in self.chain():
            have |= s.declared
            if need <= have:
                return s
        missing = sorted(map(str, need - have))
        raise EmitError(f"kernel {self.kernel_name}: value {op.op} needs {missing}, which are not "
                        "available where it is used (a store's index must use the r vars its value "
                        "uses; an acc may only be read after its reduction)")

    def value(self, op: Op) -> str:
        """The C local holding ``op`` (declared on first use, operands first: the emitter's
        ``ValueWalker.value``, the walk every target shares)."""
        return self.emitter.value(self, op)

    @staticmethod
    def _acc_binding(home: "Scope", op: Op):
        key = acc_key(op)
        s = home
        while s is not None:
            if key in s.accs:
                return s.accs[key]
            s = s.parent
        raise EmitError(f"kernel {home.kernel_name}: acc {key} is read before reduction "
                        f"{key[0]!r} has a result (or the field does not exist)")


def c_operand(text: str) -> str:
    """C expression ``text`` safe as an operand of ``*``, ``/``, ``%``, ``-`` or a comparison:
    parenthesised unless a name or a literal."""
    t = text.strip()
    return t if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+(LL|ULL)?", t) else f"({t})"


def append_block(lines: list[str], head: str, body: list[str]) -> None:
    """Append ``head { body }`` to ``lines``, the body indented."""
    lines.append(head + " {")
    lines.extend("  " + ln if ln else ln for ln in body)
    lines.append("}")


def reduction_passes(kernel: ScheduledKernel, accs: list["ReductionAccumulator"]) -> list[list["ReductionAccumulator"]]:
    """The reductions of ``kernel`` (their ``accs``, in order) as passes over the reduction
    range: a reduction that reads an earlier one's ``acc`` (softmax's sum of ``exp(x - max)``)
    starts a new pass, the others join the last one."""
    by_name = {r.red.name: r for r in accs}
    if len(by_name) != len(accs):
        raise EmitError(f"kernel {kernel.name}: two reductions share a name")
    passes: list[list[ReductionAccumulator]] = []
    for r in accs:
        reads = {acc_key(n)[0] for n in walk(r.red.value) if n.op == OpCode.ACC}
        for name in sorted(reads):
            if name not in by_name or by_name[name].k >= r.k:
                raise EmitError(f"kernel {kernel.name}: reduction {r.red.name} reads acc "
                                f"{name!r}, which is not an earlier reduction of the kernel")
        if passes and not reads & {p.red.name for p in passes[-1]}:
            passes[-1].append(r)
        else:
            passes.append([r])
    return passes


class ScanState:
    """One scan's running state in C-family source (``fxwrap.ir.loops.SCANS``): declared
    per row, updated once per ``r`` (``cumsum``: ``sc0_s0 = sc0_s0 + tmp3;``), read by the
    stores after the update as the scan's ``acc``.  bf16/fp16 run in float, and a sum,
    product or logcumsumexp in the emitter's ``scan_accumulate`` dtype where it has one
    (C++: float32 in double; the ``acc`` is the state converted, rounded once); the
    prelude's ``logcumsumexp_upd`` / ``cummax_upd`` / ``cummin_upd`` (``HELPERS["scans"]``)
    follow eager's CPU kernels (NaN propagates; cummax/cummin: ties and NaNs take the later
    index)."""

    def __init__(self, em: "CStyleEmitter", k: int, red: Reduction):
        self.em, self.red, self.kind = em, red, red.kind
        self.base = f"sc{k}"
        T = em.ctype(red.dtype)
        self.T = T
        if self.kind in ("cummax", "cummin"):
            init = em.helper("lowest" if self.kind == "cummax" else "highest", type_name=T, generic=True)
            self.states = [(T, init), (em.ctype(torch.int64), "0")]
            self.fields = {0: (1, torch.int64), 1: (0, red.dtype)}
        else:
            acc = em.scan_accumulate.get(red.dtype, compute_dtype(red.dtype))
            T = self.T = em.ctype(acc)
            init = {"cumsum": "0", "cumprod": "1", "logcumsumexp": f"-{em.infinity}"}[self.kind]
            self.states = [(T, em.value_of(T, init) if init[0] != "-" else init)]
            self.fields = {0: (0, acc)}

    def names(self) -> list[str]:
        return [f"{self.base}_s{i}" for i in range(len(self.states))]

    def total_workspaces(self, numel, declare: str) -> tuple[list[str], list[str]]:
        """A split scan's chunk totals: lines declaring one workspace of ``numel`` elements
        per state (``declare``: the pointer's declaration, ``{t}`` its element type, e.g.
        ``"{t}* const"``), and the workspaces' names (``sc0_s0_w``)."""
        dtype_of = {name: dtype for dtype, name in self.em.type_names.items()}
        lines, names = [], []
        for (t, _), s in zip(self.states, self.names()):
            names.append(f"{s}_w")
            lines.append(f"{declare.format(t=t)} {s}_w = {self.em.workspace(numel, dtype_of[t])};")
        return lines, names

    def value(self, scope: "Scope") -> str:
        """The scanned value, in the state's dtype."""
        acc = self.fields[0][1] if len(self.fields) == 1 else self.red.dtype
        return self.em.render_cast(scope.value(self.red.value), self.red.value.dtype, acc)

    def upd(self, v: str, index: str, states: list[str] | None = None) -> str:
        """The statement folding value ``v`` at scan position ``index`` into the running
        state (``states``: the state expressions, default the locals of ``names()``)."""
        s = self.names() if states is None else states
        if self.kind == "cumsum":
            return f"{s[0]} = {s[0]} + {v};"
        if self.kind == "cumprod":
            return f"{s[0]} = {s[0]} * {v};"
        if self.kind == "logcumsumexp":
            return self.em.helper("logcumsumexp_upd", v, type_name=self.T, inout=(s[0],)) + ";"
        return self.em.helper(f"{self.kind}_upd", v, index, type_name=self.T, inout=(s[0], s[1]), generic=True) + ";"

    def combine(self, into: list[str], later: list[str]) -> str:
        """The statement folding the state ``later`` (of the elements after those ``into``
        has seen: a chunk's total) into ``into``.  Every scan's update is its combine
        with a one-element state (cummax: the later state's value and index), so the
        two are one statement."""
        return self.upd(later[0], later[1] if len(later) > 1 else "", into)

    def merge(self, into: list[str], other: list[str]) -> str:
        """Like ``combine``, where ``other`` may hold elements before ``into``'s (the lanes of
        one chunk: element ``j`` in lane ``j % lanes``): cummax/cummin compare indices
        (the C++ prelude's ``fx_cumextreme_merge``: only the C++ split scan merges lanes),
        the other scans commute."""
        if self.kind in ("cummax", "cummin"):
            flag = "true" if self.kind == "cummax" else "false"
            return self.em.helper("cumextreme_merge", other[0], other[1], type_name=f"{flag}, {self.T}",
                                  inout=(into[0], into[1]), generic=True) + ";"
        return self.combine(into, other)

    def bind(self, scope: "Scope", states: list[str] | None = None) -> None:
        names = self.names() if states is None else states
        for field, (i, dtype) in self.fields.items():
            scope.bind_acc(self.red.name, field, names[i], dtype)


class ReductionAccumulator:
    """One reduction's accumulator state and its update / combine statements, written once
    for every C dialect (``fx_sum_upd<float>(rd0_a0, tmp3);`` in C++,
    ``c99_sum_upd_float(&rd0_a0, tmp3);`` in C99); each kind is a row of ``KINDS``: its states
    (C type role, initial value), then the helpers of ``HELPERS["reductions"]`` that update a
    state with one value and combine two states.  The C++ schedule uses it as it is, the
    Metal one adds SIMD-group combines (``mps_metal.reduction.simd_combine``).

    States are named ``rd<k>_<tag><i>`` (``rd0_a0``); a reduction's ``acc`` fields read them
    (``bind``): field 0 is the result (argmax: the index; welford: the mean), then the others.
    """

    # kind -> initial values, by state: 'zero', 'one', 'false', 'true', 'lowest', 'highest',
    # 'value0' (0 of the value type), 'index' (-1) and 'count' (0, int64)
    KINDS: dict[str, tuple[str, ...]] = {
        "sum": ("zero",), "prod": ("one",), "max": ("lowest",), "min": ("highest",),
        "any": ("false",), "all": ("true",), "argmax": ("value0", "index"), "argmin": ("value0", "index"),
        "welford": ("zero", "zero", "count"),
    }
    # which state each acc field reads
    FIELDS: dict[str, tuple[int, ...]] = {"argmax": (1, 0), "argmin": (1, 0), "welford": (0, 1, 2)}

    def __init__(self, em: "CStyleEmitter", k: int, red: Reduction):
        self.em, self.k, self.red, self.kind = em, k, red, red.kind
        self.base = f"rd{k}"
        if red.kind not in self.KINDS:  # pragma: no cover - CStyleEmitter.check rejects it first
            raise EmitError(f"reduction kind {red.kind!r} (target {em.target_name})")
        vdt = red.value.dtype
        self.acc_dtype = torch.bool if red.kind in ("any", "all") else vdt if red.kind in ("argmax", "argmin") \
            else red.dtype
        T = self.T = em.ctype(self.acc_dtype)
        i64 = em.ctype(torch.int64)
        inits = {"zero": (T, "0"), "one": (T, "1"), "false": (T, "false"), "true": (T, "true"),
                 "lowest": (T, em.helper("lowest", type_name=T, generic=True)),
                 "highest": (T, em.helper("highest", type_name=T, generic=True)),
                 "value0": (T, em.value_of(T, 0)), "index": (i64, "-1"), "count": (i64, "0")}
        self.states = [inits[role] for role in self.KINDS[red.kind]]
        dtypes = [torch.int64 if role in ("index", "count") else self.acc_dtype for role in self.KINDS[red.kind]]
        self.fields = {f: (i, dtypes[i]) for f, i in enumerate(self.FIELDS.get(red.kind, (0,)))}
        self.flushable = red.kind == "sum" and self.acc_dtype.is_floating_point

    def names(self, tag: str) -> list[str]:
        return [f"{self.base}_{tag}{i}" for i in range(len(self.states))]

    def value(self, scope: Scope) -> str:
        v = scope.value(self.red.value)
        if self.kind in ("any", "all", "argmax", "argmin"):
            return v
        return self.em.render_cast(v, self.red.value.dtype, self.acc_dtype)

    def value_type(self) -> str:
        return self.em.ctype(self.red.value.dtype)

    def upd(self, st: list[str], v: str, idx: str) -> str:
        """The statement folding value ``v`` (at reduction index ``idx``) into states ``st``."""
        if self.kind in ("any", "all"):
            return self.em.helper(f"{self.kind}_upd", v, type_name=self.value_type(), inout=(st[0],),
                                  generic=True) + ";"
        args = (v, idx) if self.kind in ("argmax", "argmin") else (v,)
        return self.em.helper(f"{self.kind}_upd", *args, type_name=self.T, inout=tuple(st), generic=True) + ";"

    def cmb(self, a: list[str], b: list[str]) -> str:
        """The statement folding states ``b`` into states ``a`` (``b`` covers later indices)."""
        if self.kind == "any":
            return f"{a[0]} = {a[0]} || {b[0]};"
        if self.kind == "all":
            return f"{a[0]} = {a[0]} && {b[0]};"
        name = "welford_cmb" if self.kind == "welford" else f"{self.kind}_upd"
        return self.em.helper(name, *b, type_name=self.T, inout=tuple(a), generic=True) + ";"

    def finish(self, st: list[str]) -> list[str]:
        """Round 16-bit float results to their dtype (in place)."""
        if self.acc_dtype not in self.em.half_types or self.kind in ("argmax", "argmin"):
            return []
        rnd = self.em.half_types[self.acc_dtype][2]
        i64 = self.em.ctype(torch.int64)
        return [f"{s} = {rnd}({s});" for s, (t, _) in zip(st, self.states) if t != i64]

    def bind(self, scope: Scope, exprs: list[str]) -> None:
        for field, (i, dtype) in self.fields.items():
            scope.bind_acc(self.red.name, field, exprs[i], dtype)
