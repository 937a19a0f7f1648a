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
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.loops import (Op, OpCode, Reduction, ScheduledKernel, acc_key, direct_indices, is_indirect,
                            is_loop_var, load_buffer, load_index, load_mask, loop_var_names, split_stores,
                            value_deps, walk)
from fxwrap.targets.cstyle import EmitError  # the builder keeps such kernels as ATen externs
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.printer import IndexPrinter
from fxwrap.targets.cuda_triton.tiling import Plan
from fxwrap.targets.values import ValueWalker

RESERVED = frozenset("""xnumel ynumel rnumel xoffset yoffset roffset xindex yindex rindex xmask ymask rmask
xrmask rbase pid xblocks XBLOCK YBLOCK RBLOCK NSPLIT split rchunk rstart rend tl triton libdevice""".split())
BIG_INDEX = 2 ** 62


class CodegenError(EmitError):
    """A kernel the Triton emitter cannot write; names the kernel, the target and a way out."""


def _deviation(value: str, mean: str) -> str:
    """Welford's ``value - mean``, exactly 0 where a finite value equals the mean.

    On the GPU Triton contracts a product's ``value - mean`` into an FMA, whose result
    is the product's rounding error where eager's is 0: the variance of one element was
    ``inf`` (m2 > 0 divided by 0) where eager's is NaN.  Times 0 the difference is 0 and
    an infinite value's ``inf - inf`` stays NaN, as in eager's Welford::

        tl.where(tmp7 == _red0_mean, (tmp7 - _red0_mean) * 0.0, tmp7 - _red0_mean)
    """
    return f"tl.where({value} == {mean}, ({value} - {mean}) * 0.0, {value} - {mean})"


