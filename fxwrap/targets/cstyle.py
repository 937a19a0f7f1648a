"""One emitter for the C family: C++ (``cpu_cpp``) and Metal (``mps_metal``) subclass it.

A subclass overrides only what differs, through class attributes (kernel qualifier,
pointer qualifiers, type names, thread indexing, barrier, prelude) and the one dict
``code_for_op`` of op renderings; the Op-DAG walk, the SSA locals, the sympy index
printer, loads, stores, casts and 16-bit float handling are shared.

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
                            is_loop_var, load_buffer, load_index, load_mask, rvar, value_deps, walk, xvar)
from fxwrap.core.numerics import compute_dtype, holds_exact, illegal
from fxwrap.core.templates import accumulators
from fxwrap.runtime.kernel import KernelArg
from fxwrap.targets.base import (KernelEmitter, KernelSource, Workspace, kernel_function_name, kernel_header,
                                  kernel_signature)
from fxwrap.targets.index_printer import SympyIndexPrinter


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _call(fn: str) -> Callable[..., str]:
    return lambda *args, dtype: f"{fn}({', '.join(args)})"


def _infix(op: str) -> Callable[..., str]:
    return lambda a, b, dtype: f"{a} {op} {b}"


def _is_bool(dtype: torch.dtype) -> bool:
    return dtype == torch.bool


# One rendering per op of fxwrap.ir.loops: argument strings (C locals, already of the op's
# compute type) -> a C expression.  Subclasses copy the dict and replace entries.
CSTYLE_OPS: dict[str, Callable[..., str]] = {
    # unary
    "neg": lambda x, dtype: f"!{x}" if _is_bool(dtype) else f"-{x}",
    "abs": _call("fx_abs"),
    "exp": _call("std::exp"), "exp2": _call("std::exp2"), "expm1": _call("std::expm1"),
    "log": _call("std::log"), "log2": _call("std::log2"), "log10": _call("std::log10"),
    "log1p": _call("std::log1p"), "sqrt": _call("std::sqrt"), "rsqrt": _call("fx_rsqrt"),
    "sin": _call("std::sin"), "cos": _call("std::cos"), "tan": _call("std::tan"),
    "asin": _call("std::asin"), "acos": _call("std::acos"), "atan": _call("std::atan"),
    "sinh": _call("std::sinh"), "cosh": _call("std::cosh"), "tanh": _call("std::tanh"),
    "asinh": _call("std::asinh"), "acosh": _call("std::acosh"), "atanh": _call("std::atanh"),
    "erf": _call("std::erf"), "erfc": _call("std::erfc"), "erfinv": _call("fx_erfinv"),
    "floor": _call("fx_floor"), "ceil": _call("fx_ceil"), "round": _call("fx_round"),
    "trunc": _call("fx_trunc"), "sigmoid": _call("fx_sigmoid"), "sign": _call("fx_sign"),
    "reciprocal": _call("fx_reciprocal"),
    "logical_not": lambda x, dtype: f"!{x}",
    "bitwise_not": lambda x, dtype: f"!{x}" if _is_bool(dtype) else f"~{x}",
    "isnan": _call("fx_isnan"), "isinf": _call("fx_isinf"), "signbit": _call("fx_signbit"),
    # binary
    "add": lambda a, b, dtype: f"{a} || {b}" if _is_bool(dtype) else f"{a} + {b}",
    "sub": lambda a, b, dtype: f"{a} != {b}" if _is_bool(dtype) else f"{a} - {b}",
    "mul": lambda a, b, dtype: f"{a} && {b}" if _is_bool(dtype) else f"{a} * {b}",
    "truediv": _infix("/"),
    "floordiv": _call("fx_floordiv"), "truncdiv": _call("fx_truncdiv"),
    "mod": _call("fx_mod"), "fmod": _call("fx_fmod"), "pow": _call("fx_pow"),
    "maximum": _call("fx_max"), "minimum": _call("fx_min"),
    "atan2": _call("std::atan2"), "copysign": _call("std::copysign"),
    "logical_and": lambda a, b, dtype: f"({a} != 0) && ({b} != 0)",
    "logical_or": lambda a, b, dtype: f"({a} != 0) || ({b} != 0)",
    "logical_xor": lambda a, b, dtype: f"({a} != 0) != ({b} != 0)",
    "bitwise_and": _infix("&"), "bitwise_or": _infix("|"), "bitwise_xor": _infix("^"),
    "lshift": _call("fx_lshift"), "rshift": _call("fx_rshift"),
    "lt": _infix("<"), "le": _infix("<="), "gt": _infix(">"), "ge": _infix(">="),
    "eq": _infix("=="), "ne": _infix("!="),
    # ternary
    "where": lambda c, a, b, dtype: f"{c} ? {a} : {b}",
}



class CStyleEmitter(KernelEmitter):
    """The shared C-family renderer; ``render(kernel) -> KernelSource``.

    Subclasses set the language options below and implement ``render_body`` (the
    loop nest or thread indexing around the values this class renders), or use the
    default one-thread-per-element ``render_body`` of grid targets (Metal) by setting
    ``thread_index``.
    """

    language = "c"
    comment = "//"
    headers: tuple[str, ...] = ()
    prelude: str = ""                       # helpers every kernel includes (fx_*)
    kernel_qualifier = ""                   # 'extern "C"' (C++), 'kernel' (Metal)
    buffer_qualifier = ""                   # address space of buffers: Metal 'device '
    const_qualifier = "const "              # read-only buffers
    restrict_qualifier = "__restrict__"     # '' where unsupported
    size_param_type = "const int64_t"       # Metal: 'constant int64_t&'
    index_type = "int64_t"
    extra_params: tuple[str, ...] = ()      # Metal: ('uint3 gid [[thread_position_in_grid]]',)
    thread_index: str | None = None         # grid targets: the global thread id expression
    barrier = ""                            # Metal: 'threadgroup_barrier(mem_flags::mem_threadgroup);'
    infinity = "INFINITY"
    renders_scans = False  # a subclass that renders scan kernels (``ScanState``) sets it
    # the program may write a kernel's output into an input's storage where the kernel
    # allows it (``ScheduledKernel.in_place_pairs``: those pointers lose ``restrict``)
    writes_in_place = False
    # the dtype a sum / product / logcumsumexp scan of a dtype runs in, where it is not the
    # dtype's compute dtype (C++: float32 in double, as eager's CPU kernels do)
    scan_accumulate: dict[torch.dtype, torch.dtype] = {}
    nan = "NAN"
    # storage type of each dtype (what pointers point to)
    type_names: dict[torch.dtype, str] = {
        torch.float32: "float", torch.float64: "double",
        torch.bfloat16: "fx_bf16", torch.float16: "fx_half",
        torch.int64: "int64_t", torch.int32: "int32_t", torch.int16: "int16_t",
        torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
        torch.uint16: "uint16_t", torch.uint32: "uint32_t", torch.uint64: "uint64_t",
    }
    # 16-bit floats, held in float locals: (storage -> float, float -> storage, round)
    half_types: dict[torch.dtype, tuple[str, str, str]] = {
        torch.bfloat16: ("fx_bf16_to_float", "fx_float_to_bf16", "fx_bf16_round"),
        torch.float16: ("fx_half_to_float", "fx_float_to_half", "fx_half_round"),
    }
    # 16-bit floats whose exact value a float local holds (a load, a rounding, an exact op
    # of them: ``EXACT_16BIT``) -> the function storing such a local without rounding it
    # again; a dtype not listed is stored through its rounding conversion (``half_types``)
    exact_half_stores: dict[torch.dtype, str] = {}
    code_for_op: dict[str, Callable[..., str]] = CSTYLE_OPS

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

    @property
    def target_name(self) -> str:
        return getattr(self.target, "name", None) or self.language

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
        launch = {"symbol": cname, "language": self.language,
                  "pointers": len(kernel.inputs) + len(kernel.outputs) + len(self.workspaces),
                  "size_symbols": tuple(s.name for s in kernel.size_symbols)}
        launch.update(self.launch_metadata(kernel))
        in_place = self.in_place_pairs(kernel)
        if in_place:
            launch["in_place"] = in_place
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

    def launch_metadata(self, kernel: ScheduledKernel) -> dict:
        return {}

    def render_body(self, kernel: ScheduledKernel, names: "LocalNames") -> list[str]:
        """Grid targets: one thread per element of ``ranges`` (no reductions)."""
        if self.thread_index is None:
            raise EmitError(f"{type(self).__name__} must implement render_body or set thread_index")
        if kernel.is_reduction or kernel.reduction_ranges:
            raise EmitError(f"{type(self).__name__}: reductions need a target-specific "
                            f"render_body (kernel {kernel.name})")
        xvars = self.xvars(kernel)
        fn = Scope(self, names, parent=None, kernel=kernel)
        out = [f"const {self.index_type} xindex = {self.thread_index};",
               f"if (xindex >= {self.numel(kernel.ranges)}) return;"]
        out += self.decompose("xindex", xvars, kernel.ranges, names)
        inner = Scope(self, names, parent=fn, declares=[v.name for v in xvars])
        stores = self.render_stores(kernel, kernel.stores, inner)
        return fn.lines + out + stores

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
        (``launch["in_place"]``, read by ``CallKernel.in_place_pairs``): the kernel's own
        ``in_place_pairs`` where this emitter ``writes_in_place``, else none."""
        return kernel.in_place_pairs() if self.writes_in_place else ()

    def params(self, kernel: ScheduledKernel) -> list[str]:
        in_names = [b.name for b in kernel.inputs]
        out_names = [b.name for b in kernel.outputs]
        aliased = set(in_names) & set(out_names)
        aliased |= {name for pair in self.in_place_pairs(kernel) for name in pair}
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
        if not _IDENT.match(name) or re.match(r"^(tmp|in_ptr|out_ptr|rd|xi|rl|fx_)", name):
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
        if load_mask(op) is not None:  # a masked load reads nothing where its mask is false
            mask = scope.value(load_mask(op))
            expr = f"{mask} ? {expr} : {self.ctype(op.dtype)}(0)"
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
        if v == -(2 ** 63):
            return "(-9223372036854775807LL - 1)"
        if v >= 2 ** 63:
            return f"{v}ULL"
        return str(v) if -(2 ** 31) <= v < 2 ** 31 else f"{v}LL"

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
            inner = x if compute_dtype(src) == torch.float32 else f"static_cast<float>({x})"
            return f"{self.half_types[dst][2]}({inner})"
        if src.is_floating_point and not cdst.is_floating_point:
            # float -> integer truncates; through int64 like c10 (defined for unsigned targets)
            if cdst == torch.int64:
                return f"static_cast<int64_t>({x})"
            return f"static_cast<{self.ctype(cdst)}>(static_cast<int64_t>({x}))"
        if self.ctype(src) == self.ctype(dst):
            return x
        return f"static_cast<{self.ctype(dst)}>({x})"

    def render_op(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        """The C expression of ``op`` over already-rendered argument locals; the kernel is
        legalized, so the operands already have the dtype ``op`` is computed in."""
        name = op.op
        if name == OpCode.CAST:
            if op.dtype in self.exact_half_stores and holds_exact(op.src[0], op.dtype):
                return args[0]  # the rounding of a value it holds exactly: nothing to round
            return self.render_cast(args[0], arg_dtypes[0], op.dtype)
        fn = self.code_for_op.get(name)
        if fn is None:
            raise EmitError(f"op {name!r} ({op.dtype}) has no rendering on target {self.target_name}; "
                            f"add it to {type(self).__name__}.code_for_op")
        dtype = compute_dtype(arg_dtypes[-1] if name in BOOL_RESULT else op.dtype)  # comparisons: the operands' type
        if (why := illegal(name, op.dtype, arg_dtypes)) is not None:
            raise EmitError(f"{why} (target {self.target_name})")
        return fn(*args, dtype=dtype)

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

    def template_source(self, kernel: ScheduledKernel, body: list[str], helpers: str = "") -> KernelSource:
        """A template kernel's ``KernelSource``: this emitter's header comment, headers,
        prelude, the template's ``helpers`` (C++ functions it calls) and the kernel's usual
        signature (``function_head``: inputs -- the call's operands first --, outputs, size
        symbols) around ``body``, with the launch metadata ``load`` expects; so a template
        loads, caches and saves like a generated kernel."""
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
        launch = {"symbol": cname, "language": self.language,
                  "pointers": len(kernel.inputs) + len(kernel.outputs),
                  "size_symbols": tuple(s.name for s in kernel.size_symbols)}
        launch.update(self.launch_metadata(kernel))
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
    max_fn, min_fn = "fx_imax", "fx_imin"
    and_op, or_op = "&&", "||"
    pow_error = "a non-natural power"

    def __init__(self, emitter: CStyleEmitter):
        self.em = emitter

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
        return f"fx_ipow_index({self.arg(base)}, {self.arg(exp)})"

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
        return f"fx_ifloordiv({a_text}, {b_text})"

    def mod_call(self, a_text: str, b_text: str) -> str:
        return f"fx_imod({a_text}, {b_text})"

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
        """The C local holding ``op`` (declared on first use, operands first)."""
        for node in walk(op):
            if self.lookup(node) is None:
                self._declare(node)
        return self.lookup(op)[0]

    def _declare(self, op: Op) -> None:
        em = self.emitter
        home = self.home(op)
        if op.op == OpCode.ACC:
            expr, dtype = self._acc_binding(home, op)
            if dtype == op.dtype and _IDENT.match(expr):
                home.env[op] = (expr, dtype)  # already a local: no copy
                return
            expr = em.render_cast(expr, dtype, op.dtype)
        elif op.op == OpCode.LOAD:
            expr = em.render_load(op, home)
        elif op.op == OpCode.CONST:
            expr = em.render_const(op.arg, op.dtype)
        elif op.op == OpCode.INDEX:
            expr = em.render_cast(em.render_index(op.arg), torch.int64, op.dtype)
        else:
            kids = [self.lookup(c) for c in op.src]
            expr = em.render_op(op, [k[0] for k in kids], [k[1] for k in kids])
        name = self.names.fresh("tmp")
        home.lines.append(f"const {em.ctype(op.dtype)} {name} = {expr};")
        home.env[op] = (name, op.dtype)

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


class ScanState:
    """One scan's running state in C-family source (``fxwrap.ir.loops.SCANS``): declared
    per row, updated once per ``r`` (``fx_cumsum``: ``sc0_s0 += tmp3;``), read by the
    stores after the update as the scan's ``acc``.  bf16/fp16 run in float, and a sum,
    product or logcumsumexp in the emitter's ``scan_accumulate`` dtype where it has one
    (C++: float32 in double; the ``acc`` is the state converted, rounded once); the
    prelude's ``fx_logcumsumexp_upd`` / ``fx_cummax_upd`` / ``fx_cummin_upd`` follow
    eager's CPU kernels (NaN propagates; cummax/cummin: ties and NaNs take the later
    index)."""

    def __init__(self, em: "CStyleEmitter", k: int, red: Reduction):
        self.em, self.red, self.kind = em, red, red.kind
        self.base = f"sc{k}"
        T = em.ctype(red.dtype)
        self.T = T
        if self.kind in ("cummax", "cummin"):
            init = f"fx_lowest<{T}>()" if self.kind == "cummax" else f"fx_highest<{T}>()"
            self.states = [(T, init), (em.ctype(torch.int64), "0")]
            self.fields = {0: (1, torch.int64), 1: (0, red.dtype)}
        else:
            acc = em.scan_accumulate.get(red.dtype, compute_dtype(red.dtype))
            T = self.T = em.ctype(acc)
            init = {"cumsum": "0", "cumprod": "1", "logcumsumexp": f"-{em.infinity}"}[self.kind]
            self.states = [(T, f"{T}({init})" if init[0] != "-" else init)]
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
            return f"fx_logcumsumexp_upd({s[0]}, {v});"
        return f"fx_{self.kind}_upd<{self.T}>({s[0]}, {s[1]}, {v}, {index});"

    def combine(self, into: list[str], later: list[str]) -> str:
        """The statement folding the state ``later`` (of the elements after those ``into``
        has seen: a chunk's total) into ``into``.  Every scan's update is its combine
        with a one-element state (cummax: the later state's value and index), so the
        two are one statement."""
        return self.upd(later[0], later[1] if len(later) > 1 else "", into)

    def merge(self, into: list[str], other: list[str]) -> str:
        """Like ``combine``, where ``other`` may hold elements before ``into``'s (the lanes of
        one chunk: element ``j`` in lane ``j % lanes``): cummax/cummin compare indices
        (``fx_cumextreme_merge``), the other scans commute."""
        if self.kind in ("cummax", "cummin"):
            flag = "true" if self.kind == "cummax" else "false"
            return f"fx_cumextreme_merge<{flag}, {self.T}>({into[0]}, {into[1]}, {other[0]}, {other[1]});"
        return self.combine(into, other)

    def bind(self, scope: "Scope", states: list[str] | None = None) -> None:
        names = self.names() if states is None else states
        for field, (i, dtype) in self.fields.items():
            scope.bind_acc(self.red.name, field, names[i], dtype)


class ReductionAccumulator:
    """One reduction's accumulator state and its update / combine statements in C-family
    source (``fx_sum_upd<float>(rd0_a0, tmp3);``); the C++ emitter uses it as it is, the Metal
    emitter subclasses it with Metal types and SIMD-group combines."""

    def __init__(self, em: "CStyleEmitter", k: int, red: Reduction):
        self.em, self.k, self.red, self.kind = em, k, red, red.kind
        self.base = f"rd{k}"
        vdt = red.value.dtype
        kind = red.kind
        if kind in ("any", "all"):
            self.acc_dtype = torch.bool
        elif kind in ("argmax", "argmin"):
            self.acc_dtype = vdt
        else:
            self.acc_dtype = red.dtype
        T = em.ctype(self.acc_dtype)
        self.T = T
        inits = {"sum": "0", "prod": "1", "max": f"fx_lowest<{T}>()", "min": f"fx_highest<{T}>()",
                 "any": "false", "all": "true"}
        if kind in inits:
            self.states = [(T, inits[kind])]
            self.fields = {0: (0, self.acc_dtype)}
        elif kind in ("argmax", "argmin"):
            self.states = [(T, f"{T}(0)"), ("int64_t", "-1")]
            self.fields = {0: (1, torch.int64), 1: (0, self.acc_dtype)}
        elif kind == "welford":
            self.states = [(T, "0"), (T, "0"), ("int64_t", "0")]
            self.fields = {0: (0, self.acc_dtype), 1: (1, self.acc_dtype), 2: (2, torch.int64)}
        else:  # pragma: no cover - CStyleEmitter.check rejects it first
            raise EmitError(f"reduction kind {kind!r}")
        self.flushable = kind == "sum" and self.acc_dtype.is_floating_point

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
        T, kind = self.T, self.kind
        if kind in ("sum", "prod", "max", "min"):
            return f"fx_{kind}_upd<{T}>({st[0]}, {v});"
        if kind in ("any", "all"):
            return f"fx_{kind}_upd<{self.value_type()}>({st[0]}, {v});"
        if kind in ("argmax", "argmin"):
            return f"fx_{kind}_upd<{T}>({st[0]}, {st[1]}, {v}, {idx});"
        return f"fx_welford_upd<{T}>({st[0]}, {st[1]}, {st[2]}, {v});"

    def cmb(self, a: list[str], b: list[str]) -> str:
        T, kind = self.T, self.kind
        if kind in ("sum", "prod", "max", "min"):
            return f"fx_{kind}_upd<{T}>({a[0]}, {b[0]});"
        if kind == "any":
            return f"{a[0]} = {a[0]} || {b[0]};"
        if kind == "all":
            return f"{a[0]} = {a[0]} && {b[0]};"
        if kind in ("argmax", "argmin"):
            return f"fx_{kind}_upd<{T}>({a[0]}, {a[1]}, {b[0]}, {b[1]});"
        return f"fx_welford_cmb<{T}>({a[0]}, {a[1]}, {a[2]}, {b[0]}, {b[1]}, {b[2]});"

    def finish(self, st: list[str]) -> list[str]:
        """Round 16-bit float results to their dtype (in place)."""
        if self.acc_dtype not in self.em.half_types or self.kind in ("argmax", "argmin"):
            return []
        rnd = self.em.half_types[self.acc_dtype][2]
        return [f"{s} = {rnd}({s});" for s, (t, _) in zip(st, self.states) if t != "int64_t"]

    def bind(self, scope: Scope, exprs: list[str]) -> None:
        for field, (i, dtype) in self.fields.items():
            scope.bind_acc(self.red.name, field, exprs[i], dtype)
