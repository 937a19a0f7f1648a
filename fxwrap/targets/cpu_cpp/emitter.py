"""The C++/OpenMP kernel emitter: ``ScheduledKernel`` -> ``extern "C"`` function -> launcher.

A kernel is one function taking the input pointers, the output pointers (in
``kernel.inputs`` / ``kernel.outputs`` order), then one ``int64_t`` per size symbol::

    extern "C" void fxwrap_kernel_0(const float* __restrict__ in_ptr0,
                                    float* __restrict__ out_ptr0, const int64_t s0)

Pointwise kernels are a loop nest over ``ranges``: the outer loops (and a blocked
innermost loop) collapse into one ``#pragma omp parallel for``; the innermost loop is
``#pragma omp simd`` when every store is contiguous in it.  A small constant innermost range
stored together with the loop above (a stack of RoPE's halves), or an innermost var the
kernel takes ``% n`` and ``/ n`` (that stack flattened and read again), is unrolled into ``n``
blocks inside the vectorized loop (``CppEmitter.unrolled_lanes``).

Reduction kernels pick one of two tilings, from the index strides:

* **row** (the reduced dim is innermost, e.g. ``x.sum(-1)``): one task per output row;
  each pass over the ``r`` range accumulates into ``reduction_lanes`` vector lanes
  plus a scalar tail, and combines them in a fixed order;
* **column** (the reduced dim is outer and the output is contiguous, ``x.sum(0)``):
  a task owns a block of ``col_block`` contiguous outputs and walks ``r`` outermost,
  so every load of the inner loop is contiguous.

Either way, when there are few output rows but a long reduction, the ``r`` range
is split into ``nchunks`` chunks (a function of the sizes only, never of the thread
count or timing); per-chunk partial states are combined in chunk order, so results
are bitwise reproducible; the partial states live in workspaces the program allocates
(``CStyleEmitter.workspace``: ``Allocate`` lines, sized by the same decision as a sympy
expression; the kernel allocates nothing).  Reductions run as passes in order (a reduction reading
another's ``acc`` starts a new pass); stores indexed by ``r`` vars run in a final
pass over ``r`` (the epilogue); stores indexed by ``x`` vars only, once per row.
When an epilogue store contains the (transcendental) value the last pass reduces,
that pass stores it and the epilogue reads it back: softmax computes one ``exp``
per element, ``out = exp(x - max)`` in the sum pass, ``out = out / sum`` after.

A loop whose loads are masked by conditions it does not change (a padded max-pool window's
position inside the image; a max-pool gradient's window choices, over a column reduction's
``r`` vars) runs twice, behind a test of the masks: unmasked where they all hold, masked at
the borders, in a lambda that alone opts out of if-conversion (``CppEmitter.unmasked_copy``).

Scan kernels (``cumsum``...) run one task per row, a serial pass over ``r0`` that updates
the running states and makes every store (``CStyleEmitter.scan_pass``, shared with Metal);
few long rows run as a split scan (chunk totals in a workspace, then each chunk from its
prefix: ``targets/cpu_cpp/scan.py``).

Inner loops vectorize: ``exp``, ``erf`` and ``tanh`` of float32 go through the prelude's
branch-free ``fx_expf`` / ``fx_erff`` / ``fx_tanhf`` (libm calls do not vectorize without
``-ffast-math``, which fxwrap never uses; their Horner steps are FMAs where the CPU has
them, their clamps and range tests integer operations on the float's bits, since gcc
makes mask-register chains of IEEE float selects), and sizes inside ``/``, ``%`` and
``*`` are parenthesised (``rbase % (s0 - 1)``).
"""
from __future__ import annotations

import os
from collections.abc import Callable

import sympy
import torch
import torch.utils._sympy.functions as symfn

from fxwrap.ir.combo import ComboKernel, ComboLimits
from fxwrap.ir.loops import Op, OpCode, ScheduledKernel, Store, load_buffer, load_mask, split_stores, walk
from fxwrap.runtime.launch import CppLaunch
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cpu_cpp.prelude import PRELUDE
from fxwrap.targets.cpu_cpp.scan import ScanCode
from fxwrap.targets.cstyle_combo import render_c_combo
from fxwrap.targets.host.compiler import SharedPrelude
from fxwrap.targets.cstyle import (C_TYPES, LIBM_OPS, CStyleEmitter, c_ops, EmitError, LocalNames, ReductionAccumulator, Scope, append_block,
                                   reduction_passes,
                                   c_operand as _operand)

#: the prelude, precompiled once (host.compiler: g++ then skips parsing it in every kernel),
#: with the intrinsics header the GEMM templates include
SHARED_PRELUDE = SharedPrelude(PRELUDE, extra="#if defined(__x86_64__)\n#include <immintrin.h>\n#endif")


