"""Writes the body of one Triton kernel from a ``ScheduledKernel`` and its ``Plan``.

``relu(x) * 2`` over a contiguous ``(s0, 64)`` float tensor (plan ``pointwise1d``,
int64 indices because ``s0`` is symbolic) becomes::

    @triton.jit(do_not_specialize=["s0"])
    def fxwrap_pointwise_0(in_ptr0, out_ptr0, s0, XBLOCK: tl.constexpr):
        s0 = s0.to(tl.int64)
        xnumel = 64*s0
        xoffset = tl.program_id(0).to(tl.int64) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tmp0 = tl.load(in_ptr0 + (xindex), xmask, other=0)
        tmp1 = tl.full([], 0.0, tl.float32)
        tmp2 = _fx_max(tmp0, tmp1)
        ...
        tl.store(out_ptr0 + (xindex), tmp4, xmask)

Every value is one local (equal ``Op``s are one local), declared in the outermost
scope where what it uses exists: in a looped reduction, values of the row (``x``
vars, earlier reductions) are hoisted out of the ``for roffset`` loops.  Block axes
are ``x`` (rows / elements), ``y`` (outer tile of a 2-D pointwise kernel) and ``r``
(the reduction); every load and store is masked by the masks of the axes its
pointer spans.

``KernelWriter`` is the engine every Triton body is written with, as ``cstyle.py`` is the C
family's: values, loads, stores, masks, index decomposition, the ``for roffset`` loop over a
row, and the pointwise bodies (``write_pointwise``).  The other plans are parts that write
through it, one file per concern, each given the writer: ``reduction.ReductionWriter``
(``persistent``, ``looped``, ``split-outer``), ``scan.ScanWriter`` (``scan``, ``split-scan``),
``lookback.LookbackScanWriter`` (``lookback-scan``), and the templates' epilogues
(``gemm.ProductKernel``).  ``emitter.write_body`` picks the part for a one-function plan.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.loops import (Op, Reduction, ScheduledKernel, acc_key, direct_indices, is_indirect, is_loop_var,
                            load_buffer, load_index, load_mask, loop_var_names, value_deps)
from fxwrap.targets.cstyle import EmitError  # the builder keeps such kernels as ATen externs
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.printer import IndexPrinter
from fxwrap.targets.cuda_triton.tiling import Plan
from fxwrap.targets.values import ValueWalker

RESERVED = frozenset("""xnumel ynumel rnumel xoffset yoffset roffset xindex yindex rindex xmask ymask rmask
xrmask rbase pid xblocks XBLOCK YBLOCK RBLOCK NSPLIT split rchunk rstart rend tl triton libdevice""".split())


class CodegenError(EmitError):
    """A kernel the Triton emitter cannot write; names the kernel, the target and a way out."""


class Scope:
    """A block of the kernel (the function, or one ``for roffset`` loop body)."""

    def __init__(self, parent: "Scope | None", provides=()):
        self.parent = parent
        self.provides = set(provides)
        self.lines: list[str] = []
        self.env: dict[Op, tuple[str, torch.dtype]] = {}
        self.accs: dict[tuple[str, int], tuple[str, torch.dtype]] = {}

    def chain(self):
        s, out = self, []
        while s is not None:
            out.append(s)
            s = s.parent
        return out[::-1]

    def _nearest(self, table: str, key):
        """``key``'s entry in the ``table`` dict (``env``, ``accs``) of this scope or of
        its nearest enclosing scope that has one; None where none has."""
        s = self
        while s is not None:
            entries = getattr(s, table)
            if key in entries:
                return entries[key]
            s = s.parent
        return None

    def lookup(self, op):
        return self._nearest("env", op)

    def acc(self, key):
        return self._nearest("accs", key)


class KernelWriter(ValueWalker):
    """The engine of one kernel's Triton body: ``KernelWriter(kernel, plan)`` writes values,
    loads and stores into ``Scope``s; ``write_pointwise()`` is the body of a pointwise plan,
    the parts (module doc) write the others through it.  ``helpers``: the jitted helpers the
    body calls (``_fx_max``...), with ``printer.helpers`` and ``ops.helpers``."""

    def __init__(self, kernel: ScheduledKernel, plan: Plan, target_name: str = "triton", intrinsics: tuple = ()):
        self.kernel = kernel
        self.plan = plan
        self.target_name = target_name
        self.printer = IndexPrinter(target_name)
        self.ops = O.OpRenderer(target_name, intrinsics)
        self.helpers: set[str] = set()
        self.count = 0
        self.zeros: dict[tuple, str] = {}
        self.axis_of = {v.name: axis for axis, vs in plan.groups.items() for v in vs}
        self.deps_cache: dict[Op, frozenset] = {}
        self.int64 = plan.index_dtype == "tl.int64"
        self.loads: dict[str, tuple[str, torch.dtype]] = {}
        self.stores: dict[str, tuple[str, torch.dtype]] = {}
        for i, b in enumerate(kernel.outputs):
            self.stores.setdefault(b.name, (f"out_ptr{i}", b.dtype))
            self.loads.setdefault(b.name, (f"out_ptr{i}", b.dtype))
        for i, b in enumerate(kernel.inputs):
            self.loads[b.name] = (f"in_ptr{i}", b.dtype)
        self.used_vars = self._used_vars()
        for s in kernel.size_symbols:
            if s.name in RESERVED or s.name.startswith(("tmp", "in_ptr", "out_ptr", "_")) \
                    or not s.name.isidentifier() or is_loop_var(s):
                raise CodegenError(f"size symbol {s.name!r} of kernel {kernel.name} clashes with a "
                                   f"name of the Triton emitter (target {target_name})")

    # ------------------------------------------------------------------ analysis
    def _used_vars(self) -> set[str]:
        names: set[str] = set()

        roots = [r.value for r in self.kernel.reductions] + [op for s in self.kernel.stores for op in s.roots()]
        for expr in [e for st in self.kernel.stores for e in st.index_exprs()] + \
                [e for root in roots for e in direct_indices(root)]:
            names.update(loop_var_names(expr))
        return names

    def deps(self, op: Op) -> frozenset:
        return value_deps(op, self.deps_cache)

    def axes(self, deps) -> frozenset:
        out = set()
        for d in deps:
            if isinstance(d, tuple):
                out.add("x")
            else:
                out.add(self.axis_of[d])
        return frozenset(out)

    def expr_axes(self, expr) -> frozenset:
        if is_indirect(expr):
            return self.axes(self.deps(expr))
        return self.axes(loop_var_names(expr))

    # ------------------------------------------------------------------ naming
    def fresh(self, prefix="tmp") -> str:
        name = f"{prefix}{self.count}"
        self.count += 1
        return name

    def shape(self, axes) -> str:
        dims = [f"{a.upper()}BLOCK" if a in axes else "1" for a in self.plan.axes]
        return "[" + ", ".join(dims) + "]"

    def zero(self, axes) -> str:
        key = tuple(a for a in self.plan.axes if a in axes)
        if key not in self.zeros:
            self.zeros[key] = f"_zero_{''.join(key)}"
        return self.zeros[key]

    def mask_of(self, axes) -> str | None:
        masks = [f"{a}mask" for a in self.plan.axes if a in axes]
        return " & ".join(masks) if masks else None

    def idx(self, expr) -> str:
        return self.printer.render(expr)

    # ------------------------------------------------------------------ values
    def home(self, scope: Scope, op: Op) -> Scope:
        need = set(self.deps(op))
        have: set = set()
        for s in scope.chain():
            have |= s.provides
            if need <= have:
                return s
        raise CodegenError(f"kernel {self.kernel.name}: value {op.op} needs {sorted(map(str, need - have))}, "
                           "which are not available where it is used (target "
                           f"{self.target_name})")

    # the shared value walk (``targets.values.ValueWalker.value(scope, op)``): its hooks
    def value_home(self, scope: Scope, op: Op) -> Scope:
        return self.home(scope, op)

    def value_acc(self, home: Scope, op: Op) -> tuple[str, bool]:
        key = acc_key(op)
        bound = home.acc(key)
        if bound is None:
            raise CodegenError(f"kernel {self.kernel.name}: acc {key} is read before reduction "
                               f"{key[0]!r} has a result")
        name, dtype = bound
        if dtype == op.dtype or O.compute_dtype(dtype) == O.compute_dtype(op.dtype) and op.dtype not in O.HALF:
            return name, True
        return O.cast(name, dtype, op.dtype), False

    def value_load(self, home: Scope, op: Op) -> str:
        text = self.load(home, op)
        if self.loads.get(load_buffer(op), (None, None))[1] == torch.bool:
            return text  # a bool buffer loads as int1 in both
        return self._scalar_bool(op, text)

    def value_const(self, op: Op) -> str:
        return O.const_literal(op.arg, op.dtype)

    def value_index(self, op: Op) -> str:
        e = op.arg
        if e.is_Integer:
            return O.const_literal(int(e), op.dtype)
        src = torch.int64 if self.int64 else torch.int32
        return O.cast(f"({self.idx(e)})", src, op.dtype)

    def value_op(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        if op.op == "index_check":  # checked in the lanes that hold elements only
            lanes = self.mask_of(self.axes(self.deps(op)))
            args = [*args, lanes] if lanes else args
        try:
            if op.op == "intrinsic":  # the target's own op (fxwrap/ir/intrinsics.py)
                return self.ops.intrinsic(op.arg, op.dtype, args, arg_dtypes)
            return self._scalar_bool(op, self.ops.op(op.op, op.dtype, args, arg_dtypes))
        except O.OpError as e:
            raise CodegenError(f"{e} (kernel {self.kernel.name})") from None

    def _scalar_bool(self, op: Op, expr: str) -> str:
        """``expr`` relabelled for Triton's interpreter where ``op`` is a bool on no axis
        (``ops.scalar_bool``); a local already declared needs nothing."""
        if op.dtype != torch.bool or self.deps(op) or expr.isidentifier():
            return expr
        return O.scalar_bool(expr)

    def value_local(self, home: Scope) -> str:
        return self.fresh()

    def value_declaration(self, name: str, dtype: torch.dtype, expr: str) -> str:
        return f"{name} = {expr}"

    def load(self, scope: Scope, op: Op) -> str:
        buf, index = load_buffer(op), load_index(op)
        if buf not in self.loads:
            raise CodegenError(f"load of {buf!r}: not an input or output of kernel {self.kernel.name} "
                               f"(target {self.target_name})")
        ptr, dtype = self.loads[buf]
        if is_indirect(index):
            off = self.value(scope, index)
        else:
            off = self.idx(index)
        axes = set(self.expr_axes(index))
        extra = None
        mop = load_mask(op)
        if mop is not None:
            extra = O.cast(self.value(scope, mop), mop.dtype, torch.bool)
            maxes = self.axes(self.deps(mop))
            if not maxes <= axes:
                axes |= maxes
                off = f"{off} + {self.zero(axes)}"
        mask = self.mask_of(axes)
        if extra is not None:
            mask = f"{mask} & {extra}" if mask else extra
        if mask:
            text = f"tl.load({ptr} + ({off}), {mask}, other=0)"
        else:
            text = f"tl.load({ptr} + ({off}))"
        if dtype in O.HALF:
            text = f"{text}.to(tl.float32)"
        return O.cast(text, dtype, op.dtype)

    def store(self, scope: Scope, st, level_axes) -> None:
        if st.buffer not in self.stores:
            raise CodegenError(f"kernel {self.kernel.name} stores to {st.buffer!r}, which is not one of "
                               f"its outputs {[b.name for b in self.kernel.outputs]}")
        ptr, dtype = self.stores[st.buffer]
        v = self.value(scope, st.value)
        v = O.cast(v, st.value.dtype, dtype)
        if dtype in O.HALF:
            v = f"{v}.to({O.TL_TYPES[dtype]})"
        # an indexed store's offset is a value of the kernel (as an indirect load's)
        off = self.value(scope, st.index) if st.indexed else self.idx(st.index)
        if set(self.expr_axes(st.index)) != set(level_axes):
            off = f"{off} + {self.zero(level_axes)}"
        mask = self.mask_of(level_axes)
        if st.mode == "add":  # each addition whole where two lanes reach one element
            scope.lines.append(f"tl.atomic_add({ptr} + ({off}), {v}, {mask}, sem='relaxed')" if mask
                               else f"tl.atomic_add({ptr} + ({off}), {v}, sem='relaxed')")
            return
        scope.lines.append(f"tl.store({ptr} + ({off}), {v}, {mask})" if mask
                           else f"tl.store({ptr} + ({off}), {v})")

    # ------------------------------------------------------------------ structure
    def numel(self, ranges) -> str:
        if not ranges:
            return "1"
        return self.idx(sympy.Mul(*[sympy.sympify(r) for r in ranges]))

    def decompose(self, linear: str, vars_, ranges) -> list[str]:
        out = []
        for i, v in enumerate(vars_):
            if v.name not in self.used_vars:
                continue
            later = sympy.Mul(*[sympy.sympify(r) for r in ranges[i + 1:]]) if i + 1 < len(ranges) else sympy.Integer(1)
            expr = linear if later == 1 else f"{linear} // ({self.idx(later)})"
            if i > 0:
                expr = f"({expr}) % ({self.idx(ranges[i])})"
            out.append(f"{v.name} = {expr}")
        return out

    def pid(self) -> str:
        return "tl.program_id(0).to(tl.int64)" if self.int64 else "tl.program_id(0)"

    def helper(self, name: str) -> str:
        """``name``, a jitted helper of ``ops.helper_source`` the body calls, recorded."""
        self.helpers.add(name)
        return name

    def reduction_local(self, red: Reduction, stem: str = "_red") -> str:
        """Locals of a reduction (a scan: ``stem`` ``_scan``) are named by its position in the
        kernel (``_red0``), not by its global name, so kernels equal up to names have equal bodies."""
        for i, r in enumerate(self.kernel.reductions):
            if r.name == red.name:
                return f"{stem}{i}"
        raise CodegenError(f"kernel {self.kernel.name}: reduction {red.name!r} is not one of its reductions")

    def function_scope(self, axes) -> Scope:
        """The scope of a function's top level, where the loop variables of ``axes`` (names of
        the plan's groups) exist."""
        return Scope(None, provides=[v.name for axis in axes for v in self.plan.groups[axis]])

    def size_casts(self) -> list[str]:
        """The size arguments widened to int64 where the plan's indices are (first lines of a body)."""
        return [f"{s.name} = {s.name}.to(tl.int64)" for s in self.kernel.size_symbols] if self.int64 else []

    def block_lanes(self, block: str = "RBLOCK") -> str:
        """The lane offsets ``[1, block]`` of an inner block (``rbase``), in the plan's index dtype."""
        return f"tl.arange(0, {block})[None, :]" + (".to(tl.int64)" if self.int64 else "")

    def row_loop(self, loop: Scope, tail: list[str], start: str = "0", end: str = "rnumel") -> list[str]:
        """The ``for roffset`` loop over a row's ``RBLOCK`` steps from ``start`` to ``end``: the
        r lanes, their masks and vars, then ``loop``'s lines and ``tail``."""
        body = ["rindex = roffset + rbase", f"rmask = rindex < {end}", "xrmask = xmask & rmask",
                *self.decompose("rindex", self.plan.groups["r"], self.plan.ranges["r"])]
        body += loop.lines + tail
        return [f"for roffset in range({start}, {end}, RBLOCK):", *("    " + ln for ln in body)]

    def with_zeros(self, body: list[str]) -> list[str]:
        """``body`` after the declarations of the zero blocks it used (they use the BLOCK
        constexprs only), which are then forgotten: the next function declares its own."""
        zeros = [f"{name} = tl.full({self.shape(key)}, 0, {self.plan.index_dtype})"
                 for key, name in sorted(self.zeros.items())]
        self.zeros = {}
        return zeros + body

    def zero_axes(self) -> set[str]:
        """The axes of the zero blocks the body used since the last ``with_zeros``."""
        return {axis for key in self.zeros for axis in key}

    # ------------------------------------------------------------------ pointwise
    def write_pointwise(self) -> list[str]:
        """The function body (without the ``def`` line) of plan ``pointwise1d`` or ``pointwise2d``."""
        top = self.function_scope(self.plan.groups)
        body = self.size_casts()
        if self.plan.kind == "pointwise1d":
            body += self._setup_pointwise1d()
            level = ("x",)
        else:
            body += self._setup_pointwise2d()
            level = ("y", "x")
        for st in self.kernel.stores:
            self.store(top, st, level)
        return self.with_zeros(body + top.lines)

    def _setup_pointwise1d(self) -> list[str]:
        p = self.plan
        return [f"xnumel = {self.numel(p.ranges['x'])}",
                f"xoffset = {self.pid()} * XBLOCK",
                "xindex = xoffset + tl.arange(0, XBLOCK)",
                "xmask = xindex < xnumel",
                *self.decompose("xindex", p.groups["x"], p.ranges["x"])]

    def _setup_pointwise2d(self) -> list[str]:
        p = self.plan
        return [f"ynumel = {self.numel(p.ranges['y'])}",
                f"xnumel = {self.numel(p.ranges['x'])}",
                f"pid = {self.pid()}",
                "xblocks = (xnumel + XBLOCK - 1) // XBLOCK",
                "yoffset = (pid // xblocks) * YBLOCK",
                "xoffset = (pid % xblocks) * XBLOCK",
                "yindex = yoffset + tl.arange(0, YBLOCK)[:, None]",
                "ymask = yindex < ynumel",
                "xindex = xoffset + tl.arange(0, XBLOCK)[None, :]",
                "xmask = xindex < xnumel",
                *self.decompose("yindex", p.groups["y"], p.ranges["y"]),
                *self.decompose("xindex", p.groups["x"], p.ranges["x"])]