class _Scope:
    """A block of the kernel (the function, or one ``for roffset`` loop body)."""

    def __init__(self, parent: "_Scope | None", provides=()):
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
    """``KernelWriter(kernel, plan).write() -> (function lines, helper names, params)``."""

    def __init__(self, kernel: ScheduledKernel, plan: Plan, target_name: str = "triton", intrinsics: tuple = ()):
        self.k = kernel
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

        roots = [r.value for r in self.k.reductions] + [op for s in self.k.stores for op in s.roots()]
        for expr in [e for st in self.k.stores for e in st.index_exprs()] + \
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
    def home(self, scope: _Scope, op: Op) -> _Scope:
        need = set(self.deps(op))
        have: set = set()
        for s in scope.chain():
            have |= s.provides
            if need <= have:
                return s
        raise CodegenError(f"kernel {self.k.name}: value {op.op} needs {sorted(map(str, need - have))}, "
                           "which are not available where it is used (target "
                           f"{self.target_name})")

    # the shared value walk (``targets.values.ValueWalker.value(scope, op)``): its hooks
    def value_home(self, scope: _Scope, op: Op) -> _Scope:
        return self.home(scope, op)

    def value_acc(self, home: _Scope, op: Op) -> tuple[str, bool]:
        key = acc_key(op)
        bound = home.acc(key)
        if bound is None:
            raise CodegenError(f"kernel {self.k.name}: acc {key} is read before reduction "
                               f"{key[0]!r} has a result")
        name, dtype = bound
        if dtype == op.dtype or O.compute_dtype(dtype) == O.compute_dtype(op.dtype) and op.dtype not in O.HALF:
            return name, True
        return O.cast(name, dtype, op.dtype), False

    def value_load(self, home: _Scope, op: Op) -> str:
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
            raise CodegenError(f"{e} (kernel {self.k.name})") from None

    def _scalar_bool(self, op: Op, expr: str) -> str:
        """``expr`` relabelled for Triton's interpreter where ``op`` is a bool on no axis
        (``ops.scalar_bool``); a local already declared needs nothing."""
        if op.dtype != torch.bool or self.deps(op) or expr.isidentifier():
            return expr
        return O.scalar_bool(expr)

    def value_local(self, home: _Scope) -> str:
        return self.fresh()

    def value_declaration(self, name: str, dtype: torch.dtype, expr: str) -> str:
        return f"{name} = {expr}"

    def load(self, scope: _Scope, op: Op) -> str:
        buf, index = load_buffer(op), load_index(op)
        if buf not in self.loads:
            raise CodegenError(f"load of {buf!r}: not an input or output of kernel {self.k.name} "
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

    def store(self, scope: _Scope, st, level_axes) -> None:
        if st.buffer not in self.stores:
            raise CodegenError(f"kernel {self.k.name} stores to {st.buffer!r}, which is not one of "
                               f"its outputs {[b.name for b in self.k.outputs]}")
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

    def write(self) -> list[str]:
        """The function body (without the ``def`` line)."""
        top = _Scope(None, provides=self._top_provides())
        body: list[str] = []
        if self.int64:
            body += [f"{s.name} = {s.name}.to(tl.int64)" for s in self.k.size_symbols]
        kind = self.plan.kind
        if kind == "pointwise1d":
            body += self._setup_pointwise1d()
            for st in self.k.stores:
                self.store(top, st, ("x",))
            body += top.lines
        elif kind == "pointwise2d":
            body += self._setup_pointwise2d()
            for st in self.k.stores:
                self.store(top, st, ("y", "x"))
            body += top.lines
        elif kind == "scan":
            body += self._scan_rows(top)
        else:
            body += self._reduction(top)
        zeros = [f"{name} = tl.full({self.shape(key)}, 0, {self.plan.index_dtype})"
                 for key, name in sorted(self.zeros.items())]
        # zeros go after the block setup (they use the BLOCK constexprs only)
        return zeros + body

    # ------------------------------------------------------------------ split-outer
    def workspace_dtypes(self) -> list[torch.dtype]:
        """The dtype of each workspace of partials (split-outer), reduction by reduction: its
        accumulator's (``int8`` for any/all); a Welford reduction has three (mean, M2, count)."""
        out = []
        for red in self.k.reductions:
            T = self._acc_dtype(red)
            out += [T] * 3 if red.kind == "welford" else [torch.int8 if T == torch.bool else T]
        return out

    def _workspace_slots(self) -> list[list[int]]:
        """Per reduction, the indices of its workspaces (``ws_ptr{i}``)."""
        slots, at = [], 0
        for red in self.k.reductions:
            n = 3 if red.kind == "welford" else 1
            slots.append(list(range(at, at + n)))
            at += n
        return slots

    def write_split(self) -> tuple[list[str], list[str]]:
        """The bodies of the two kernels of a split-outer reduction: partials, combine.

        Both take ``(in_ptr*, out_ptr*, ws_ptr*, sizes)``; ``ws_ptr{i}`` holds the
        ``[NSPLIT, xnumel]`` partials of reduction ``i``."""
        p = self.plan
        casts = [f"{s.name} = {s.name}.to(tl.int64)" for s in self.k.size_symbols] if self.int64 else []
        rnames = {v.name for v in p.groups["r"]}
        reds = list(self.k.reductions)
        if len({r.name for r in reds}) != len(reds):
            raise CodegenError(f"kernel {self.k.name}: two reductions share a name")
        # ---- kernel A: one program per (x tile, r chunk)
        self.zeros = {}
        top = _Scope(None, provides=[v.name for v in p.groups["x"]])
        rbase = "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if self.int64 else "")
        a = [f"xnumel = {self.numel(p.ranges['x'])}",
             f"rnumel = {self.numel(p.ranges['r'])}",
             f"pid = {self.pid()}",
             "xblocks = (xnumel + XBLOCK - 1) // XBLOCK",
             "xoffset = (pid % xblocks) * XBLOCK",
             "split = pid // xblocks",
             "rchunk = ((rnumel + NSPLIT - 1) // NSPLIT + RBLOCK - 1) // RBLOCK * RBLOCK",
             "rstart = split * rchunk",
             "rend = tl.minimum(rstart + rchunk, rnumel)",
             "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
             "xmask = xindex < xnumel",
             f"rbase = {rbase}",
             *self.decompose("xindex", p.groups["x"], p.ranges["x"])]
        loop = _Scope(top, provides=rnames)
        init, update, finish = [], [], []
        for red in reds:
            i, u, f = self._looped_reduction(loop, red)
            init += i
            update += u
            finish.append(f)
        r_stores, x_stores = split_stores(self.k.stores, p.groups["r"])
        for st in r_stores:  # no reduction result in them (see Planner._splittable)
            self.store(loop, st, ("x", "r"))
        a += top.lines
        top.lines.clear()
        a += init
        a += self._loop(loop, update, start="rstart", end="rend")
        dtypes = self.workspace_dtypes()
        for (fin_lines, results), slots in zip(finish, self._workspace_slots()):
            a += fin_lines
            for i, v in zip(slots, results):  # a Welford reduction's mean, M2 and count
                if dtypes[i] == torch.int8:
                    v = f"{v}.to(tl.int8)"
                a.append(f"tl.store(ws_ptr{i} + (split * xnumel + xindex), {v}, xmask)")
        zeros_a = [f"{name} = tl.full({self.shape(key)}, 0, {self.plan.index_dtype})"
                   for key, name in sorted(self.zeros.items())]
        body_a = casts + zeros_a + a
        # ---- kernel B: each program loads the [XBLOCK, NSPLIT] tile of partials of its x
        # (one load, NSPLIT a power of two) and reduces it along the splits: a fixed tree
        # for a given NSPLIT (bitwise reproducible, no atomics), then the x-indexed stores
        self.zeros = {}
        top = _Scope(None, provides=[v.name for v in p.groups["x"]])
        b = [f"xnumel = {self.numel(p.ranges['x'])}",
             f"xoffset = {self.pid()} * XBLOCK",
             "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
             "xmask = xindex < xnumel",
             "_sp = tl.arange(0, NSPLIT)[None, :]",
             *self.decompose("xindex", p.groups["x"], p.ranges["x"])]
        for red, slots in zip(reds, self._workspace_slots()):
            kind = red.kind
            T = self._acc_dtype(red)
            base = self.red_local(red)
            parts = [f"tl.load(ws_ptr{i} + (_sp * xnumel + xindex), xmask, other=0)" for i in slots]
            if kind == "welford":  # Chan's combine of the (mean, M2, count) partials
                fn = self._combine_name("welford")
                b += [f"{base}_rmean, {base}_rm2, {base}_rn = tl.reduce(({', '.join(parts)}), 1, {fn})",
                      f"{base}_rmean = {base}_rmean[:, None]", f"{base}_rm2 = {base}_rm2[:, None]",
                      f"{base}_rn = {base}_rn[:, None]"]
                self._bind(top, red, [f"{base}_rmean", f"{base}_rm2", f"{base}_rn"], b)
                continue
            part = parts[0]
            if kind == "sum":
                b.append(f"{base} = tl.sum({part}, 1)[:, None]")
            elif kind in ("any", "all"):  # int8 partials, 0 or 1
                fn = "tl.max" if kind == "any" else "tl.min"
                b.append(f"{base} = ({fn}({part}.to(tl.int32), 1) != 0)[:, None]")
            else:
                b.append(f"{base} = tl.reduce({part}, 1, {self._combine_name(kind)})[:, None]")
            if T == torch.bool and kind not in ("any", "all"):
                b.append(f"{base} = {base} != 0")
            self._bind(top, red, [base], b)
        for st in x_stores:
            self.store(top, st, ("x",))
        b += top.lines
        zeros_b = [f"{name} = tl.full({self.shape(key)}, 0, {self.plan.index_dtype})"
                   for key, name in sorted(self.zeros.items())]
        if any("RBLOCK" in z for z in zeros_b):
            raise CodegenError(f"kernel {self.k.name}: the combine kernel of a split reduction "
                               "needs an r-shaped value")
        body_b = casts + zeros_b + b
        return body_a, body_b

    # ------------------------------------------------------------------ scans
    def _scan_setup(self, split: bool) -> list[str]:
        p = self.plan
        rbase = "tl.arange(0, RBLOCK)[None, :]" + (".to(tl.int64)" if self.int64 else "")
        out = [f"xnumel = {self.numel(p.ranges['x'])}", f"rnumel = {self.numel(p.ranges['r'])}"]
        if split:
            out += ["nchunks = (rnumel + SCAN_CHUNK - 1) // SCAN_CHUNK",
                    f"pid = {self.pid()}",
                    "chunk = pid % nchunks",
                    "xoffset = (pid // nchunks) * XBLOCK",
                    "rstart = chunk * SCAN_CHUNK",
                    "rend = tl.minimum(rstart + SCAN_CHUNK, rnumel)"]
        else:
            out.append(f"xoffset = {self.pid()} * XBLOCK")
        out += ["xindex = xoffset + tl.arange(0, XBLOCK)[:, None]", "xmask = xindex < xnumel",
                f"rbase = {rbase}", *self.decompose("xindex", p.groups["x"], p.ranges["x"])]
        return out

    def _scan_fields(self, red: Reduction) -> list[tuple[str, torch.dtype, str]]:
        """The running state of one scan: ``(local suffix, dtype, initial value)`` per field."""
        T = O.compute_dtype(red.dtype)
        if red.kind in ("cummax", "cummin"):
            return [("", T, self._init("max" if red.kind == "cummax" else "min", T)), ("_ix", torch.int64, "-1")]
        init = {"cumsum": "0", "cumprod": "1", "logcumsumexp": 'float("-inf")'}[red.kind]
        return [("", T, init)]

    def _scan_combine(self, red: Reduction) -> str:
        name = {"cumsum": "_fx_add", "cumprod": "_fx_mul", "logcumsumexp": "_fx_logaddexp",
                "cummax": "_fx_cummax", "cummin": "_fx_cummin"}[red.kind]
        self.helpers.add(name)
        return name

    def _scan_carry_init(self, red: Reduction) -> list[str]:
        base = self.scan_local(red)
        return [f"{base}{sfx}_c = tl.full([XBLOCK, 1], {init}, {O.TL_TYPES[T]})"
                for sfx, T, init in self._scan_fields(red)]

    def scan_local(self, red: Reduction) -> str:
        return self.red_local(red).replace("_red", "_scan")

    def _scan_step(self, loop: _Scope, red: Reduction, totals_only: bool = False) -> list[str]:
        """Lines of one ``RBLOCK`` step of a row: the block's scan combined with the carry
        (``{base}``, bound as the scan's acc in ``loop``; not with ``totals_only``), then
        the carry moved past the block."""
        base = self.scan_local(red)
        fields = self._scan_fields(red)
        T = fields[0][1]
        v = self.value(loop, red.value)
        v = O.cast(v, red.value.dtype, red.dtype)
        fn = self._scan_combine(red)
        lines = [f"{base}_v = tl.where(xrmask, {v}, tl.full([], {fields[0][2]}, {O.TL_TYPES[T]}))"]
        if len(fields) == 2:  # value and index
            lines.append(f"{base}_i = tl.where(xrmask, rindex.to(tl.int64), -1)")
            if not totals_only:
                lines += [f"{base}_sv, {base}_si = tl.associative_scan(({base}_v, {base}_i), 1, {fn})",
                          f"{base}, {base}_ix = {fn}({base}_c, {base}_ix_c, {base}_sv, {base}_si)"]
            lines += [f"{base}_rv, {base}_ri = tl.reduce(({base}_v, {base}_i), 1, {fn})",
                      f"{base}_c, {base}_ix_c = {fn}({base}_c, {base}_ix_c, {base}_rv[:, None], {base}_ri[:, None])"]
            fields_bound = {0: (f"{base}_ix", torch.int64), 1: (base, red.dtype)}
        else:
            # (tl.cumsum / tl.sum are the same scan and reduction, but fail under Triton's
            # interpreter once the module was imported without TRITON_INTERPRET)
            scan = f"tl.associative_scan({base}_v, 1, {fn})"
            total = f"tl.reduce({base}_v, 1, {fn})[:, None]"
            if not totals_only:
                lines.append(f"{base} = {fn}({base}_c, {scan})")
            lines.append(f"{base}_c = {fn}({base}_c, {total})")
            fields_bound = {0: (base, red.dtype)}
        if not totals_only:
            for f, bound in fields_bound.items():
                loop.accs[(red.name, f)] = bound
            loop.provides.add(("acc", red.name))
        return lines

    def _scan_loop(self, top: _Scope, totals_only: bool = False, split: bool = False) -> list[str]:
        """Every scan's carry, then the loop over the row's ``RBLOCK`` steps: the scans,
        then (unless ``totals_only``) every store of the kernel."""
        rnames = {v.name for v in self.plan.groups["r"]}
        loop = _Scope(top, provides=rnames)
        init: list[str] = []
        for red in self.k.reductions:
            init += self._scan_carry_init(red)
        for red in self.k.reductions:
            step = self._scan_step(loop, red, totals_only)
            loop.lines += step
        if not totals_only:
            for st in self.k.stores:
                self.store(loop, st, ("x", "r"))
        out = top.lines + init
        top.lines = []
        if split:
            return out + self._loop(loop, [], start="rstart", end="rend")
        return out + self._loop(loop, [])

    def _scan_rows(self, top: _Scope) -> list[str]:
        """Plan ``scan``: one program per row, a carry across its ``RBLOCK`` steps."""
        return self._scan_setup(split=False) + self._scan_loop(top)

    def workspace_fields(self) -> list[tuple[int, str, torch.dtype]]:
        """Split scan: ``(reduction position, local suffix, dtype)`` of each workspace
        ``ws_ptr{i}`` (one per field of each scan's state, ``[xnumel, nchunks]``)."""
        return [(k, sfx, T) for k, red in enumerate(self.k.reductions) for sfx, T, _ in self._scan_fields(red)]

    def write_split_scan(self) -> tuple[list[str], list[str]]:
        """Plan ``split-scan``: the bodies of the two kernels of a long-row scan, each
        taking ``(in_ptr*, out_ptr*, ws_ptr*, sizes)``, one program per (row, chunk of
        ``SCAN_CHUNK`` elements):

        1. ``_totals``: the chunk's total (the scan state past its last element) into
           ``ws[row * nchunks + chunk]``;
        2. the kernel itself: the chunk's carry, the totals of the chunks before it
           combined in order (``CBLOCK`` at a time), then the chunk's scan from it and
           every store."""
        ws = self.workspace_fields()
        casts = [f"{s.name} = {s.name}.to(tl.int64)" for s in self.k.size_symbols] if self.int64 else []
        at = "(xindex * nchunks + chunk)"
        # 1. totals
        top = _Scope(None, provides=self._top_provides())
        body_a = casts + self._scan_setup(split=True) + self._scan_loop(top, totals_only=True, split=True)
        for i, (k, sfx, T) in enumerate(ws):
            base = self.scan_local(self.k.reductions[k])
            body_a.append(f"tl.store(ws_ptr{i} + {at}, {base}{sfx}_c, xmask)")
        body_a = self._with_zeros(body_a)
        # 2. each chunk's carry from the totals before it, then its scan and the stores
        self.zeros = {}
        top = _Scope(None, provides=self._top_provides())
        body_b = casts + self._scan_setup(split=True)
        body_b.append("cbase = tl.arange(0, CBLOCK)[None, :]" + (".to(tl.int64)" if self.int64 else ""))
        carry: list[str] = []
        for k, red in enumerate(self.k.reductions):
            base = self.scan_local(red)
            fields = self._scan_fields(red)
            fn = self._scan_combine(red)
            ptrs = [i for i, (kk, _, _) in enumerate(ws) if kk == k]
            names = [f"{base}{sfx}" for sfx, _, _ in fields]
            loop = ["cindex = coffset + cbase", "cmask = xmask & (cindex < chunk)"]
            loop += [f"{n}_t = tl.load(ws_ptr{i} + (xindex * nchunks + cindex), cmask, other={init})"
                     for i, n, (_, _, init) in zip(ptrs, names, fields)]
            if len(fields) == 2:
                loop += [f"{base}_rv, {base}_ri = tl.reduce(({names[0]}_t, {names[1]}_t), 1, {fn})",
                         f"{names[0]}_p, {names[1]}_p = {fn}({names[0]}_p, {names[1]}_p, {base}_rv[:, None], "
                         f"{base}_ri[:, None])"]
            else:
                loop.append(f"{names[0]}_p = {fn}({names[0]}_p, tl.reduce({names[0]}_t, 1, {fn})[:, None])")
            carry += [f"{n}_p = tl.full([XBLOCK, 1], {init}, {O.TL_TYPES[T]})" for n, (_, T, init) in zip(names, fields)]
            carry.append("for coffset in range(0, chunk, CBLOCK):")
            carry += ["    " + ln for ln in loop]
        loop_lines = self._scan_loop(top, split=True)
        # the carries start from the chunks before, not from the initial state
        starts = {f"{self.scan_local(self.k.reductions[k])}{sfx}" for k, sfx, _ in ws}
        fixed = []
        for ln in loop_lines:
            name = ln.split(" = ", 1)[0]
            if name.endswith("_c") and name[:-2] in starts and "tl.full([XBLOCK, 1]" in ln:
                ln = f"{name} = {name[:-2]}_p"
            fixed.append(ln)
        body_b = self._with_zeros(body_b + carry + fixed)
        return body_a, body_b

    def _with_zeros(self, body: list[str]) -> list[str]:
        zeros = [f"{name} = tl.full({self.shape(key)}, 0, {self.plan.index_dtype})"
                 for key, name in sorted(self.zeros.items())]
        return zeros + body if zeros else body

    def _top_provides(self):
        if self.plan.kind in ("pointwise1d", "pointwise2d", "persistent"):
            return [v.name for vs in self.plan.groups.values() for v in vs]
        return [v.name for v in self.plan.groups["x"]]

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

    # ------------------------------------------------------------------ reductions
    def _reduction(self, top: _Scope) -> list[str]:
        p = self.plan
        rbase = "tl.arange(0, RBLOCK)[None, :]"
        if self.int64:
            rbase += ".to(tl.int64)"
        out = [f"xnumel = {self.numel(p.ranges['x'])}",
               f"rnumel = {self.numel(p.ranges['r'])}",
               f"xoffset = {self.pid()} * XBLOCK",
               "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
               "xmask = xindex < xnumel",
               f"rbase = {rbase}",
               *self.decompose("xindex", p.groups["x"], p.ranges["x"])]
        rnames = {v.name for v in p.groups["r"]}
        r_stores, x_stores = split_stores(self.k.stores, p.groups["r"])
        reds = list(self.k.reductions)
        names = [r.name for r in reds]
        if len(set(names)) != len(names):
            raise CodegenError(f"kernel {self.k.name}: two reductions share a name")
        if p.kind == "persistent":
            out += ["rindex = rbase", "rmask = rindex < rnumel", "xrmask = xmask & rmask",
                    *self.decompose("rindex", p.groups["r"], p.ranges["r"])]
            for red in reds:
                self._persistent_reduction(top, red)
            for st in r_stores:
                self.store(top, st, ("x", "r"))
            for st in x_stores:
                self.store(top, st, ("x",))
            return out + top.lines
        for group in self._passes(reds):
            init, update, finish = [], [], []
            loop = _Scope(top, provides=rnames)
            for red in group:
                a, b, c = self._looped_reduction(loop, red)
                init += a
                update += b
                finish.append((red, c))
            out += top.lines
            top.lines.clear()
            out += init
            out += self._loop(loop, update)
            for red, (fin_lines, results) in finish:
                out += fin_lines
                self._bind(top, red, results, out)
        if r_stores:
            loop = _Scope(top, provides=rnames)
            for st in r_stores:
                self.store(loop, st, ("x", "r"))
            out += top.lines
            top.lines.clear()
            out += self._loop(loop, [])
        for st in x_stores:
            self.store(top, st, ("x",))
        return out + top.lines

    def _loop(self, loop: _Scope, tail: list[str], start: str = "0", end: str = "rnumel") -> list[str]:
        body = ["rindex = roffset + rbase", f"rmask = rindex < {end}", "xrmask = xmask & rmask",
                *self.decompose("rindex", self.plan.groups["r"], self.plan.ranges["r"])]
        body += loop.lines + tail
        return [f"for roffset in range({start}, {end}, RBLOCK):", *("    " + ln for ln in body)]

    def _passes(self, reds: list[Reduction]):
        passes: list[list[Reduction]] = []
        seen: set[str] = set()
        for r in reds:
            reads = {acc_key(n)[0] for n in walk(r.value) if n.op == OpCode.ACC}
            if not reads <= seen:
                raise CodegenError(f"kernel {self.k.name}: reduction {r.name} reads acc "
                                   f"{sorted(reads - seen)}, which is not an earlier reduction")
            if passes and not reads & {q.name for q in passes[-1]}:
                passes[-1].append(r)
            else:
                passes.append([r])
            seen.add(r.name)
        return passes

    def red_local(self, red: Reduction) -> str:
        """Locals of a reduction are named by its position in the kernel (``_red0``), not
        by its global name, so kernels equal up to names have equal bodies."""
        for i, r in enumerate(self.k.reductions):
            if r.name == red.name:
                return f"_red{i}"
        raise CodegenError(f"kernel {self.k.name}: reduction {red.name!r} is not one of its reductions")

    # accumulator types, initial values and combine functions
    def _acc_dtype(self, red: Reduction) -> torch.dtype:
        if red.kind in ("any", "all"):
            return torch.bool
        if red.kind in ("argmax", "argmin"):
            return O.compute_dtype(red.value.dtype)
        return O.compute_dtype(red.dtype)

    def _init(self, kind: str, dtype: torch.dtype) -> str:
        if kind in ("sum", "welford"):
            return "0"
        if kind == "prod":
            return "1"
        if kind == "any":
            return "0"
        if kind == "all":
            return "1"
        lowest = kind in ("max", "argmax")
        if dtype == torch.bool:
            return "0" if lowest else "1"
        if dtype.is_floating_point:
            return 'float("-inf")' if lowest else 'float("inf")'
        info = torch.iinfo(dtype)
        return str(info.min if lowest else info.max)

    def _red_value(self, scope: _Scope, red: Reduction) -> str:
        v = self.value(scope, red.value)
        if red.kind in ("any", "all"):
            return O.cast(v, red.value.dtype, torch.bool)
        if red.kind in ("argmax", "argmin"):
            return v
        return O.cast(v, red.value.dtype, red.dtype)

    def _combine_name(self, kind: str) -> str:
        name = {"max": "_fx_max", "min": "_fx_min", "prod": "_fx_mul", "sum": "_fx_add",
                "argmax": "_fx_argmax", "argmin": "_fx_argmin", "welford": "_fx_welford"}[kind]
        self.helpers.add(name)
        return name

    def _persistent_reduction(self, top: _Scope, red: Reduction) -> None:
        v = self._red_value(top, red)
        kind = red.kind
        T = self._acc_dtype(red)
        tt = O.TL_TYPES[T]
        base = self.red_local(red)
        lines = top.lines
        if kind in ("sum", "prod", "max", "min"):
            lines.append(f"{base}_v = tl.where(xrmask, {v}, tl.full([], {self._init(kind, T)}, {tt}))")
            if kind == "sum":
                lines.append(f"{base} = tl.sum({base}_v, 1)[:, None]")
            else:
                lines.append(f"{base} = tl.reduce({base}_v, 1, {self._combine_name(kind)})[:, None]")
            results = [base]
        elif kind in ("any", "all"):
            fill = "0" if kind == "any" else "1"
            fn = "tl.max" if kind == "any" else "tl.min"
            lines.append(f"{base}_v = tl.where(xrmask, {v}, {fill}).to(tl.int32)")
            lines.append(f"{base} = ({fn}({base}_v, 1) != 0)[:, None]")
            results = [base]
        elif kind in ("argmax", "argmin"):
            lines.append(f"{base}_v = tl.where(xrmask, {v}, tl.full([], {self._init(kind, T)}, {tt}))")
            lines.append(f"{base}_i = tl.where(xrmask, rindex.to(tl.int64), {BIG_INDEX})")
            lines.append(f"{base}_rv, {base}_ri = tl.reduce(({base}_v, {base}_i), 1, "
                         f"{self._combine_name(kind)})")
            lines.append(f"{base}_ri = {base}_ri[:, None]")
            lines.append(f"{base}_rv = {base}_rv[:, None]")
            results = [f"{base}_ri", f"{base}_rv"]
        elif kind == "welford":
            lines.append(f"{base}_n = tl.sum(tl.where(xrmask, 1.0, 0.0).to({tt}), 1)[:, None]")
            lines.append(f"{base}_mean = tl.sum(tl.where(xrmask, {v}, 0.0).to({tt}), 1)[:, None] / "
                         f"tl.maximum({base}_n, 1.0)")
            lines.append(f"{base}_d = tl.where(xrmask, {_deviation(v, base + '_mean')}, 0.0).to({tt})")
            lines.append(f"{base}_m2 = tl.sum({base}_d * {base}_d, 1)[:, None]")
            results = [f"{base}_mean", f"{base}_m2", f"{base}_n"]
        else:
            raise CodegenError(f"reduction kind {kind!r} (kernel {self.k.name}, target {self.target_name})")
        self._bind(top, red, results, lines)

    def _looped_reduction(self, loop: _Scope, red: Reduction):
        """(init lines, loop update lines, result names) of one looped reduction."""
        kind = red.kind
        T = self._acc_dtype(red)
        tt = O.TL_TYPES[T]
        base = self.red_local(red)
        full = "[XBLOCK, RBLOCK]"
        v = self._red_value(loop, red)
        init, upd = [], []
        if kind in ("sum", "prod", "max", "min", "any", "all"):
            init.append(f"{base}_acc = tl.full({full}, {self._init(kind, T)}, {tt})")
            if kind in ("max", "min"):
                new = f"{self._combine_name(kind)}({base}_acc, {v})"
            else:
                new = {"sum": f"{base}_acc + {v}", "prod": f"{base}_acc * {v}",
                       "any": f"{base}_acc | {v}", "all": f"{base}_acc & {v}"}[kind]
            upd.append(f"{base}_acc = tl.where(xrmask, {new}, {base}_acc)")
            if kind == "sum":
                fin = [f"{base} = tl.sum({base}_acc, 1)[:, None]"]
            elif kind in ("any", "all"):
                fn = "tl.max" if kind == "any" else "tl.min"
                fin = [f"{base} = ({fn}({base}_acc.to(tl.int32), 1) != 0)[:, None]"]
            else:
                fin = [f"{base} = tl.reduce({base}_acc, 1, {self._combine_name(kind)})[:, None]"]
            return init, upd, (fin, [base])
        if kind in ("argmax", "argmin"):
            fn = self._combine_name(kind)
            init += [f"{base}_accv = tl.full({full}, {self._init(kind, T)}, {tt})",
                     f"{base}_acci = tl.full({full}, {BIG_INDEX}, tl.int64)"]
            upd += [f"{base}_nv, {base}_ni = {fn}({base}_accv, {base}_acci, {v}, rindex.to(tl.int64))",
                    f"{base}_accv = tl.where(xrmask, {base}_nv, {base}_accv)",
                    f"{base}_acci = tl.where(xrmask, {base}_ni, {base}_acci)"]
            fin = [f"{base}_rv, {base}_ri = tl.reduce(({base}_accv, {base}_acci), 1, {fn})",
                   f"{base}_ri = {base}_ri[:, None]", f"{base}_rv = {base}_rv[:, None]"]
            return init, upd, (fin, [f"{base}_ri", f"{base}_rv"])
        if kind == "welford":
            fn = self._combine_name("welford")
            # the count of a lane depends on its r only (rows masked off in x are never
            # stored), so it and its reciprocal are [1, RBLOCK]: one division per r lane a
            # step, not one per element (an IEEE float division is a dozen instructions,
            # and batch norm's statistics of a bf16 tensor have ~15 a element to stay at
            # the H100's bandwidth)
            init += [f"{base}_mean = tl.zeros({full}, {tt})", f"{base}_m2 = tl.zeros({full}, {tt})",
                     f"{base}_n = tl.zeros([1, RBLOCK], {tt})"]
            upd += [f"{base}_n = tl.where(rmask, {base}_n + 1, {base}_n)",
                    f"{base}_w = 1 / tl.maximum({base}_n, 1)",
                    f"{base}_d = {_deviation(v, base + '_mean')}",
                    f"{base}_mean1 = {base}_mean + {base}_d * {base}_w",
                    f"{base}_m21 = {base}_m2 + {base}_d * {_deviation(v, base + '_mean1')}",
                    f"{base}_mean = tl.where(xrmask, {base}_mean1, {base}_mean)",
                    f"{base}_m2 = tl.where(xrmask, {base}_m21, {base}_m2)"]
            fin = [f"{base}_rmean, {base}_rm2, {base}_rn = tl.reduce(({base}_mean, {base}_m2, "
                   f"tl.broadcast_to({base}_n, {full})), 1, {fn})",
                   f"{base}_rmean = {base}_rmean[:, None]", f"{base}_rm2 = {base}_rm2[:, None]",
                   f"{base}_rn = {base}_rn[:, None]"]
            return init, upd, (fin, [f"{base}_rmean", f"{base}_rm2", f"{base}_rn"])
        raise CodegenError(f"reduction kind {kind!r} (kernel {self.k.name}, target {self.target_name})")

    def _bind(self, scope: _Scope, red: Reduction, results, sink: list[str]) -> None:
        """Make ``acc(red.name, field)`` read ``results``; 16-bit results are rounded
        (the rounding line goes to ``sink``)."""
        kind = red.kind
        if kind in ("argmax", "argmin"):
            fields = {0: (results[0], torch.int64), 1: (results[1], red.value.dtype)}
        elif kind == "welford":
            fields = {i: (n, O.compute_dtype(red.dtype)) for i, n in enumerate(results)}
        elif kind in ("any", "all"):
            fields = {0: (results[0], torch.bool)}
        else:
            fields = {0: (results[0], red.dtype)}
            if red.dtype in O.HALF:
                rounded = f"{results[0]}_r"
                sink.append(f"{rounded} = {O.round16(results[0], red.dtype)}")
                fields = {0: (rounded, red.dtype)}
        for f, (name, dtype) in fields.items():
            scope.accs[(red.name, f)] = (name, dtype)
        scope.provides.add(("acc", red.name))