class CppEmitter(CStyleEmitter):
    """``CppEmitter(target).render(kernel) -> KernelSource``; ``.load(source) -> launcher``.

    The launcher is called with the kernel's arguments in signature order, tensors
    for buffers and ints for sizes: ``launcher(in0, ..., out0, ..., s0, ...)``.
    """

    language = "c++"
    # the C++ dialect's spellings (CStyleEmitter's attributes)
    restrict_qualifier = "__restrict__"
    cast = "static_cast<{t}>({x})"
    typed_value = "{t}({v})"
    generic = "{f}<{t}>"                    # fx_sum_upd<float>(...): the prelude's templates
    overload = "{f}"                        # fx_abs(x): overloads and deduced templates
    out_arg = "{x}"                         # T& parameters
    out_param = "{t}& {x}"                  # of the prelude's helpers (cpu_cpp/prelude.py CPP)
    math = "std::"
    type_names = {**C_TYPES, torch.bfloat16: "fx_bf16", torch.float16: "fx_half"}
    half_types = {
        torch.bfloat16: ("fx_bf16_to_float", "fx_float_to_bf16", "fx_bf16_round"),
        torch.float16: ("fx_half_to_float", "fx_float_to_half", "fx_half_round"),
    }
    load_threads = min(8, os.cpu_count() or 1)  # g++ runs as a subprocess: compile in parallel
    kernel_qualifier = 'extern "C"'
    renders_scans = True
    # float32 scans (and bf16/fp16 ones, computed in float32) accumulate in float32; eager's CPU
    # cumsum/cumprod/logcumsumexp of float32 accumulate in double: {torch.float32: torch.float64}
    # here gives its numbers bit for bit, at ~1.4x the time of a one-thread row (AMD EPYC, 2026-11)
    scan_accumulate: dict = {}
    prelude = PRELUDE
    # a float local holding a bf16 value is stored as its high half (no second rounding)
    exact_half_stores = {torch.bfloat16: "fx_bf16_bits"}
    writes_in_place = True  # one loop nest per kernel: each element read, then written
    # independent pointwise kernels as one function, their loop nests one after another
    # (``targets/cstyle_combo.py``): one launch through the trampoline instead of one each
    # (at most its ``MAX_ARGS``, 48, arguments: more would be called through ctypes)
    combo_kernels = ComboLimits(max_members=16, max_arguments=48)
    # indexed writes (index_put, scatter in place): plain ones in parallel, accumulating
    # ones in one serial loop (each addition whole, in eager's order: its CPU kernel is serial)
    indexed_stores = {"set": frozenset(type_names), "add": frozenset(type_names) - {torch.bool}}
    # float exp, erf and tanh through the prelude's inline fx_expf / fx_erff / fx_tanhf
    # (they vectorize; libm calls vectorize only under -ffast-math)
    code_for_op = {**c_ops("fx_", "std::", "{f}"), "exp": lambda x, dtype: f"fx_exp({x})",
                   "erf": lambda x, dtype: f"fx_erf({x})", "tanh": lambda x, dtype: f"fx_tanh({x})"}
    # the other math-library ops stay scalar libm calls in the vector loops: a shared value
    # with one is stored once (KernelEmitter.costly_ops), not computed again by each reader
    costly_ops = frozenset(LIBM_OPS) - {"exp", "erf", "tanh", "sqrt", "copysign"} | {"erfinv"}
    # tuning (all decisions depend on sizes only: results never depend on thread count)
    parallel_min_work = 32768   # elements of work below which a kernel stays on one thread
    pointwise_block = 1024      # innermost tile of a collapsed pointwise nest
    unroll_max_lanes = 4        # an innermost range up to this, contiguous with the loop above, is unrolled
    reduction_lanes = 16        # independent accumulators of a row reduction (vector lanes)
    sum_flush = 256             # lane blocks between flushes of a float sum (two-level sum)
    col_block = 128             # outputs per task of a column reduction
    split_max_rows = 64         # row tiling: split r when there are fewer rows than this...
    split_row_chunk = 4096      # ... into chunks of at least this many elements
    split_max_tiles = 64        # column tiling: split r when there are fewer tiles than this...
    split_col_chunk = 256       # ... into chunks of at least this many r steps
    max_chunks = 64
    # scans (targets/cpu_cpp/scan.py): a split scan when there are fewer rows than
    # scan_split_max_rows, of at least scan_split_min_length elements; chunks of scan_chunk
    # elements, scan_lanes of them interleaved per task
    scan_split_max_rows = 64
    scan_split_min_length = 32768
    scan_chunk = 4000
    scan_lanes = 4
    reserved_names = frozenset("""xindex rindex rbase rcount rj lane tile task chunk nchunks
        chunk_size rstart rend xnumel rnumel xo xl xbase xcount xj tiles nxb ptile c ngroups c0""".split())

    def __init__(self, target=None, compiler=None):
        super().__init__(target)
        self._compiler = compiler
        self._unrolled = False
        self._masked_loads = False
        self._selects = False

    # Masked loads make a kernel opt out of if-conversion (FX_NO_IFCVT, the prelude says why),
    # unless each is declared in a border loop that does so alone (``unmasked_copy``): the
    # scopes of the masked loads rendered, and those of the border loops.
    @property
    def _masked_loads(self) -> bool:
        return any(all(home is not border for border in self._border_scopes) for home in self._masked_homes)

    @_masked_loads.setter
    def _masked_loads(self, value: bool) -> None:
        self._masked_homes: list = [None] if value else []
        self._border_scopes: list = []

    # ------------------------------------------------------------------ naming
    def symbol_name(self, sym: sympy.Symbol) -> str:
        if sym.name in self.reserved_names:
            raise EmitError(f"size symbol {sym.name!r} clashes with a loop variable of the "
                            f"{self.language} emitter (target {self.target_name})")
        return super().symbol_name(sym)

    def launch_record(self, kernel: ScheduledKernel, **common) -> CppLaunch:
        return CppLaunch(**common, parallel="openmp")

    def render_const(self, value, dtype: torch.dtype) -> str:
        if isinstance(value, str) or (isinstance(value, sympy.Basic) and value.free_symbols):
            # a run-time scalar (an ``.item()`` result, named by the wrapper builder) is
            # no kernel argument: the builder rebuilds its nodes as ATen extern calls
            raise EmitError(f"run-time scalar {value!r} used as a {dtype} constant has no "
                            f"kernel argument on target {self.target_name}; the op runs as an "
                            "ATen extern call")
        return super().render_const(value, dtype)

    # A bool element is read through a byte pointer into a byte local, ``const uint8_t tmp1 =
    # *(const uint8_t*)&in_ptr1[x0];`` (0 or 1, as bool storage holds): g++ 12 vectorizes no loop
    # that loads a ``bool`` and computes floats with it (a dropout mask times a softmax in
    # attention's backward: "no vectype for stmt"), and a ``bool`` local hoisted out of the
    # loop and selected on blocks it as well.  Every use of such a local (a select, ``!``,
    # a cast, a store to a bool output) reads 0 or 1 as false or true.
    def from_storage(self, value: str, dtype: torch.dtype) -> str:
        if dtype == torch.bool:
            return f"*(const uint8_t*)&{value}"
        return super().from_storage(value, dtype)

    def value_acc(self, home, op):
        # an any/all result is a ``bool`` state: read into a byte local like every bool
        # value, so an op mixing it with one (``fx_max(acc, tmp)``) sees one type
        expr, direct = super().value_acc(home, op)
        return (expr, False) if op.dtype == torch.bool else (expr, direct)

    def value_declaration(self, name: str, dtype: torch.dtype, expr: str) -> str:
        if dtype == torch.bool:
            return f"const uint8_t {name} = {expr};"
        return super().value_declaration(name, dtype, expr)

    # ------------------------------------------------------------------ body
    def function_head(self, kernel: ScheduledKernel, cname: str) -> str:
        """``extern "C" void name(...)``; ``extern "C" FX_NO_SLP void ...`` for a kernel whose
        loop body holds unrolled lanes, ``FX_NO_IFCVT`` for one with masked loads, or with
        unrolled lanes and a select (the prelude says why of each)."""
        head = super().function_head(kernel, cname)
        marks = {(True, False): "FX_NO_SLP", (False, True): "FX_NO_IFCVT", (True, True): "FX_NO_SLP_NO_IFCVT"}
        mark = marks.get((self._unrolled, self._masked_loads or (self._unrolled and self._selects)))
        return head.replace(" void ", f" {mark} void ", 1) if mark else head

    def render_combo(self, kernel: ComboKernel) -> KernelSource | None:
        return render_c_combo(self, kernel)

    def render_load(self, op, scope) -> str:
        if load_mask(op) is not None and load_mask(op) not in scope.known_true:
            self._masked_homes.append(scope)
        return super().render_load(op, scope)

    def render_op(self, op, args, arg_dtypes) -> str:
        self._selects = self._selects or op.op == OpCode.WHERE
        return super().render_op(op, args, arg_dtypes)

    def render_body(self, kernel: ScheduledKernel, names: LocalNames) -> list[str]:
        self._unrolled = False  # set by unrolled_lanes; read by function_head after the body
        self._masked_loads = False  # set by render_load; read by function_head after the body
        self._selects = False  # set by render_op; read by function_head after the body
        if kernel.is_scan:
            return self.scan(kernel, names)
        if kernel.reductions:
            return _ReductionCode(self, kernel, names).render()
        # no reductions: every var (x, then r if any) is a pointwise loop
        vars_ = self.xvars(kernel) + self.rvars(kernel)
        ranges = tuple(kernel.ranges) + tuple(kernel.reduction_ranges)
        order = memory_loop_order(kernel, vars_)
        return self.pointwise(kernel, names, [vars_[i] for i in order], [ranges[i] for i in order])

    def parallel_if(self, work) -> str | None:
        """``None``: stay serial; ``""``: always parallel; else a C condition for run time."""
        work = sympy.sympify(work)
        if work.is_number:
            return "" if int(work) >= self.parallel_min_work else None
        return f"{self.render_index(work)} >= {self.parallel_min_work}"

    def parallel_for(self, names: LocalNames, cond: str | None, loops, body: list[str]) -> list[str]:
        """A loop nest (``loops``: ``(var, start, stop, step)``, outermost first) around
        ``body``, collapsed into one ``omp parallel for`` when ``cond`` says so.

        A run-time ``cond`` gets two nests calling one ``[=]`` lambda: a small launch
        never enters the OpenMP runtime (an ``if()`` clause still costs a team setup).
        """
        it = self.index_type

        def nest(inner: list[str], pragma: bool) -> list[str]:
            out: list[str] = []
            if pragma:
                collapse = f" collapse({len(loops)})" if len(loops) > 1 else ""
                out.append(f"#pragma omp parallel for{collapse} schedule(static)")
            for depth, (v, start, stop, step) in enumerate(loops):
                inc = f"++{v}" if step == "1" else f"{v} += {step}"
                out.append("  " * depth + f"for ({it} {v} = {start}; {v} < {stop}; {inc}) {{")
            out += ["  " * len(loops) + ln if ln else ln for ln in inner]
            for depth in range(len(loops) - 1, -1, -1):
                out.append("  " * depth + "}")
            return out

        if cond is None or cond == "" or not loops:
            return nest(body, pragma=cond is not None and bool(loops))
        fn = names.fresh("body")
        params = ", ".join(f"const {it} {v}" for v, *_ in loops)
        call = [f"{fn}({', '.join(v for v, *_ in loops)});"]
        lines = [f"auto {fn} = [=]({params}) {{", *("  " + ln if ln else ln for ln in body), "};"]
        append_block(lines, f"if ({cond})", nest(call, pragma=True))
        append_block(lines, "else", nest(call, pragma=False))
        return lines

    def pointwise(self, kernel, names, vars_, ranges) -> list[str]:
        fn = Scope(self, names, None, kernel=kernel)
        if not vars_:
            body = self.render_stores(kernel, kernel.stores, fn)
            return fn.lines + body
        it = self.index_type
        lanes = _interleaved_lanes(kernel, vars_, ranges, self.unroll_max_lanes)
        lane_var, lane_of = (vars_[-1], None) if lanes else (None, None)
        if lanes:
            vars_, ranges = vars_[:-1], ranges[:-1]
        else:
            lanes = _lane_period(kernel, vars_, ranges, self.unroll_max_lanes)
            if lanes:
                # the innermost var is n * pair + lane: the loop runs over pairs, each lane a block
                lane_var, lane_of = vars_[-1], sympy.Symbol(names.fresh(f"{vars_[-1].name}_pair"), integer=True)
                vars_, ranges = [*vars_[:-1], lane_of], [*ranges[:-1], sympy.sympify(ranges[-1]) // lanes]
        inner_var, inner_range = vars_[-1], sympy.sympify(ranges[-1])
        block = self.pointwise_block
        blocked = not (inner_range.is_number and int(inner_range) <= block)
        numel = sympy.Mul(*[sympy.sympify(r) for r in ranges])
        # an accumulating indexed store: one thread, so no two additions to one element race
        par = None if any(st.mode == "add" for st in kernel.stores) else self.parallel_if(numel)
        outer = Scope(self, names, fn, declares=[v.name for v in vars_[:-1]])
        inner = Scope(self, names, outer, declares=[inner_var.name])
        if lanes:
            body = self.unrolled_lanes(kernel, names, inner, lane_var, lanes, lane_of)
            simd = True
        else:
            body = self.render_stores(kernel, kernel.stores, inner)
            simd = all(not st.indexed and _stride(st.index, inner_var) == 1 for st in kernel.stores)

        loops = [(v.name, "0", self.render_index(r), "1") for v, r in zip(vars_[:-1], ranges[:-1])]
        iv, ir = inner_var.name, self.render_index(inner_range)
        head: list[str] = []
        if blocked:
            loops.append((f"{iv}_blk", "0", ir, str(block)))
            head.append(f"const {it} {iv}_end = fx_imin({iv}_blk + {block}, {ir});")
            start, stop = f"{iv}_blk", f"{iv}_end"
        else:
            start, stop = "0", ir
        loop = f"for ({it} {iv} = {start}; {iv} < {stop}; ++{iv})"
        split = self.unmasked_copy(kernel.stores, inner, inner_var, loop,
                                   lambda fast: self.render_stores(kernel, kernel.stores, fast), body) \
            if simd and not lanes else None
        if split is not None:
            # the loads of the inner loop under masks it does not change (a max-pool window's
            # rows and columns inside the image): gcc vectorizes none of them (too many
            # conditions to unswitch), so the loop runs unmasked where every mask holds
            return fn.lines + self.parallel_for(names, par if loops else None, loops, outer.lines + head + split)
        inner_lines = outer.lines + head
        if simd:
            inner_lines.append("#pragma omp simd")
        append_block(inner_lines, loop, body)
        return fn.lines + self.parallel_for(names, par if loops else None, loops, inner_lines)

    def unrolled_lanes(self, kernel, names, inner: Scope, lane_var, lanes: int, pair=None) -> list[str]:
        """The body of the innermost loop when it holds ``lanes`` copies of the kernel's
        stores, one block per value of ``lane_var`` (a constant there: g++ folds the
        concatenation's tests on it and the masked loads go).  Values that do not depend on
        ``lane_var`` are declared once, before the blocks::

            for (x3 ...) {                      // #pragma omp simd: stores 2*x3 + x4 together
              { const int64_t x4 = 0; ... out_ptr0[... + 2*x3 + x4] = tmp9; }
              { const int64_t x4 = 1; ... out_ptr0[... + 2*x3 + x4] = tmp17; }
            }

        With ``pair`` (the loop's own variable), ``lane_var`` is ``lanes * pair + k`` in block
        ``k``: a kernel var that its expressions take ``% lanes`` and ``/ lanes`` (g++ folds
        both to ``k`` and ``pair``)::

            for (x4_pair0 ...) { { const int64_t x4 = 2*x4_pair0 + 0; ... x4 % 2 ... } ... }
        """
        self._unrolled = True
        blocks: list[str] = []
        for k in range(lanes):
            lane = Scope(self, names, inner, declares=[lane_var.name])
            stores = self.render_stores(kernel, kernel.stores, lane)
            value = f"{lanes}*{pair.name} + {k}" if pair is not None else str(k)
            append_block(blocks, "", [f"const {self.index_type} {lane_var.name} = {value};", *stores])
        return inner.lines + [ln[1:] if ln == " {" else ln for ln in blocks]

    def unmasked_copy(self, stores, inner: Scope, inner_var, loop: str, render, body: list[str]) -> list[str] | None:
        """The ``omp simd`` loop ``loop`` (its body ``body``, rendered in ``inner``) twice, where
        loads of its body read under masks it does not change: unmasked where every mask holds
        (``render(scope)`` renders the body again in a scope that knows them true), masked
        otherwise; None where there are no such masks.  The border loop alone opts out of
        if-conversion, as a lambda of its own, so the unmasked loop vectorizes its selects::

            if (tmp12 && tmp10) {
              #pragma omp simd
              for (int64_t x1 = 0; x1 < 32; ++x1) { ... in_ptr0[...] ... }
            }
            else [&]() FX_NO_IFCVT {
              #pragma omp simd
              for (int64_t x1 = 0; x1 < 32; ++x1) { ... tmp12 ? in_ptr0[...] : float(0) ... }
            }();
        """
        masks = _invariant_masks(stores, inner, inner_var)
        if not masks:
            return None
        fast = Scope(self, inner.names, inner.parent, declares=[inner_var.name])
        fast.known_true = frozenset(masks)
        fast_body = render(fast)
        test = " && ".join(inner.parent.lookup(m)[0] for m in masks)
        lines: list[str] = []
        append_block(lines, f"if ({test})", ["#pragma omp simd", *_block(loop, fast_body)])
        append_block(lines, "else [&]() FX_NO_IFCVT", ["#pragma omp simd", *_block(loop, body)])
        lines[-1] += "();"
        self._border_scopes.append(inner)
        return lines

    def scan(self, kernel: ScheduledKernel, names: LocalNames) -> list[str]:
        """A scan kernel: one task per row, or a split scan of few long rows (``ScanCode``)."""
        return ScanCode(self, kernel, names).render()

    # ------------------------------------------------------------------ load
    def load(self, source: KernelSource) -> Callable:
        """Compile (or fetch from the on-disk cache), dlopen, and bind a launcher."""
        from fxwrap.targets.host.loader import launcher_for
        return launcher_for(source.text, source.launch.symbol,
                            source.launch.pointers, len(source.launch.size_symbols),
                            compiler=self._compiler, prelude=SHARED_PRELUDE)

    def load_ahead(self, sources: list[KernelSource]) -> None:
        """Compile the kernels of ``sources`` not in the cache yet in at most ``load_threads``
        translation units at once (``host.loader.compile_ahead``)."""
        from fxwrap.targets.host.loader import compile_ahead
        compile_ahead([(source.text, source.launch.symbol) for source in sources], compiler=self._compiler,
                      prelude=SHARED_PRELUDE, units=self.load_threads)

    def saved_loader(self, kernel) -> Callable:
        """The kernel's shared object, carried by a ``host.saved.SharedObjectLoader``."""
        from fxwrap.targets.host.loader import kernel_loader
        from fxwrap.targets.host.saved import SharedObjectLoader, bind_c_kernel
        return SharedObjectLoader.of(kernel.launcher().library, bind_c_kernel, kernel_loader)


def _invariant_masks(stores, inner: Scope, inner_var) -> list[Op]:
    """The masks of the loads declared in the innermost loop's scope ``inner`` (its body
    rendered) that do not depend on its variable, in program order; their locals are
    declared outside the loop.  A max-pool window over a padded image::

        const bool tmp28 = (tmp25 != 0) && (tmp27 != 0);     // the window's column inside
        for (x0 ...) { tmp29 = tmp28 ? in_ptr0[x0 + ...] : float(0); ... }
    """
    masks: list[Op] = []
    for op in walk(*(root for st in stores for root in (st.roots() if isinstance(st, Store) else (st,)))):
        if op.op != OpCode.LOAD or op not in inner.env or load_mask(op) is None:
            continue
        mask = load_mask(op)
        if inner_var.name not in inner.deps(mask) and inner.lookup(mask) is not None and mask not in masks:
            masks.append(mask)
    return masks


def _interleaved_lanes(kernel: ScheduledKernel, vars_, ranges, most: int) -> int:
    """``n`` when the innermost loop is a constant ``n <= most`` (at least 2) that every store
    walks together with the loop above it, as one contiguous run (stride 1 in the innermost
    var, ``n`` in the other): the loop above vectorizes with ``n`` copies of the body inside,
    where a loop of ``n`` steps would not.  A stack of two strided halves (RoPE's
    ``stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)``) stores
    ``... + 2*x3 + x4`` with ``x4 < 2``.  0 otherwise."""
    if len(vars_) < 2 or not kernel.stores:
        return 0
    n = sympy.sympify(ranges[-1])
    if not n.is_Integer or not 2 <= int(n) <= most:
        return 0
    for st in kernel.stores:
        if st.indexed or st.mode == "add":
            return 0
        if _stride(st.index, vars_[-1]) != 1 or _stride(st.index, vars_[-2]) != int(n):
            return 0
    return int(n)


def _lane_period(kernel: ScheduledKernel, vars_, ranges, most: int) -> int:
    """``n`` when the innermost var ``v`` (a constant range, a multiple of ``n``, every store
    contiguous in it) is taken ``% n`` or ``/ n`` by the kernel's expressions, one ``n`` in
    ``[2, most]`` for all: the stack of RoPE's halves flattened into the head dim and read
    again (a grouped KV head's ``repeat_interleave`` of it, fused) loads at ``2*(x4 / 2)`` under
    ``x4 % 2 < 1``.  The loop then runs over ``v / n``, with the ``n`` lanes unrolled
    (``CppEmitter.unrolled_lanes``).  0 otherwise."""
    if not vars_ or not kernel.stores or kernel.indexed_writes:
        return 0
    v, r = vars_[-1], sympy.sympify(ranges[-1])
    if not r.is_Integer:
        return 0
    exprs = []
    for st in kernel.stores:
        if st.indexed or st.mode == "add" or _stride(st.index, v) != 1:
            return 0
        exprs.append(sympy.sympify(st.index))
    for op in walk(*(root for st in kernel.stores for root in st.roots())):
        if op.op == OpCode.LOAD and op.arg[1] is not None:
            exprs.append(sympy.sympify(op.arg[1]))
        elif op.op == OpCode.INDEX:
            exprs.append(op.arg)
    periods = set()
    for e in exprs:
        for f in e.atoms(symfn.FloorDiv, symfn.ModularIndexing, symfn.PythonMod, symfn.Mod, sympy.Mod):
            if f.args[0] != v:
                continue
            if isinstance(f, symfn.ModularIndexing):
                if f.args[1] != 1:
                    return 0
                periods.add(f.args[2])
            else:
                periods.add(f.args[1])
    if len(periods) != 1:
        return 0
    (n,) = periods
    if not (n.is_Integer and 2 <= int(n) <= most and int(r) % int(n) == 0 and int(r) > int(n)):
        return 0
    return int(n)


def _block(head: str, body: list[str]) -> list[str]:
    lines: list[str] = []
    append_block(lines, head, body)
    return lines


# a size symbol's stand-in when strides are compared to order loops (a guess: only
# the speed of the loop nest depends on it, never its result)
_SYMBOL_GUESS = 64


def memory_loop_order(kernel: ScheduledKernel, vars_) -> list[int]:
    """Positions of ``vars_``, outermost loop first, so that the first store walks
    memory forwards: by decreasing stride of each variable in its index.

    ``relu(x)`` of a channels-last ``(4, 16, 8, 8)`` tensor stores at
    ``1024*x0 + x1 + 128*x2 + 16*x3``: the loops run ``x0, x2, x3, x1`` and the
    innermost loop is contiguous (vectorizable) instead of stepping by 16.  Logical
    order is kept when a stride is not a constant or when the kernel reads a buffer
    it writes (the order of its iterations could matter).
    """
    logical = list(range(len(vars_)))
    if len(vars_) < 2 or not kernel.stores or kernel.indexed_writes:
        return logical
    written = {st.buffer for st in kernel.stores}
    if written & {b.name for b in kernel.inputs}:
        return logical
    index = sympy.sympify(kernel.stores[0].index)
    guess = {s: _SYMBOL_GUESS for s in index.free_symbols if s not in set(vars_)}
    strides = []
    for v in vars_:
        d = sympy.diff(index, v).subs(guess) if v in index.free_symbols else sympy.Integer(0)
        if not d.is_Integer:
            return logical
        strides.append(int(d))
    return sorted(logical, key=lambda i: -strides[i])


def _stride(index, var) -> int | None:
    """The constant coefficient of ``var`` in ``index`` (0 if absent), else None."""
    index = sympy.sympify(index)
    if var not in index.free_symbols:
        return 0
    d = sympy.diff(index, var)
    return int(d) if d.is_Integer else None


class _ReductionCode:
    """Renders one reduction kernel (row or column tiling, split or not)."""

    def __init__(self, em: CppEmitter, kernel: ScheduledKernel, names: LocalNames):
        self.em, self.k, self.names = em, kernel, names
        self.it = em.index_type
        self.xv = em.xvars(kernel)
        self.rv = em.rvars(kernel)
        self.xr = [sympy.sympify(r) for r in kernel.ranges]
        self.rr = [sympy.sympify(r) for r in kernel.reduction_ranges]
        if not self.rv:
            raise EmitError(f"kernel {kernel.name} has reductions but no reduction_ranges")
        self.reds = [ReductionAccumulator(em, i, r) for i, r in enumerate(kernel.reductions)]
        self.passes = reduction_passes(kernel, self.reds)
        self.r_stores, self.x_stores = split_stores(kernel.stores, self.rv)
        self.xnumel = sympy.Mul(*self.xr) if self.xr else sympy.Integer(1)
        self.rnumel = sympy.Mul(*self.rr)
        self.column = self._is_column()
        self.stash = self._stash()

    _HEAVY = frozenset("exp exp2 expm1 log log2 log10 log1p erf erfc tanh sigmoid pow sin cos "
                       "tan sinh cosh atan asin acos".split())

    def _stash(self) -> list[tuple[Store, Op]]:
        """Epilogue stores that contain the value a reduction of the last pass reduces
        (softmax: ``exp(x - max)`` in ``exp(x - max) / sum``), when that value is costly
        (a transcendental) and has the stored buffer's own dtype (float32/64, so that it
        reads back bit for bit): the last pass stores it, the epilogue loads it back
        instead of computing it again.  Row tiling only."""
        if self.column or not self.r_stores or not self.passes:
            return []
        stash: list[tuple[Store, Op]] = []
        _, pointers = self.em.buffer_pointers(self.k)
        # a buffer the kernel also reads (a ``copy_`` into an input) must not change early
        read = {load_buffer(n) for n in walk(*[r.red.value for r in self.reds], *[st.value for st in self.k.stores])
                if n.op == OpCode.LOAD}
        taken: set[str] = set(read)
        for r in self.passes[-1]:
            v = r.red.value
            if v.op in (OpCode.LOAD, OpCode.CONST, OpCode.CAST) or v.dtype not in (torch.float32, torch.float64):
                continue
            if not any(n.op in self._HEAVY for n in walk(v)):
                continue
            for st in self.r_stores:
                if st.buffer in taken or pointers.get(st.buffer, (None, None))[1] != v.dtype:
                    continue
                if any(n == v for n in walk(st.value)) and st.value != v:
                    stash.append((st, v))
                    taken.add(st.buffer)
                    break
        return stash

    def stash_stores(self, scope: Scope) -> list[str]:
        """The last pass's stores of the stashed values (locals already in ``scope``)."""
        _, pointers = scope.pointers()
        return [f"{pointers[st.buffer][0]}[{self.idx(st.index)}] = {scope.value(v)};"
                for st, v in self.stash]

    # -- analysis --------------------------------------------------------------
    def _is_column(self) -> bool:
        """Reduce over an outer dim with contiguous outputs: iterate r outer, x inner."""
        if not self.xv:
            return False
        xl, rl = self.xv[-1], self.rv[-1]
        loads = [n.arg[1] for r in self.reds for n in walk(r.red.value) if n.op == OpCode.LOAD]
        rnames = {v.name for v in self.rv}
        loads = [index for index in loads if index is not None and any(  # direct loads only
            s.name in rnames for s in index.free_symbols)]
        if not loads:
            return False
        x_contig = any(_stride(index, xl) == 1 for index in loads)
        # a load that does not vary with x (a per-row scale: layer norm's rstd in its
        # weight gradient) is one scalar per r in column order, not a strided read
        xnames = {v.name for v in self.xv}
        r_contig = any(_stride(index, rl) == 1 for index in loads
                       if any(s.name in xnames for s in index.free_symbols))
        return x_contig and not r_contig

    # -- helpers ---------------------------------------------------------------
    def idx(self, e) -> str:
        return self.em.render_index(e)

    def pidx(self, e) -> str:
        """``idx(e)`` as one operand: parenthesised unless a name or a literal, so that
        ``/``, ``%`` and ``*`` around it bind to the whole size (``(s0 + 1) / 2``)."""
        return _operand(self.em.render_index(e))

    def scope(self, parent, declares=()) -> Scope:
        return Scope(self.em, self.names, parent, declares=declares, kernel=self.k)

    def nchunks_expr(self) -> sympy.Expr | str:
        """How many chunks the r range splits into: a function of the sizes only."""
        em = self.em
        if self.column:
            few, lim, chunk = self.tiles_expr(), em.split_max_tiles, em.split_col_chunk
        else:
            few, lim, chunk = self.xnumel, em.split_max_rows, em.split_row_chunk
        few = sympy.sympify(few)
        if few.is_number and self.rnumel.is_number:
            if int(few) < lim and int(self.rnumel) >= 2 * chunk:
                return sympy.Integer(min(em.max_chunks, int(self.rnumel) // chunk))
            return sympy.Integer(1)
        rn = self.idx(self.rnumel)
        return (f"({self.idx(few)} < {lim} && {rn} >= {2 * chunk}) ? "
                f"fx_imin({em.max_chunks}, {_operand(rn)} / {chunk}) : 1")

    def workspace_numels(self, nchunks, width: int) -> tuple[sympy.Expr, sympy.Expr]:
        """Elements of the scratch of a split, per state: the per-chunk partials (``tiles *
        nchunks * width``) and the combined values (one per output), as sympy expressions
        over the sizes; where ``nchunks`` is decided at run time, the same decision
        written with ``Min``/``Max`` (0 elements when the kernel does not split)."""
        tiles = self.tiles_expr() if self.column else self.xnumel
        if isinstance(nchunks, sympy.Expr):
            return tiles * nchunks * width, self.xnumel
        from torch.utils._sympy.functions import FloorDiv
        em = self.em
        if self.column:
            few, lim, chunk = self.tiles_expr(), em.split_max_tiles, em.split_col_chunk
        else:
            few, lim, chunk = self.xnumel, em.split_max_rows, em.split_row_chunk
        one, zero = sympy.Integer(1), sympy.Integer(0)
        splits = (sympy.Max(zero, sympy.Min(one, lim - sympy.sympify(few)))
                  * sympy.Max(zero, sympy.Min(one, self.rnumel - 2 * chunk + 1)))
        most = sympy.Min(em.max_chunks, FloorDiv(self.rnumel, chunk))
        return tiles * width * splits * most, self.xnumel * splits

    def tiles_expr(self) -> sympy.Expr:
        xo = sympy.Mul(*self.xr[:-1]) if len(self.xr) > 1 else sympy.Integer(1)
        from torch.utils._sympy.functions import CeilDiv
        return xo * CeilDiv(self.xr[-1], self.em.col_block)

    # -- top level -------------------------------------------------------------
    def render(self) -> list[str]:
        fn = self.scope(None)
        nchunks = self.nchunks_expr()
        if isinstance(nchunks, sympy.Expr):
            body = self.split(fn, nchunks) if int(nchunks) > 1 else self.whole(fn)
            return fn.lines + body
        whole = self.whole(fn)
        split = self.split(fn, "nchunks")
        lines = fn.lines + [f"const {self.it} nchunks = {nchunks};"]
        append_block(lines, "if (nchunks <= 1)", whole)
        append_block(lines, "else", split)
        return lines

    # -- no split: one task per row (or column tile) does every pass --------------
    def whole(self, fn: Scope) -> list[str]:
        par = self.em.parallel_if(self.xnumel * self.rnumel)
        if self.column:
            body = self.col_task(fn, "tile", "0", self.idx(self.rnumel), partial=None)
            loop = ("tile", "0", self.idx(self.tiles_expr()), "1")
        else:
            body = self.row_task(fn, "xindex", "0", self.idx(self.rnumel), partial=None)
            loop = ("xindex", "0", self.idx(self.xnumel), "1")
            par = par if self.xv else None
        return self.em.parallel_for(self.names, par, [loop], body)

    # -- split: passes over (tile, chunk) tasks with partials combined in order ----
    def split(self, fn: Scope, nchunks) -> list[str]:
        it, em = self.it, self.em
        nch = nchunks if isinstance(nchunks, str) else self.idx(nchunks)
        xnumel = self.idx(self.xnumel)
        rnumel = self.idx(self.rnumel)
        ntiles = self.idx(self.tiles_expr()) if self.column else xnumel
        width = em.col_block if self.column else 1
        lines = [f"const {it} chunk_size = ({rnumel} + {nch} - 1) / {nch};",
                 f"const {it} tiles = {ntiles};"]
        partials, finals = self.workspace_numels(nchunks, width)
        dtype_of = {name: dtype for dtype, name in em.type_names.items()}
        for r in self.reds:
            for (t, _), p, f in zip(r.states, r.names("p"), r.names("F")):
                lines.append(f"{t}* const {p} = {em.workspace(partials, dtype_of[t])};")
                lines.append(f"{t}* const {f} = {em.workspace(finals, dtype_of[t])};")
        par_tasks = em.parallel_if(self.xnumel * self.rnumel)
        task_loop = [("task", "0", f"tiles * {nch}", "1")]
        chunk_range = ["const int64_t chunk = task % " + nch + ";",
                       "const int64_t rstart = chunk * chunk_size;",
                       f"const int64_t rend = fx_imin(rstart + chunk_size, {rnumel});"]
        done: list[ReductionAccumulator] = []
        for p in self.passes:
            task = [f"const {it} tile = task / {nch};"] + chunk_range
            if self.column:
                task += self.col_task(fn, "tile", "rstart", "rend", partial=(p, done, nch))
            else:
                task += self.row_task(fn, "tile", "rstart", "rend", partial=(p, done, nch))
            lines += em.parallel_for(self.names, par_tasks, task_loop, task)
            lines += self.combine(p, nch, xnumel)
            done += p
        if self.r_stores:
            task = [f"const {it} tile = task / {nch};"] + chunk_range
            if self.column:
                task += self.col_task(fn, "tile", "rstart", "rend", partial=([], done, nch))
            else:
                task += self.row_task(fn, "tile", "rstart", "rend", partial=([], done, nch))
            lines += em.parallel_for(self.names, par_tasks, task_loop, task)
        if self.x_stores:
            row = self.scope(fn, [v.name for v in self.xv])
            for r in done:
                r.bind(row, [f"{f}[xindex]" for f in r.names("F")])
            stores = self.em.render_stores(self.k, self.x_stores, row)
            append_block(lines, f"for ({it} xindex = 0; xindex < {xnumel}; ++xindex)",
                   self.em.decompose("xindex", self.xv, self.xr, self.names) + stores)
        return lines

    def combine(self, p: list[ReductionAccumulator], nch: str, xnumel: str) -> list[str]:
        """Per output: fold the chunk partials in chunk order into the final arrays."""
        it, em = self.it, self.em
        body: list[str] = []
        if self.column:
            xl = self.pidx(self.xr[-1])
            cb = em.col_block
            body += [f"const {it} xo = xindex / {xl};", f"const {it} xl = xindex % {xl};",
                     f"const {it} ptile = xo * (({xl} + {cb - 1}) / {cb}) + xl / {cb};",
                     f"const {it} xj = xl % {cb};"]
            at = f"(ptile * {nch} + c) * {cb} + xj"
        else:
            at = f"xindex * {nch} + c"
        for r in p:
            acc = r.names("a")
            body += [f"{t} {a} = {init};" for (t, init), a in zip(r.states, acc)]
            inner = r.cmb(acc, [f"{q}[{at}]" for q in r.names("p")])
            body.append(f"for ({it} c = 0; c < {nch}; ++c) {inner}")
            body += r.finish(acc)
            body += [f"{f}[xindex] = {a};" for f, a in zip(r.names("F"), acc)]
        par = em.parallel_if(self.xnumel * 8)
        return em.parallel_for(self.names, par, [("xindex", "0", xnumel, "1")], body)

    # -- row tiling ------------------------------------------------------------
    def row_task(self, fn: Scope, xlin: str, rs: str, re_: str, partial) -> list[str]:
        """One output row: passes, epilogue and x-only stores (or one pass of a split)."""
        row = self.scope(fn, [v.name for v in self.xv])
        out = self.em.decompose(xlin, self.xv, self.xr, self.names)
        if partial is None:
            passes, bound = self.passes, []
        else:
            passes, bound, nch = partial
            passes = [passes] if passes else []
            for r in bound:
                r.bind(row, [f"{f}[{xlin}]" for f in r.names("F")])
        for p in passes:
            code, finals = self.row_pass(row, p, rs, re_,
                                         stash=partial is None and p is self.passes[-1])
            row.flush_into(out)
            out += code
            if partial is None:
                for r in p:
                    fin = finals[r.k]
                    out += r.finish(fin)
                    r.bind(row, fin)
            else:
                for r in p:
                    out += [f"{q}[task] = {s};" for q, s in zip(r.names("p"), finals[r.k])]
        if partial is None or (partial is not None and not partial[0]):
            if self.r_stores:
                code = self.row_epilogue(row, rs, re_, stash=partial is None)
                row.flush_into(out)
                out += code
        if partial is None and self.x_stores:
            stores = self.em.render_stores(self.k, self.x_stores, row)
            row.flush_into(out)
            out += stores
        return out

    def r_segment(self, rbase: str, re_: str) -> tuple[list[str], str, str]:
        """Decompose linear ``rbase`` into the outer r vars and the start of the last one."""
        it = self.it
        last = self.rv[-1].name
        if len(self.rv) == 1:
            lines = [f"const {it} {last}_start = {rbase};"]
            count = f"{re_} - {rbase}"
        else:
            q = self.names.fresh("q")
            rlast = self.pidx(self.rr[-1])
            lines = [f"const {it} {q} = {rbase} / {rlast};",
                     f"const {it} {last}_start = {rbase} % {rlast};"]
            lines += self.em.decompose(q, self.rv[:-1], self.rr[:-1], self.names)
            count = f"fx_imin({rlast} - {last}_start, {_operand(re_)} - {rbase})"
        return lines, f"{last}_start", count

    def row_pass(self, row: Scope, p: list[ReductionAccumulator], rs: str, re_: str, stash: bool = False):
        it, L = self.it, self.em.reduction_lanes
        last = self.rv[-1].name
        flush = [r for r in p if r.flushable]
        pre: list[str] = []
        finals: dict[int, list[str]] = {}
        for r in p:
            for (t, init), lane, tail in zip(r.states, r.names("l"), r.names("t")):
                # any/all's bool lane array held as bytes (see CppEmitter.from_storage); a bool
                # max/min/argmax keeps bool lanes: their updates take a reference of the value's type
                pre.append(f"{'uint8_t' if r.kind in ('any', 'all') else t} {lane}[{L}];")
                pre.append(f"{t} {tail} = {init};")
            for (t, init), fin in zip(r.states, r.names("f")):
                pre.append(f"{t} {fin} = {init};")
            finals[r.k] = r.names("f")
        for r in flush:
            pre.append(f"{r.T} {r.base}_o[{L}];")
        inits = [f"{lane}[lane] = {init};" for r in p for (_, init), lane in zip(r.states, r.names("l"))]
        inits += [f"{r.base}_o[lane] = 0;" for r in flush]
        pre.append(f"for (int lane = 0; lane < {L}; ++lane) {{ {' '.join(inits)} }}")
        if flush:
            pre.append(f"{it} {p[0].base}_flush = 0;")

        seg_lines, start, count = self.r_segment("rbase", re_)
        seg = self.scope(row, [v.name for v in self.rv[:-1]])
        # lanes
        lane_scope = self.scope(seg, [last])
        lane_body = [f"const {it} {last} = {start} + rj + lane;"]
        ridx_l = "rbase + rj + lane"
        upd_l = []
        for r in p:
            v = r.value(lane_scope)
            upd_l.append(r.upd([f"{s}[lane]" for s in r.names("l")], v, ridx_l))
        lane_scope.flush_into(lane_body)
        lane_body += upd_l
        if stash:
            lane_body += self.stash_stores(lane_scope)
        # tail
        tail_scope = self.scope(seg, [last])
        tail_body = [f"const {it} {last} = {start} + rj;"]
        upd_t = []
        for r in p:
            v = r.value(tail_scope)
            upd_t.append(r.upd(r.names("t"), v, "rbase + rj"))
        tail_scope.flush_into(tail_body)
        tail_body += upd_t
        if stash:
            tail_body += self.stash_stores(tail_scope)

        seg_body = seg_lines + [f"const {it} rcount = {count};"]
        seg.flush_into(seg_body)
        seg_body.append(f"{it} rj = 0;")
        blk: list[str] = []
        blk.append("#pragma omp simd")
        append_block(blk, f"for ({it} lane = 0; lane < {L}; ++lane)", lane_body)
        blk += self.flush_partials(flush, p[0].base, "l", "int lane", L)
        append_block(seg_body, f"for (; rj + {L} <= rcount; rj += {L})", blk)
        append_block(seg_body, "for (; rj < rcount; ++rj)", tail_body)
        seg_body.append("rbase += rcount;")
        code = list(pre)
        append_block(code, f"for ({it} rbase = {rs}; rbase < {re_}; )", seg_body)
        # fold lanes (outer flushed lanes first), then the tail, in a fixed order
        fold: list[str] = []
        for r in p:
            fin = r.names("f")
            if r in flush:
                fold.append(r.cmb(fin, [f"{r.base}_o[lane]"]))
            fold.append(r.cmb(fin, [f"{s}[lane]" for s in r.names("l")]))
        code.append(f"for (int lane = 0; lane < {L}; ++lane) {{ {' '.join(fold)} }}")
        for r in p:
            code.append(r.cmb(r.names("f"), r.names("t")))
        return code, finals

    def row_epilogue(self, row: Scope, rs: str, re_: str, stash: bool = False) -> list[str]:
        it = self.it
        last = self.rv[-1]
        seg_lines, start, count = self.r_segment("rbase", re_)
        seg = self.scope(row, [v.name for v in self.rv[:-1]])
        inner = self.scope(seg, [last.name])
        body = [f"const {it} {last.name} = {start} + rj;"]
        if stash:
            loads, _ = inner.pointers()
            for st, v in self.stash:  # stored by the last pass: read back, do not recompute
                name = self.names.fresh("tmp")
                body.append(f"const {self.em.ctype(v.dtype)} {name} = "
                            f"{loads[st.buffer][0]}[{self.idx(st.index)}];")
                inner.env[v] = (name, v.dtype)
        body += self.em.render_stores(self.k, self.r_stores, inner)
        seg_body = seg_lines + [f"const {it} rcount = {count};"]
        seg.flush_into(seg_body)
        if all(_stride(st.index, last) == 1 for st in self.r_stores):
            seg_body.append("#pragma omp simd")
        append_block(seg_body, f"for ({it} rj = 0; rj < rcount; ++rj)", body)
        seg_body.append("rbase += rcount;")
        code: list[str] = []
        append_block(code, f"for ({it} rbase = {rs}; rbase < {re_}; )", seg_body)
        return code

    # -- column tiling ------------------------------------------------------------
    def col_task(self, fn: Scope, tile: str, rs: str, re_: str, partial) -> list[str]:
        it, cb = self.it, self.em.col_block
        xl_range = self.pidx(self.xr[-1])
        out = [f"const {it} nxb = ({xl_range} + {cb - 1}) / {cb};",
               f"const {it} xo = {tile} / nxb;",
               f"const {it} xbase = ({tile} % nxb) * {cb};",
               f"const {it} xcount = fx_imin({cb}, {xl_range} - xbase);"]
        out += self.em.decompose("xo", self.xv[:-1], self.xr[:-1], self.names)
        outer = self.scope(fn, [v.name for v in self.xv[:-1]])
        xlast = self.xv[-1].name
        if partial is None:
            passes, bound = self.passes, []
        else:
            passes, bound, nch = partial
            passes = [passes] if passes else []
        xfull = f"xo * {xl_range} + xbase + xj"

        def bind_all(scope: Scope, done: list[ReductionAccumulator]) -> None:
            for r in bound:
                r.bind(scope, [f"{f}[{xfull}]" for f in r.names("F")])
            for r in done:
                r.bind(scope, [f"{f}[xj]" for f in r.names("f")])

        done: list[ReductionAccumulator] = []
        for p in passes:
            code = self.col_pass(outer, p, rs, re_, lambda s, d=list(done): bind_all(s, d),
                                 final=partial is None)
            outer.flush_into(out)
            out += code
            if partial is None:
                done += p
            else:
                for r in p:
                    for q, f in zip(r.names("p"), r.names("f")):
                        out.append(f"for ({it} xj = 0; xj < xcount; ++xj) {q}[task * {cb} + xj] = {f}[xj];")
        if (partial is None or not partial[0]) and self.r_stores:
            code = self.col_epilogue(outer, rs, re_, lambda s: bind_all(s, done))
            outer.flush_into(out)
            out += code
        if partial is None and self.x_stores:
            inner = self.scope(outer, [xlast])
            bind_all(inner, done)
            body = [f"const {it} {xlast} = xbase + xj;"]
            body += self.em.render_stores(self.k, self.x_stores, inner)
            outer.flush_into(out)
            append_block(out, f"for ({it} xj = 0; xj < xcount; ++xj)", body)
        return out

    def flush_partials(self, flush, counter: str, tag: str, decl: str, bound) -> list[str]:
        """Every ``sum_flush`` blocks, move the float sums' running partials (fields ``tag``,
        indexed by the loop var of ``decl``) into their outer sums (two-level sum)."""
        if not flush:
            return []
        var = decl.split()[-1]
        moves = " ".join(f"{r.base}_o[{var}] += {r.names(tag)[0]}[{var}]; {r.names(tag)[0]}[{var}] = 0;"
                         for r in flush)
        return [f"if (++{counter}_flush == {self.em.sum_flush}) {{", f"  {counter}_flush = 0;",
                f"  for ({decl} = 0; {var} < {bound}; ++{var}) {{ {moves} }}", "}"]

    def r_all(self, rindex: str) -> list[str]:
        return self.em.decompose(rindex, self.rv, self.rr, self.names)

    def col_pass(self, outer: Scope, p: list[ReductionAccumulator], rs: str, re_: str, bind,
                 final: bool) -> list[str]:
        it, cb = self.it, self.em.col_block
        xlast = self.xv[-1].name
        flush = [r for r in p if r.flushable]
        code: list[str] = []
        inits = []
        for r in p:
            for (t, init), c, f in zip(r.states, r.names("c"), r.names("f")):
                code.append(f"{t} {c}[{cb}];")
                code.append(f"{t} {f}[{cb}];")
                inits.append(f"{c}[xj] = {init};")
        for r in flush:
            code.append(f"{r.T} {r.base}_o[{cb}];")
            inits.append(f"{r.base}_o[xj] = 0;")
        code.append(f"for ({it} xj = 0; xj < {cb}; ++xj) {{ {' '.join(inits)} }}")
        if flush:
            code.append(f"{it} {p[0].base}_flush = 0;")
        rscope = self.scope(outer, [v.name for v in self.rv])
        inner = self.scope(rscope, [xlast])

        def render(scope: Scope) -> list[str]:
            bind(scope)
            body = [f"const {it} {xlast} = xbase + xj;"]
            upd = [r.upd([f"{c}[xj]" for c in r.names("c")], r.value(scope), "rindex") for r in p]
            scope.flush_into(body)
            return body + upd

        body = render(inner)
        loop = f"for ({it} xj = 0; xj < xcount; ++xj)"
        # loads masked by conditions of the r vars only (a max-pool backward's window choices)
        split = self.em.unmasked_copy([r.red.value for r in p], inner, self.xv[-1], loop, render, body)
        rbody = self.r_all("rindex")
        rscope.flush_into(rbody)
        if split is not None:
            rbody += split
        else:
            rbody.append("#pragma omp simd")
            append_block(rbody, loop, body)
        rbody += self.flush_partials(flush, p[0].base, "c", f"{it} xj", "xcount")
        append_block(code, f"for ({it} rindex = {rs}; rindex < {re_}; ++rindex)", rbody)
        fold: list[str] = []
        for r in p:
            a = r.names("a")
            fold += [f"{t} {x} = {init};" for (t, init), x in zip(r.states, a)]
            if r in flush:
                fold.append(r.cmb(a, [f"{r.base}_o[xj]"]))
            fold.append(r.cmb(a, [f"{c}[xj]" for c in r.names("c")]))
            fold += r.finish(a) if final else []
            fold += [f"{f}[xj] = {x};" for f, x in zip(r.names("f"), a)]
        append_block(code, f"for ({it} xj = 0; xj < xcount; ++xj)", fold)
        return code

    def col_epilogue(self, outer: Scope, rs: str, re_: str, bind) -> list[str]:
        it = self.it
        xlast = self.xv[-1]
        rscope = self.scope(outer, [v.name for v in self.rv])
        inner = self.scope(rscope, [xlast.name])

        def render(scope: Scope) -> list[str]:
            bind(scope)
            return [f"const {it} {xlast.name} = xbase + xj;", *self.em.render_stores(self.k, self.r_stores, scope)]

        body = render(inner)
        loop = f"for ({it} xj = 0; xj < xcount; ++xj)"
        simd = all(_stride(st.index, xlast) == 1 for st in self.r_stores)
        split = self.em.unmasked_copy(self.r_stores, inner, xlast, loop, render, body) if simd else None
        rbody = self.r_all("rindex")
        rscope.flush_into(rbody)
        if split is not None:
            rbody += split
        else:
            if simd:
                rbody.append("#pragma omp simd")
            append_block(rbody, loop, body)
        code: list[str] = []
        append_block(code, f"for ({it} rindex = {rs}; rindex < {re_}; ++rindex)", rbody)
        return code
