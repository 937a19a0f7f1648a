"""Reductions of the Triton target: plans ``persistent``, ``looped`` and ``split-outer``.

``ReductionWriter(writer)`` writes, through the kernel's ``codegen.KernelWriter``, the body
of a kernel with reductions (``sum``, ``prod``, ``max``/``min``, ``argmax``/``argmin``,
``any``/``all``, ``welford``) and the stores after them:

* ``persistent``: the whole row in one ``[XBLOCK, RBLOCK]`` block, each reduction one
  ``tl.reduce`` (``write``);
* ``looped``: ``[XBLOCK, RBLOCK]`` accumulators over ``for roffset`` steps, reduced at the
  end; reductions that read no earlier one share a loop (``passes``)::

      _red0_acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
      for roffset in range(0, rnumel, RBLOCK):
          rindex = roffset + rbase
          ...
          _red0_acc = tl.where(xrmask, _red0_acc + tmp0, _red0_acc)
      _red0 = tl.sum(_red0_acc, 1)[:, None]

* ``split-outer``: two kernels, the partials of each (x tile, r chunk) into workspaces,
  then their combine (``write_split``).

An arg-reduction (``argmax``/``argmin``; ``max(dim)`` is one) costs a plain max's reads
and little more arithmetic: a lane keeps the first index of its best value, replaced only
by a strictly better later element (NaN beats any number, the first NaN stays), with the
index in the plan's index dtype; the lanes are then finished by two plain reductions, the
NaN-propagating max of their values and the least index among the lanes holding it
(``arg_of_lanes``)::

    _red0_take = xrmask & (_red0_accv == _red0_accv) & ~(tmp0 <= _red0_accv)
    _red0_accv = tl.where(_red0_take, tmp0, _red0_accv)
    _red0_acci = tl.where(_red0_take, rindex, _red0_acci)
    ...
    _red0_rv = tl.reduce(_red0_accv, 1, _fx_max)[:, None]
    _red0_ri = tl.min(tl.where((_red0_accv == _red0_rv) | (_red0_accv != _red0_accv), _red0_acci, 2147483647), 1)[:, None]

A lane's index starts at 0, the index of a row's first element: a lane that never took an
element keeps its identity value (``-inf`` for argmax) there, and can only win a row whose
every element is that value, whose answer is 0.  Split rows combine their chunks' (value,
first index) partials the same way.  A plain max (min) of the same values in the kernel
(``x.max(dim)``'s values, a softmax's max beside an argmax) is read from ``_rv``, not
reduced again (``computed_by``; in a split, the max's partials are the arg-reduction's).

A result is bound as the reduction's ``acc`` in the scope after it (``bind``): what the
stores and later reductions read.
"""
from __future__ import annotations

import torch

from fxwrap.ir.loops import OpCode, Reduction, acc_key, split_stores, walk
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import CodegenError, KernelWriter, Scope

#: the jitted helper combining two values of a kind (an arg-reduction's values: its
#: value kind's, ``ARG_VALUE_KIND``)
COMBINE = {"max": "_fx_max", "min": "_fx_min", "prod": "_fx_mul", "sum": "_fx_add",
           "welford": "_fx_welford"}
#: the plain reduction of an arg-reduction's values
ARG_VALUE_KIND = {"argmax": "max", "argmin": "min"}
#: no lane's index reaches it (the identity of the index ``tl.min``), per index dtype
NO_INDEX = {"tl.int32": 2 ** 31 - 1, "tl.int64": 2 ** 62}


def initial_value(kind: str, dtype: torch.dtype) -> str:
    """The identity of reduction ``kind`` over ``dtype`` values, as Triton source."""
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


def replaces(kind: str, value: str, acc: str, dtype: torch.dtype) -> str:
    """Whether a lane's later element ``value`` replaces its best ``acc`` so far in an
    arg-reduction ``kind``: strictly better, or a NaN where ``acc`` is a number (ties keep
    the earlier index; a NaN ``acc`` is never replaced)::

        (_red0_accv == _red0_accv) & ~(tmp0 <= _red0_accv)
    """
    if not dtype.is_floating_point:
        return f"({value} {'>' if kind == 'argmax' else '<'} {acc})"
    not_better = "<=" if kind == "argmax" else ">="
    return f"({acc} == {acc}) & ~({value} {not_better} {acc})"


def accumulator_dtype(red: Reduction) -> torch.dtype:
    """The dtype ``red`` accumulates in: bool for any/all, the value's compute dtype for
    arg-reductions (the index is int64), else its result's."""
    if red.kind in ("any", "all"):
        return torch.bool
    if red.kind in ("argmax", "argmin"):
        return O.compute_dtype(red.value.dtype)
    return O.compute_dtype(red.dtype)


def _deviation(value: str, mean: str) -> str:
    """Welford's ``value - mean``, exactly 0 where a finite value equals the mean.

    On the GPU Triton contracts a product's ``value - mean`` into an FMA, whose result
    is the product's rounding error where eager's is 0: the variance of one element was
    ``inf`` (m2 > 0 divided by 0) where eager's is NaN.  Times 0 the difference is 0 and
    an infinite value's ``inf - inf`` stays NaN, as in eager's Welford::

        tl.where(tmp7 == _red0_mean, (tmp7 - _red0_mean) * 0.0, tmp7 - _red0_mean)
    """
    return f"tl.where({value} == {mean}, ({value} - {mean}) * 0.0, {value} - {mean})"


class ReductionWriter:
    """``ReductionWriter(writer).write()``: the body of plan ``persistent`` or ``looped``;
    ``write_split()``: the two bodies of plan ``split-outer``, whose workspaces have
    ``workspace_dtypes()`` (module doc)."""

    def __init__(self, writer: KernelWriter):
        self.w = writer
        self.kernel = writer.kernel
        self.plan = writer.plan
        self.reductions = list(writer.kernel.reductions)
        if len({r.name for r in self.reductions}) != len(self.reductions):
            raise CodegenError(f"kernel {self.kernel.name}: two reductions share a name")

    def combine(self, kind: str) -> str:
        return self.w.helper(COMBINE[kind])

    # ------------------------------------------------------------------ persistent, looped
    def write(self) -> list[str]:
        """The function body (without the ``def`` line)."""
        w, p = self.w, self.plan
        top = w.function_scope(p.groups if p.kind == "persistent" else ("x",))
        out = [*w.size_casts(),
               f"xnumel = {w.numel(p.ranges['x'])}",
               f"rnumel = {w.numel(p.ranges['r'])}",
               f"xoffset = {w.pid()} * XBLOCK",
               "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
               "xmask = xindex < xnumel",
               f"rbase = {w.block_lanes()}",
               *w.decompose("xindex", p.groups["x"], p.ranges["x"])]
        rnames = {v.name for v in p.groups["r"]}
        r_stores, x_stores = split_stores(self.kernel.stores, p.groups["r"])
        if p.kind == "persistent":
            out += ["rindex = rbase", "rmask = rindex < rnumel", "xrmask = xmask & rmask",
                    *w.decompose("rindex", p.groups["r"], p.ranges["r"])]
            written: set[str] = set()
            for red in self.reductions:
                computed = self.computed_by(red)
                if computed.name not in written:
                    self.persistent(top, computed)
                    written.add(computed.name)
                if computed is not red:
                    self.bind(top, red, [f"{w.reduction_local(computed)}_rv"], top.lines)
            for st in r_stores:
                w.store(top, st, ("x", "r"))
            for st in x_stores:
                w.store(top, st, ("x",))
            return w.with_zeros(out + top.lines)
        written = set()
        for group in self.passes():
            init, update, finish = [], [], []
            loop = Scope(top, provides=rnames)
            for red in group:
                computed = self.computed_by(red)
                if computed.name not in written:
                    a, b, c = self.looped(loop, computed)
                    init += a
                    update += b
                    finish.append((computed, c))
                    written.add(computed.name)
                if computed is not red:
                    finish.append((red, ([], [f"{w.reduction_local(computed)}_rv"])))
            out += top.lines
            top.lines.clear()
            out += init
            out += w.row_loop(loop, update)
            for red, (fin_lines, results) in finish:
                out += fin_lines
                self.bind(top, red, results, out)
        if r_stores:
            loop = Scope(top, provides=rnames)
            for st in r_stores:
                w.store(loop, st, ("x", "r"))
            out += top.lines
            top.lines.clear()
            out += w.row_loop(loop, [])
        for st in x_stores:
            w.store(top, st, ("x",))
        return w.with_zeros(out + top.lines)

    def computed_by(self, red: Reduction) -> Reduction:
        """The reduction whose lines give ``red``'s result (a split: its partials): ``red`` itself, or, for a plain max (min) of the values an argmax
        (argmin) of the kernel reduces (``x.max(dim)``: its values and its indices), that
        arg-reduction, whose lanes' max is the same number: one reduction, written where
        the first of the two comes, and the max bound to its ``_rv``."""
        if red.kind not in ("max", "min"):
            return red
        value = red.value
        for arg in self.reductions:
            if arg.kind in ARG_VALUE_KIND and ARG_VALUE_KIND[arg.kind] == red.kind \
                    and accumulator_dtype(arg) == accumulator_dtype(red) \
                    and (value == arg.value or value.op == OpCode.CAST and value.src[0] == arg.value):
                return arg
        return red

    def passes(self) -> list[list[Reduction]]:
        """The kernel's reductions in loops over the row: a reduction joins the loop before
        unless it reads one of that loop's results."""
        passes: list[list[Reduction]] = []
        seen: set[str] = set()
        for r in self.reductions:
            reads = {acc_key(n)[0] for n in walk(r.value) if n.op == OpCode.ACC}
            if not reads <= seen:
                raise CodegenError(f"kernel {self.kernel.name}: reduction {r.name} reads acc "
                                   f"{sorted(reads - seen)}, which is not an earlier reduction")
            if passes and not reads & {q.name for q in passes[-1]}:
                passes[-1].append(r)
            else:
                passes.append([r])
            seen.add(r.name)
        return passes

    def value(self, scope: Scope, red: Reduction) -> str:
        """The local of the value ``red`` folds, in its accumulator's dtype (arg-reductions: as it is)."""
        v = self.w.value(scope, red.value)
        if red.kind in ("any", "all"):
            return O.cast(v, red.value.dtype, torch.bool)
        if red.kind in ("argmax", "argmin"):
            return v
        return O.cast(v, red.value.dtype, red.dtype)

    def persistent(self, top: Scope, red: Reduction) -> None:
        """The lines of one reduction of a whole row (plan ``persistent``), its result bound."""
        v = self.value(top, red)
        kind = red.kind
        T = accumulator_dtype(red)
        tt = O.TL_TYPES[T]
        base = self.w.reduction_local(red)
        lines = top.lines
        if kind in ("sum", "prod", "max", "min"):
            lines.append(f"{base}_v = tl.where(xrmask, {v}, tl.full([], {initial_value(kind, T)}, {tt}))")
            if kind == "sum":
                lines.append(f"{base} = tl.sum({base}_v, 1)[:, None]")
            else:
                lines.append(f"{base} = tl.reduce({base}_v, 1, {self.combine(kind)})[:, None]")
            results = [base]
        elif kind in ("any", "all"):
            fill = "0" if kind == "any" else "1"
            fn = "tl.max" if kind == "any" else "tl.min"
            lines.append(f"{base}_v = tl.where(xrmask, {v}, {fill}).to(tl.int32)")
            lines.append(f"{base} = ({fn}({base}_v, 1) != 0)[:, None]")
            results = [base]
        elif kind in ("argmax", "argmin"):
            lines.append(f"{base}_v = tl.where(xrmask, {v}, tl.full([], {initial_value(kind, T)}, {tt}))")
            lines += self.arg_of_lanes(red, base, f"{base}_v", "rindex")
            results = [f"{base}_ri", f"{base}_rv"]
        elif kind == "welford":
            lines.append(f"{base}_n = tl.sum(tl.where(xrmask, 1.0, 0.0).to({tt}), 1)[:, None]")
            lines.append(f"{base}_mean = tl.sum(tl.where(xrmask, {v}, 0.0).to({tt}), 1)[:, None] / "
                         f"tl.maximum({base}_n, 1.0)")
            lines.append(f"{base}_d = tl.where(xrmask, {_deviation(v, base + '_mean')}, 0.0).to({tt})")
            lines.append(f"{base}_m2 = tl.sum({base}_d * {base}_d, 1)[:, None]")
            results = [f"{base}_mean", f"{base}_m2", f"{base}_n"]
        else:
            raise CodegenError(f"reduction kind {kind!r} (kernel {self.kernel.name}, target {self.w.target_name})")
        self.bind(top, red, results, lines)

    def looped(self, loop: Scope, red: Reduction):
        """(init lines, loop update lines, (finish lines, result names)) of one looped reduction."""
        kind = red.kind
        T = accumulator_dtype(red)
        tt = O.TL_TYPES[T]
        base = self.w.reduction_local(red)
        full = "[XBLOCK, RBLOCK]"
        v = self.value(loop, red)
        init, upd = [], []
        if kind in ("sum", "prod", "max", "min", "any", "all"):
            init.append(f"{base}_acc = tl.full({full}, {initial_value(kind, T)}, {tt})")
            if kind in ("max", "min"):
                new = f"{self.combine(kind)}({base}_acc, {v})"
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
                fin = [f"{base} = tl.reduce({base}_acc, 1, {self.combine(kind)})[:, None]"]
            return init, upd, (fin, [base])
        if kind in ("argmax", "argmin"):  # (module doc)
            init += [f"{base}_accv = tl.full({full}, {initial_value(kind, T)}, {tt})",
                     f"{base}_acci = tl.full({full}, 0, {self.plan.index_dtype})"]
            upd += [f"{base}_take = xrmask & {replaces(kind, v, base + '_accv', T)}",
                    f"{base}_accv = tl.where({base}_take, {v}, {base}_accv)",
                    f"{base}_acci = tl.where({base}_take, rindex, {base}_acci)"]
            fin = self.arg_of_lanes(red, base, f"{base}_accv", f"{base}_acci")
            return init, upd, (fin, [f"{base}_ri", f"{base}_rv"])
        if kind == "welford":
            fn = self.combine("welford")
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
        raise CodegenError(f"reduction kind {kind!r} (kernel {self.kernel.name}, target {self.w.target_name})")

    def arg_of_lanes(self, red: Reduction, base: str, values: str, indices: str) -> list[str]:
        """The lines that finish arg-reduction ``red`` over the lanes (axis 1) of ``values``
        and their first ``indices``: ``{base}_rv``, the NaN-propagating max (argmin: min)
        of the values, and ``{base}_ri``, the least index among the lanes holding it, both
        ``[XBLOCK, 1]`` (module doc)."""
        T = accumulator_dtype(red)
        holds = f"({values} == {base}_rv)"
        if T.is_floating_point:  # the max is NaN only where some lane's value is
            holds += f" | ({values} != {values})"
        fn = self.combine(ARG_VALUE_KIND[red.kind])
        return [f"{base}_rv = tl.reduce({values}, 1, {fn})[:, None]",
                f"{base}_ri = tl.min(tl.where({holds}, {indices}, {NO_INDEX[self.plan.index_dtype]}), 1)[:, None]"]

    def index_dtype(self) -> torch.dtype:
        """The dtype of the lanes' indices of an arg-reduction: the plan's index dtype."""
        return torch.int64 if self.plan.index_dtype == "tl.int64" else torch.int32

    def bind(self, scope: Scope, red: Reduction, results, sink: list[str]) -> None:
        """Make ``acc(red.name, field)`` read ``results``; 16-bit results are rounded, an
        arg-reduction's int32 index widened to the int64 of its result (the line goes to
        ``sink``)."""
        kind = red.kind
        if kind in ("argmax", "argmin"):
            index = results[0]
            if self.index_dtype() != torch.int64:
                index = f"{results[0]}64"
                sink.append(f"{index} = {results[0]}.to(tl.int64)")
            fields = {0: (index, torch.int64), 1: (results[1], red.value.dtype)}
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

    # ------------------------------------------------------------------ split-outer
    def workspace_dtypes(self) -> list[torch.dtype]:
        """The dtype of each workspace of partials (split-outer), reduction by reduction: its
        accumulator's (``int8`` for any/all); a Welford reduction has three (mean, M2, count),
        an arg-reduction two (its first index, in the plan's index dtype, and its value)."""
        out = []
        for red in self.reductions:
            T = accumulator_dtype(red)
            if red.kind == "welford":
                out += [T] * 3
            elif red.kind in ("argmax", "argmin"):
                out += [self.index_dtype(), T]
            else:
                out.append(torch.int8 if T == torch.bool else T)
        return out

    def workspace_slots(self) -> list[list[int]]:
        """Per reduction, the indices of its workspaces (``ws_ptr{i}``)."""
        slots, at = [], 0
        for red in self.reductions:
            n = {"welford": 3, "argmax": 2, "argmin": 2}.get(red.kind, 1)
            slots.append(list(range(at, at + n)))
            at += n
        return slots

    def write_split(self) -> tuple[list[str], list[str]]:
        """The bodies of the two kernels of a split-outer reduction: partials, combine.

        Both take ``(in_ptr*, out_ptr*, ws_ptr*, sizes)``; ``ws_ptr{i}`` holds the
        ``[NSPLIT, xnumel]`` partials of reduction ``i``."""
        w, p = self.w, self.plan
        casts = w.size_casts()
        rnames = {v.name for v in p.groups["r"]}
        # ---- kernel A: one program per (x tile, r chunk)
        top = w.function_scope(("x",))
        a = [f"xnumel = {w.numel(p.ranges['x'])}",
             f"rnumel = {w.numel(p.ranges['r'])}",
             f"pid = {w.pid()}",
             "xblocks = (xnumel + XBLOCK - 1) // XBLOCK",
             "xoffset = (pid % xblocks) * XBLOCK",
             "split = pid // xblocks",
             "rchunk = ((rnumel + NSPLIT - 1) // NSPLIT + RBLOCK - 1) // RBLOCK * RBLOCK",
             "rstart = split * rchunk",
             "rend = tl.minimum(rstart + rchunk, rnumel)",
             "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
             "xmask = xindex < xnumel",
             f"rbase = {w.block_lanes()}",
             *w.decompose("xindex", p.groups["x"], p.ranges["x"])]
        loop = Scope(top, provides=rnames)
        init, update, finish = [], [], []
        for red in self.reductions:
            computed = self.computed_by(red)
            if computed is not red:  # its partial is the arg-reduction's (stored after it, below)
                finish.append(([], [f"{w.reduction_local(computed)}_rv"]))
                continue
            i, u, f = self.looped(loop, red)
            init += i
            update += u
            finish.append(f)
        r_stores, x_stores = split_stores(self.kernel.stores, p.groups["r"])
        for st in r_stores:  # no reduction result in them (see Planner._splittable)
            w.store(loop, st, ("x", "r"))
        a += top.lines
        top.lines.clear()
        a += init
        a += w.row_loop(loop, update, start="rstart", end="rend")
        dtypes = self.workspace_dtypes()
        shared = []  # the stores of reductions computed by another, after every result
        for red, (fin_lines, results), slots in zip(self.reductions, finish, self.workspace_slots()):
            a += fin_lines
            for i, v in zip(slots, results):  # a Welford reduction's mean, M2 and count
                if dtypes[i] == torch.int8:
                    v = f"{v}.to(tl.int8)"
                line = f"tl.store(ws_ptr{i} + (split * xnumel + xindex), {v}, xmask)"
                (shared if self.computed_by(red) is not red else a).append(line)
        a += shared
        body_a = casts + w.with_zeros(a)
        # ---- kernel B: each program loads the [XBLOCK, NSPLIT] tile of partials of its x
        # (one load, NSPLIT a power of two) and reduces it along the splits: a fixed tree
        # for a given NSPLIT (bitwise reproducible, no atomics), then the x-indexed stores
        top = w.function_scope(("x",))
        b = [f"xnumel = {w.numel(p.ranges['x'])}",
             f"xoffset = {w.pid()} * XBLOCK",
             "xindex = xoffset + tl.arange(0, XBLOCK)[:, None]",
             "xmask = xindex < xnumel",
             "_sp = tl.arange(0, NSPLIT)[None, :]",
             *w.decompose("xindex", p.groups["x"], p.ranges["x"])]
        for red, slots in zip(self.reductions, self.workspace_slots()):
            kind = red.kind
            T = accumulator_dtype(red)
            base = w.reduction_local(red)
            parts = [f"tl.load(ws_ptr{i} + (_sp * xnumel + xindex), xmask, other=0)" for i in slots]
            if kind == "welford":  # Chan's combine of the (mean, M2, count) partials
                fn = self.combine("welford")
                b += [f"{base}_rmean, {base}_rm2, {base}_rn = tl.reduce(({', '.join(parts)}), 1, {fn})",
                      f"{base}_rmean = {base}_rmean[:, None]", f"{base}_rm2 = {base}_rm2[:, None]",
                      f"{base}_rn = {base}_rn[:, None]"]
                self.bind(top, red, [f"{base}_rmean", f"{base}_rm2", f"{base}_rn"], b)
                continue
            if kind in ("argmax", "argmin"):  # the chunks' (first index, value) partials
                b.append(f"{base}_pi = {parts[0]}")
                b.append(f"{base}_pv = {parts[1]}")
                b += self.arg_of_lanes(red, base, f"{base}_pv", f"{base}_pi")
                self.bind(top, red, [f"{base}_ri", f"{base}_rv"], b)
                continue
            part = parts[0]
            if kind == "sum":
                b.append(f"{base} = tl.sum({part}, 1)[:, None]")
            elif kind in ("any", "all"):  # int8 partials, 0 or 1
                fn = "tl.max" if kind == "any" else "tl.min"
                b.append(f"{base} = ({fn}({part}.to(tl.int32), 1) != 0)[:, None]")
            else:
                b.append(f"{base} = tl.reduce({part}, 1, {self.combine(kind)})[:, None]")
            if T == torch.bool and kind not in ("any", "all"):
                b.append(f"{base} = {base} != 0")
            self.bind(top, red, [base], b)
        for st in x_stores:
            w.store(top, st, ("x",))
        b += top.lines
        if "r" in w.zero_axes():
            raise CodegenError(f"kernel {self.kernel.name}: the combine kernel of a split reduction "
                               "needs an r-shaped value")
        body_b = casts + w.with_zeros(b)
        return body_a, body_b
