"""ATen graph -> lines with generated kernels (targets whose emitter renders).

Extends the extern-only builder of ``wrapper_ir.build``: nodes with a lowering
rule become lazy loop IR, fused by ``core.scheduler`` into kernels that the
target's emitter renders and loads; the rest stay ``CallExtern``.  For
``torch.softmax(x, -1)`` the lines are::

    buf2 = empty_strided((64, 128), (128, 1), dtype=torch.float32, device='cpu')
    # kernel fxwrap_reduction_0 (cpu): in_ptr0:input, out_ptr0:output
    fxwrap_reduction_0(arg0, buf2)
    return (buf2,)
"""
from __future__ import annotations

import dataclasses
import logging
import operator

import sympy
import torch

import fxwrap.core.rules  # noqa: F401  (registers the rules)
from torch.multiprocessing.reductions import StorageWeakRef

from fxwrap.core import extern
from fxwrap.core.capabilities import Capabilities
from fxwrap.core.errors import EmitError
from fxwrap.core import logs
from fxwrap.ir.loops import Op, Reduction, ScheduledKernel, Store, format_kernel, rvar, xvar
from fxwrap.core.lowering import LoweringContext, Loops, Stored, Unsupported, broadcast, cast, loads
from fxwrap.core.numerics import legalize
from fxwrap.core.progress import Progress
from fxwrap.core.overlap import overlap_collectives
from fxwrap.core.scheduler import Group, Job, fuse, referenced_outside, to_kernel, worth_storing
from fxwrap.core.templates import TemplateCall
from fxwrap.wrapper_ir import template_choice
from fxwrap.ir.symbolic import contiguous_strides, evaluate, is_non_overlapping_and_dense, to_expr, to_exprs
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.wrapper_ir import build
from fxwrap.ir.lines import (Allocate, Buffer, CallExtern, CallKernel, DefineKernel, Line, View, ZeroFill,
                                     buffers_defined, buffers_read)
from fxwrap.runtime.provenance import Origin, describe

log = logging.getLogger("fxwrap")


class _Ctx(LoweringContext):
    """A rule's context.  The first time the rule reaches the builder (to realize a
    value, emit a line, add a reduction), the builder's state is checkpointed, so a
    rule that then gives up (``Unsupported``) leaves no trace (``KernelBuilder.call_function``)."""

    def __init__(self, node, device, builder):
        super().__init__(node, device)
        self._kernel_builder = builder
        self.checkpoint: _Checkpoint | None = None
        self.outputs_made = 0  # var_mean: one reduction call per output

    def rollback(self) -> None:
        """Put the builder back as it was before the rule first reached it (a rule that
        declined: ``fxwrap.DECLINE``)."""
        if self.checkpoint is not None:
            self.checkpoint.restore()
        self.outputs_made = 0

    @property
    def capabilities(self) -> Capabilities:
        return self._kernel_builder.session.capabilities

    @property
    def builder(self):
        if self.checkpoint is None:
            self.checkpoint = _Checkpoint(self._kernel_builder)
        return self._kernel_builder

    def reduction(self, loops: Loops, dims, keepdim, kind, acc_dtype, finish=None, field=0):
        return self.builder.reduction(self, loops, dims, keepdim, kind, acc_dtype, finish, field)

    def scan(self, loops: Loops, dim: int, kind: str, acc_dtype, fields):
        return self.builder.scan(self, loops, dim, kind, acc_dtype, fields)


class _Checkpoint:
    """The builder's whole state at one moment (every container attribute of the
    builder and of its ``BuiltProgram``, copied; everything else kept as it was);
    ``restore()`` puts it back."""

    _CONTAINERS = (dict, list, set)

    def __init__(self, builder):
        self.objects = [(obj, {k: (type(v)(v) if type(v) in self._CONTAINERS else v)
                               for k, v in vars(obj).items()})
                        for obj in (builder, builder.out)]

    def restore(self) -> None:
        for obj, state in self.objects:
            vars(obj).clear()
            vars(obj).update({k: (type(v)(v) if type(v) in self._CONTAINERS else v)
                              for k, v in state.items()})


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """One kernel the builder made: its loop IR, its source, the ATen nodes whose values
    it stores (``roots``) and why it did not join the kernel before it (``started_because``)."""

    scheduled: ScheduledKernel
    source: object  # targets.base.KernelSource
    roots: tuple[str, ...]
    started_because: str


class KernelBuilder(build._Builder):
    """The extern builder plus lowering rules, jobs and fusion, for one graph.

    ``session`` (a ``fxwrap.plugins.session.CompileSession``) gives the target, the
    lowering table (``session.lowerings.lookup(op)``), the dtypes kernels may hold
    (``session.kernel_dtypes``) and the emitter (``session.new_emitter(size_hints)``).
    """

    def __init__(self, gm, session, extern_nodes=frozenset(), timer: logs.PhaseTimer | None = None,
                 label: str = "program"):
        super().__init__(gm, session.target.name)
        self.timer = timer if timer is not None else logs.PhaseTimer(label)
        self.label = label
        self.session = session
        self.target = session.target
        self.lowerings = session.lowerings
        self.kernel_dtypes = session.kernel_dtypes
        # nodes kept as extern calls because the target's emitter rejected their kernel
        self.extern_nodes = frozenset(extern_nodes)
        self.items: list = []  # lines and Jobs in program order
        self.buffers: dict[str, Buffer] = {}
        self.acc_counter = 0
        self.view_of: dict[torch.fx.Node, torch.fx.Node] = {}  # lazy view node -> its lazy source
        # provenance: every ATen node a lazy value computes (itself and what it inlines)
        self.lazy_origins: dict[torch.fx.Node, tuple[Origin, ...]] = {}
        self.node_named = {n.name: n for n in gm.graph.nodes}
        self.position = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        self.reuse = session.options.reuse
        self.wrapper_passes = tuple(session.lines_passes)
        self.template_mode = session.template_mode
        # template output buffer -> the lines of its ATen call (the extern candidate)
        self.template_externs: dict[str, list[Line]] = {}
        # a reshape node of a template's result (or of such a reshape) -> that result's buffer
        self.template_reshape_of: dict[torch.fx.Node, Buffer] = {}
        # template candidates' times of this program, by timing key (template_choice.time_candidates)
        self.template_timings: dict[str, float] = {}
        self._launchers: dict[int, object] = {}  # id(KernelSource) -> its launcher, loaded once

    def _new_builder(self, gm):
        return KernelBuilder(gm, self.session)

    def user_kernel_emitter(self):
        emitter = getattr(self, "_user_kernel_emitter", None)
        if emitter is None:
            emitter = self._user_kernel_emitter = self.session.new_emitter(self.out.hints)
        return emitter

    # -- results of nested programs (a cond branch, a loop body) -------------------
    def output_value(self, arg, index):
        layout = self.output_layouts[index] if self.output_layouts is not None else None
        lazy = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if layout is not None and isinstance(lazy, Loops) and arg not in self.view_of:
            # computed straight into the layout the result must have: no copy
            dst = self.fresh_buffer_like(layout)
            self.pointwise_job(dst, lazy, [arg.name])
            self.returned_roots.add(dst.name)
            return dst
        return super().output_value(arg, index)

    def fresh_buffer_like(self, layout):
        buf = super().fresh_buffer_like(layout)
        self.buffers[buf.name] = buf
        return buf

    def private_copy(self, dst, arg):
        lazy = self.env.get(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(lazy, Loops) and arg not in self.view_of and len(arg.users) == 1:
            self.pointwise_job(dst, lazy, [arg.name])  # computed straight into dst: no copy
            return
        super().private_copy(dst, arg)

    def copy_into(self, dst, src, origin=None):
        self.pointwise_job(dst, loads(src), [origin.name] if isinstance(origin, torch.fx.Node) else [])

    # lines go to the item list; kernels are made at the end
    def emit(self, line: Line) -> None:
        line = self.labelled(line)
        for buf in buffers_defined(line):
            self.buffers[buf.name] = buf
        self.items.append(line)

    def new_buffer(self, fake, prefix="buf"):
        buf = super().new_buffer(fake, prefix)
        self.buffers[buf.name] = buf
        return buf

    def placeholder(self, node, index):
        super().placeholder(node, index)
        if isinstance(self.env[node], Buffer):
            self.buffers[self.env[node].name] = self.env[node]

    # -- values ---------------------------------------------------------------
    def value(self, arg):
        if isinstance(arg, torch.fx.Node):
            v = self.env[arg]
            if isinstance(v, Loops):
                v = self.realize(arg, v)
            return v
        return super().value(arg)

    def rule_value(self, arg):
        if isinstance(arg, torch.fx.Node):
            v = self.env[arg]
            return Stored(v) if isinstance(v, Buffer) else v
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.rule_value(a) for a in arg)
        return super().value(arg)

    def realize(self, node: torch.fx.Node, loops: Loops) -> Buffer:
        view = self._realize_as_view(node)
        if view is not None:
            return view
        fake = node.meta["val"]
        hints = self.out.hints
        size = [evaluate(n, hints) for n in to_exprs(fake.shape)]
        stride = [evaluate(s, hints) for s in to_exprs(fake.stride())]
        buf = self.new_buffer(fake)
        if fake.storage_offset() == 0 and not is_non_overlapping_and_dense(size, stride):
            view = self._realize_expanded(node, loops, buf, size, stride)
            if view is not None:
                return view
        if not _non_overlapping(size, stride) or fake.storage_offset() != 0:
            # Keep the traced strides whenever they are a layout of its own (a permuted or
            # gapped view of a larger tensor): a later program (the backward, reading a
            # saved activation) views the buffer through exactly those strides.
            strides = buf.stride if _non_overlapping(size, stride) else contiguous_strides(buf.size)
            buf = Buffer(buf.name, buf.size, strides, buf.dtype, buf.device)
            self.buffers[buf.name] = buf
            self.roots[buf.name] = buf
            self.out.fake_values.pop(buf.name, None)
            if strides == buf.stride and fake.storage_offset() != 0:
                self.traced_offsets[buf.name] = to_expr(fake.storage_offset())  # views of it: build.view
        self.pointwise_job(buf, loops, [node.name])
        self.env[node] = buf
        return buf

    # -- provenance -----------------------------------------------------------
    def in_program_order(self, origins) -> tuple[Origin, ...]:
        unique = {o.node: o for o in origins}
        return tuple(sorted(unique.values(), key=lambda o: self.position.get(o.node, -1)))

    def inlined_origins(self, node: torch.fx.Node) -> tuple[Origin, ...]:
        """The origins of the lazy values ``node`` reads (inlined into whatever computes it)."""
        found: list[Origin] = []
        for arg in node.all_input_nodes:
            value = self.env.get(arg)
            if isinstance(value, Loops) or (isinstance(value, tuple) and any(isinstance(v, Loops) for v in value)):
                found += self.lazy_origins.get(arg, ())
        return tuple(found)

    def computed_by(self, node: torch.fx.Node) -> tuple[Origin, ...]:
        """Every ATen node a value of ``node`` computes: itself and the lazy values it inlines."""
        known = self.lazy_origins.get(node)
        if known is not None:
            return known
        own = (self.origin_of(node),) if isinstance(node.target, torch._ops.OpOverload) else ()
        return self.in_program_order(self.inlined_origins(node) + own)

    def job_origins(self, names) -> dict:
        """A job's ``origins`` and ``roots`` for the ATen nodes (by name) whose values it stores."""
        origins = [o for name in names for o in self.computed_by(self.node_named[name])]
        return {"origins": list(self.in_program_order(origins)), "roots": list(names)}

    def _realize_as_view(self, node: torch.fx.Node) -> Buffer | None:
        """A view (``permute``, ``view``, ``slice``...) of a lazy value, needed in memory:
        the source is stored once in its own traced layout and the view is a ``View``
        of it, as the traced program had it.  Storing the view on its own would compute
        the same values a second time wherever the source is needed too (a gradient
        feeding ``mm(g, w)`` and ``mm(g.t(), x)``)."""
        source = self.view_of.get(node)
        fake = node.meta.get("val")
        src_fake = source.meta.get("val") if source is not None else None
        if not isinstance(fake, torch.Tensor) or not isinstance(src_fake, torch.Tensor):
            return None
        if StorageWeakRef(fake.untyped_storage()) != StorageWeakRef(src_fake.untyped_storage()):
            return None
        hints = self.out.hints
        size = [evaluate(n, hints) for n in to_exprs(src_fake.shape)]
        stride = [evaluate(st, hints) for st in to_exprs(src_fake.stride())]
        if src_fake.storage_offset() != 0 or not is_non_overlapping_and_dense(size, stride):
            return None
        base = self.value(source)
        # ``base`` may itself be a view (a chain ``stack -> flatten -> transpose``): what
        # must hold is that the chain's root buffer holds its traced node's elements in
        # the traced layout at offset 0, so every view of that storage is ``as_strided``
        # of it with its own traced strides and offset.
        root = self.roots.get(base.name)
        root_fake = self.out.fake_values.get(root.name) if root is not None else None
        if (not isinstance(root_fake, torch.Tensor) or root_fake.storage_offset() != 0
                or StorageWeakRef(root_fake.untyped_storage()) != StorageWeakRef(fake.untyped_storage())
                or root.name in self.traced_offsets or tuple(root.stride) != to_exprs(root_fake.stride())
                or not self._as_strided_view((base,), fake)):
            return None
        self.view(node, (base,), fake)
        return self.env[node]

    def _realize_expanded(self, node, loops: Loops, buf: Buffer, size, stride) -> Buffer | None:
        """An expanded layout (stride 0 over dims of size > 1, the rest dense): a kernel
        stores the compact tensor and a ``View`` gives it the traced layout, the one
        its readers expect (a backward program reading a saved ``expand``)."""
        bcast = [i for i, (n, st) in enumerate(zip(size, stride)) if st == 0 and n != 1]
        compact = [1 if i in bcast else n for i, n in enumerate(size)]
        if not bcast or not is_non_overlapping_and_dense(compact, stride):
            return None
        base = Buffer(buf.name, tuple(sympy.Integer(1) if i in bcast else n for i, n in enumerate(buf.size)),
                      buf.stride, buf.dtype, buf.device)
        self.buffers[base.name] = base
        self.roots[base.name] = base
        fake = self.out.fake_values.pop(base.name)
        xs = tuple(sympy.Integer(0) if i in bcast else xvar(i) for i in range(len(size)))
        index = sympy.expand(sum((x * st for x, st, n in zip(xs, base.stride, base.size) if n != 1),
                                 sympy.Integer(0)))
        self.items.append(Job(tuple(base.size), stores=[Store(base.name, index, cast(loops(xs), base.dtype))],
                              **self.job_origins([node.name])))
        view = Buffer(self.fresh(), buf.size, buf.stride, buf.dtype, buf.device)
        self.buffers[view.name] = view
        self.roots[view.name] = base
        self.out.fake_values[view.name] = fake
        self.emit(View(view, base))
        self.env[node] = view
        return view

    def pointwise_job(self, buf: Buffer, loops: Loops, origins) -> None:
        xs = tuple(xvar(i) for i in range(len(buf.size)))
        index = sympy.expand(sum((x * s for x, s, n in zip(xs, buf.stride, buf.size) if n != 1), sympy.Integer(0)))
        self.items.append(Job(tuple(buf.size), stores=[Store(buf.name, index, cast(loops(xs), buf.dtype))],
                              **self.job_origins(origins)))

    def reduction(self, ctx, loops, dims, keepdim, kind, acc_dtype, finish, field):
        rank = len(loops.size)
        if not dims or any(loops.size[d] == 0 for d in dims):
            raise Unsupported("empty reduction")
        kept = [d for d in range(rank) if d not in dims]
        outer = tuple(loops.size[d] for d in kept)
        reduced = tuple(loops.size[d] for d in dims)
        xs = [xvar(i) for i in range(len(kept))]
        rs = [rvar(i) for i in range(len(dims))]
        index = [None] * rank
        for k, d in enumerate(kept):
            index[d] = xs[k]
        for k, d in enumerate(dims):
            index[d] = rs[k]
        value = loops(tuple(index))
        value = cast(value, acc_dtype) if kind not in ("argmax", "argmin") else value
        name = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vals = ctx.val if isinstance(ctx.val, (tuple, list)) else [ctx.val]
        out = self.new_buffer(vals[ctx.outputs_made])
        ctx.outputs_made += 1
        numel = sympy.Integer(1)
        for n in reduced:
            numel = numel * n
        acc = Op.acc(name, field, acc_dtype if kind not in ("argmax", "argmin") else torch.int64)
        result = finish(acc, numel) if finish is not None else acc
        if keepdim:
            out_vars = [sympy.Integer(0)] * rank
            for k, d in enumerate(kept):
                out_vars[d] = xs[k]
        else:
            out_vars = xs
        store_index = sympy.expand(sum((v * s for v, s, n in zip(out_vars, out.stride, out.size) if n != 1),
                                       sympy.Integer(0)))
        self.items.append(Job(outer, reduced, (rank, tuple(dims)),
                              reductions=[Reduction(name, kind, value, acc_dtype)],
                              stores=[Store(out.name, store_index, cast(result, out.dtype))],
                              **self.job_origins([ctx.node.name])))
        return Stored(out)

    def scan(self, ctx, loops, dim, kind, acc_dtype, fields):
        """A scan job over ``dim`` of ``loops``: one output per entry of ``fields`` (the
        ``acc`` field it stores, output ``i`` of the node), each at every element."""
        rank = len(loops.size)
        if loops.size[dim] == 0:
            raise Unsupported(f"{kind} over an empty dim")
        kept = [d for d in range(rank) if d != dim]
        xs = [xvar(i) for i in range(len(kept))]
        index = [None] * rank
        for k, d in enumerate(kept):
            index[d] = xs[k]
        index[dim] = rvar(0)
        value = loops(tuple(index))
        value = cast(value, acc_dtype)
        name = f"acc{self.acc_counter}"
        self.acc_counter += 1
        vals = ctx.val if isinstance(ctx.val, (tuple, list)) else [ctx.val]
        stores, results = [], []
        for out_index, field in enumerate(fields):
            out = self.new_buffer(vals[out_index])
            acc = Op.acc(name, field, torch.int64 if kind in ("cummax", "cummin") and field == 0 else acc_dtype)
            # the scanned dim's term stays even at size 1: a scan's stores are indexed by r
            store_index = sympy.expand(sum((v * s for d, (v, s, n) in enumerate(zip(index, out.stride, out.size))
                                            if n != 1 or d == dim), sympy.Integer(0)))
            stores.append(Store(out.name, store_index, cast(acc, out.dtype)))
            results.append(Stored(out))
        self.items.append(Job(tuple(loops.size[d] for d in kept), (loops.size[dim],), (rank, (dim,)),
                              reductions=[Reduction(name, kind, value, acc_dtype)], stores=stores,
                              **self.job_origins([ctx.node.name])))
        return results[0] if len(results) == 1 else tuple(results)

    # -- nodes ----------------------------------------------------------------
    def call_function(self, node):
        if node.target is operator.getitem:  # one result of a lazy multi-output value
            super().call_function(node)
            self.lazy_origins[node] = self.in_program_order(self.inlined_origins(node))
            return
        if (self.template_mode != "off" and isinstance(node.target, torch._ops.OpOverload)
                and node.target in self.session.template_ops and node.name not in self.extern_nodes
                and self._all_on_device(node)):
            self._template_or_extern(node)
            return
        rule = self.lowerings.rule(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        if rule is not None and node.name not in self.extern_nodes and self._all_on_device(node):
            self._store_shared_values(node)
            ctx = _Ctx(node, self._device_of(node), self)
            args = self.rule_value(node.args)
            kwargs = {k: self.rule_value(v) for k, v in node.kwargs.items()}
            try:
                result = self._template_reshape(node)
                result = rule(ctx, *args, **kwargs) if result is None else result
            except Unsupported:
                result = None
            if result is None and ctx.checkpoint is not None:
                ctx.checkpoint.restore()  # the extern call below starts from the state before the rule
            if result is not None:
                self.env[node] = _unwrap(result)
                self.lazy_origins[node] = self.computed_by(node)
                source = node.args[0] if node.args else None
                if (extern.is_view(node.target) and isinstance(self.env[node], Loops)
                        and isinstance(source, torch.fx.Node) and isinstance(self.env.get(source), Loops)):
                    self.view_of[node] = source
                return
        super().call_function(node)

    # -- templates ------------------------------------------------------------
    def _template_reshape(self, node) -> Loops | None:
        """A row-major reshape (``_RESHAPES``) of a template's result, or of such a reshape,
        as a lazy read of the template's buffer at the reshape's own row-major index, so
        that its readers can join the template's epilogue (``scheduler._reshaped``: a 3-D
        linear layer's activation).  The index stays affine through chains of reshapes
        (``(B*T, V) -> (B, T, V) -> (B*T, V)``), so a gather (a cross-entropy's) still reads
        the value lazily.  None for any other node."""
        if node.target not in _RESHAPES or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        source = node.args[0]
        buf = self.template_reshape_of.get(source)
        if buf is None:
            value = self.env.get(source)
            if not (isinstance(value, Buffer) and value.name in self.template_externs):
                return None
            buf = value
        fake = node.meta.get("val")
        if (not isinstance(fake, torch.Tensor) or not fake.is_contiguous() or fake.storage_offset() != 0
                or tuple(buf.stride) != tuple(contiguous_strides(buf.size))):
            return None
        self.template_reshape_of[node] = buf
        size = to_exprs(fake.shape)
        return loads(Buffer(buf.name, size, contiguous_strides(size), buf.dtype, buf.device))

    def _template_or_extern(self, node) -> None:
        """``node`` (an op some template computes) as its ATen call, as without templates;
        then, when a template of the session applies, that call becomes the extern
        candidate of a template job storing the op's result (``template_out``, plus
        ``addmm``'s bias and scales) into the same buffer (``fxwrap.core.templates``)."""
        self.value(node.args)  # operands in memory first: their kernels stay where they are
        mark = len(self.items)
        build._Builder.call_function(self, node)
        made = self.items[mark:]
        out = self.env.get(node)
        # the op's out= call into a buffer of ours, or (no out= overload: _weight_int8pack_mm)
        # the functional call whose result it is
        if not (isinstance(out, Buffer) and [type(ln) for ln in made] in ([Allocate, CallExtern], [CallExtern])):
            return
        call = self._template_call(node, out)
        if call is None:
            return
        reasons = {t.name: t.refusal(call) for t in self.session.active_templates if node.target in t.ops}
        if all(why is not None for why in reasons.values()):
            logs.logger("schedule").info("fxwrap: %s stays an ATen call on target %s: %s", node.name,
                                         self.target.name, "; ".join(f"template {k}: {v}" for k, v in reasons.items()))
            return
        del self.items[mark:]
        self.template_externs[out.name] = made
        xs = call.index
        value = cast(self._template_value(node, call, xs), out.dtype)
        index = sympy.expand(sum((x * st for x, st, n in zip(xs, out.stride, out.size) if n != 1), sympy.Integer(0)))
        self.items.append(Job(tuple(out.size), stores=[Store(out.name, index, value)], template=call,
                              **self.job_origins([node.name])))

    def _template_call(self, node, out: Buffer) -> TemplateCall | None:
        """The ``TemplateCall`` of a GEMM node (mm, addmm, bmm: operands of one floating dtype;
        ``_weight_int8pack_mm(x, w, scales)``: ``w`` int8 ``(N, K)``, presented as the operand
        ``b`` of size ``(K, N)`` -- the same buffer through transposed strides --, ``scales``
        a third operand); None otherwise (the node stays its ATen call)."""
        op = node.target
        args = [self.value(a) for a in node.args]
        aten = torch.ops.aten
        extra: tuple = ()
        if op in (aten.mm.default, aten.bmm.default):
            a, b = args[:2]
        elif op == aten.addmm.default:
            a, b = args[1:3]
            if not isinstance(args[0], Buffer):
                return None
        elif op == aten._weight_int8pack_mm.default:
            a, w, scales = args[:3]
            if not all(isinstance(t, Buffer) for t in (a, w, scales)) or w.dtype != torch.int8 or len(w.size) != 2:
                return None
            b = Buffer(w.name, (w.size[1], w.size[0]), (w.stride[1], w.stride[0]), w.dtype, w.device, w.offset)
            extra = (scales,)
        else:
            return None
        if not (isinstance(a, Buffer) and isinstance(b, Buffer)) or a.dtype != out.dtype:
            return None
        if not a.dtype.is_floating_point or (b.dtype != a.dtype and op != aten._weight_int8pack_mm.default):
            return None
        rank = 3 if op == aten.bmm.default else 2
        if len(a.size) != rank or len(b.size) != rank or len(out.size) != rank:
            return None
        batch = a.size[0] if rank == 3 else sympy.Integer(1)
        sizes = (("batch", sympy.sympify(batch)), ("m", a.size[-2]), ("n", b.size[-1]), ("k", a.size[-1]))
        hints = tuple((k, evaluate(v, self.out.hints)) for k, v in sizes)
        acc = torch.float64 if a.dtype == torch.float64 else torch.float32
        return TemplateCall(op, node.name, (a, b, *extra), out, sizes, hints, acc,
                            tuple(xvar(i) for i in range(rank)))

    def _template_value(self, node, call: TemplateCall, xs):
        """The op's result at ``xs`` over ``template_out``: the product, and for ``addmm``
        ``beta * bias + alpha * product`` (``beta=0`` ignores the bias, as eager does)."""
        acc = call.accumulator()
        if call.op == torch.ops.aten._weight_int8pack_mm.default:  # the product times scales[n]
            scales = broadcast(loads(call.operands[2]), call.output.size)(xs)
            return Op("mul", call.acc_dtype, (acc, cast(scales, call.acc_dtype)))
        if call.op != torch.ops.aten.addmm.default:
            return acc
        beta = node.kwargs.get("beta", 1)
        alpha = node.kwargs.get("alpha", 1)
        dtype = call.acc_dtype
        value = acc if alpha == 1 else Op("mul", dtype, (acc, Op.const(alpha, dtype)))
        if beta != 0:
            bias = cast(broadcast(loads(self.value(node.args[0])), call.output.size)(xs), dtype)
            bias = bias if beta == 1 else Op("mul", dtype, (bias, Op.const(beta, dtype)))
            value = Op("add", dtype, (bias, value))
        return value

    def _store_shared_values(self, node) -> None:
        """Realize each lazy argument of ``node`` that several nodes read and that is
        too costly to inline into each of them (``scheduler.worth_storing``)."""
        for arg in node.all_input_nodes:
            loops = self.env.get(arg)
            if isinstance(loops, Loops) and len(arg.users) > 1:
                value = loops(tuple(xvar(i) for i in range(len(loops.size))))
                if worth_storing(value, len(arg.users)):
                    self.realize(arg, loops)

    def _device_of(self, node):
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        return next(v.device for v in vals if isinstance(v, torch.Tensor))

    def _all_on_device(self, node) -> bool:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        if not vals or not all(isinstance(v, torch.Tensor) for v in vals):
            return False
        device = vals[0].device
        inputs = [a.meta["val"] for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
        if any(v.device != device for v in inputs) or device.type != self.target.device_type:
            return False
        bad = sorted({str(t.dtype) for t in (*vals, *inputs) if t.dtype not in self.kernel_dtypes})
        if bad:
            log.info("fxwrap: %s (%s) stays an ATen extern call on target %s: its kernels cannot hold %s "
                     "(session.kernel_dtypes: the device's capabilities().dtypes and the emitter's "
                     "supported_dtypes)", node.name, node.target, self.target.name, ", ".join(bad))
            return False
        return True

    # -- kernels --------------------------------------------------------------
    def run(self):
        """Build the lines; a kernel the emitter cannot render (``EmitError``) is rebuilt
        with its source nodes as ATen extern calls (logged), until every kernel renders."""
        extern = set(self.extern_nodes)
        builder = self
        while True:
            try:
                return builder._run_once()
            except _RenderFailed as failed:
                new = set(failed.nodes) - extern
                if not new:
                    raise failed.error
                logs.logger("schedule").info(
                    "fxwrap: target %s cannot render the kernel of %s (%s); they run as ATen "
                    "extern calls", self.target.name, ", ".join(sorted(new)), failed.error)
                extern |= new
                builder = KernelBuilder(self.gm, self.session, extern_nodes=extern, timer=self.timer,
                                        label=self.label)
                builder.output_layouts, builder.kernel_prefix = self.output_layouts, self.kernel_prefix
                builder.reuse, builder.wrapper_passes = self.reuse, self.wrapper_passes

    def _run_once(self):
        with self.timer.phase("lowering"):
            built = super().run()
        with self.timer.phase("schedule"):
            items = fuse(self.items)
            needed = referenced_outside(items, buffers_read)
        with self.timer.phase("render"):
            rendered = self._render(items, needed, built)
        with self.timer.phase("compile kernels"):
            # every kernel known now at once: the plain kernels and the template candidates
            # that will be timed (their compiles overlap; timing then runs on a quiet machine)
            self._load_each([entry[1] for entry in rendered if isinstance(entry, tuple) and entry[1] is not None]
                            + [made for entry in rendered if isinstance(entry, template_choice.Candidates)
                               for made in entry.kernels_to_time()])
        with self.timer.phase("template choice"):
            lines, loads = self._choose(rendered, built)
        with self.timer.phase("compile kernels"):
            self._load_each([made for made, _ in loads])
            for made, _ in loads:
                made.kernel.bind(self._launchers[id(made.source)])
        built.lines = overlap_collectives(lines)
        return built

    def _render(self, items, needed, built) -> list:
        """Each item rendered, in program order: a line as it is, a group as ``(group,
        KernelLines or None when it stores nothing)``, a template group as its
        ``template_choice.Candidates``."""
        inputs = {b.name for b in built.inputs if isinstance(b, Buffer)}
        emitter = self.session.new_emitter(self.out.hints)  # example sizes (autotuning of symbolic kernels)
        self._emitter = emitter
        rendered: list = []
        count = 0
        for item in items:
            if not isinstance(item, Group):
                rendered.append(item)
                continue
            keep = needed[id(item)]
            if item.template is not None:
                rendered.append(template_choice.candidates(self, item, keep, inputs, count, emitter))
                count += 1
                continue
            kind = "scan" if any(r.is_scan for r in item.reductions) else \
                "reduction" if item.reductions else "pointwise"
            rendered.append((item, self.kernel_lines(item, f"{self.kernel_prefix}_{kind}_{count}", keep, inputs,
                                                     emitter.render)))
            count += 1
        return rendered

    def _choose(self, rendered: list, built) -> tuple[list, list]:
        """The program's lines from the rendered items (each template group's candidate
        chosen, ``template_choice.decide``) and the ``(KernelLines, group)`` to bind."""
        lines: list[Line] = []
        loads: list = []
        for entry in rendered:
            if isinstance(entry, template_choice.Candidates):
                for made in template_choice.decide(self, entry, self._emitter):
                    self._add_kernel(made, entry.group, lines, loads, built)
            elif isinstance(entry, tuple):
                group, made = entry
                if made is not None:
                    self._add_kernel(made, group, lines, loads, built)
            else:
                lines.append(entry)
        return lines, loads

    def load_kernel(self, source):
        """``source``'s launcher (``KernelSource``), loaded once per program."""
        launcher = self._launchers.get(id(source))
        if launcher is None:
            self._launchers[id(source)] = launcher = self._emitter.load(source)
        return launcher

    def _load_each(self, kernels: list) -> None:
        """Load (compile) the launchers of ``kernels`` (``KernelLines``) not loaded yet,
        ``emitter.load_threads`` at once (see ``_load_all``)."""
        todo, seen = [], set()
        for made in kernels:
            if id(made.source) not in self._launchers and id(made.source) not in seen:
                seen.add(id(made.source))
                todo.append(made.source)
        for source, launcher in zip(todo, _load_all(self._emitter, todo, self.label)):
            self._launchers[id(source)] = launcher

    def kernel_lines(self, group: Group, name: str, keep: set, inputs: set, render) -> "KernelLines | None":
        """Group -> legalized ``ScheduledKernel`` -> ``render(sk)`` (a ``KernelSource``) -> its
        ``Allocate`` / ``DefineKernel`` / ``CallKernel`` lines; None when it stores nothing."""
        sk = to_kernel(group, name, keep, self.buffers, inputs)
        sk = dataclasses.replace(sk, origins=self.in_program_order(sk.origins))
        sk = legalize(sk, self.session.numerics)  # explicit compute dtypes, casts and 16-bit rounding
        if not sk.stores:
            return None
        try:
            source = render(sk)
        except EmitError as exc:
            raise _RenderFailed(group.roots, exc) from exc
        new = [Allocate(out) for out in sk.outputs if out.name not in inputs]
        workspaces = self._workspaces(sk, source, new)
        signature = tuple([KernelArg(b.name, "input") for b in sk.inputs]
                          + [KernelArg(b.name, "output") for b in sk.outputs]
                          + [KernelArg(b.name, "workspace") for b in workspaces]
                          + [KernelArg(s.name, "size") for s in sk.size_symbols])
        kernel = Kernel(sk.name, source.text, self.target.name, signature, source.launch,
                        loader=self.session.kernel_loader)
        new += [DefineKernel(kernel),
                CallKernel(kernel, (*sk.inputs, *sk.outputs, *workspaces, *sk.size_symbols), origins=sk.origins)]
        return KernelLines(sk, source, kernel, new)

    def _workspaces(self, sk: ScheduledKernel, source, lines: list) -> list[Buffer]:
        """The scratch buffers ``source`` declares (``targets.base.Workspace``), each a
        buffer of its own allocated by an ``Allocate`` line (a zero fill after it where
        the kernel needs zeros) appended to ``lines``; the memory planner frees it after
        the launch, its last use."""
        out = []
        device = (sk.outputs or sk.inputs)[0].device
        for ws in getattr(source, "workspaces", ()):
            size = sympy.sympify(ws.numel)
            stray = size.free_symbols - set(sk.size_symbols)
            if stray:
                raise EmitError(f"kernel {sk.name}: its workspace size {size} uses {sorted(map(str, stray))}, "
                                f"which are not size arguments of the kernel (target {self.target.name})")
            buf = Buffer(self.fresh("ws"), (size,), (sympy.Integer(1),), ws.dtype, device)
            self.buffers[buf.name] = buf
            lines.append(Allocate(buf))
            if ws.zeroed:
                lines.append(ZeroFill(buf))
            out.append(buf)
        return out

    def _add_kernel(self, made, group: Group, lines: list, loads: list, built) -> None:
        """Append a candidate's lines; a kernel's launcher is bound with the others at the end."""
        if not isinstance(made, KernelLines):  # lines without a kernel (an extern call, a choice)
            lines.extend(made)
            return
        lines.extend(made.lines)
        loads.append((made, group))
        built.kernels.append(KernelRecord(made.scheduled, made.source, tuple(group.roots), group.started_because))
        _log_kernel(made.scheduled, made.source, group)


#: views that keep the row-major order of elements: a template's result seen through one
#: stays lazy, so that the epilogue over it joins the template (``_template_reshape``)
_RESHAPES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                       torch.ops.aten.reshape.default, torch.ops.aten.alias.default})


@dataclasses.dataclass
class KernelLines:
    """A rendered kernel and the lines that allocate its outputs, define and launch it."""

    scheduled: ScheduledKernel
    source: object  # targets.base.KernelSource
    kernel: Kernel
    lines: list


def _log_kernel(sk: ScheduledKernel, source, group: Group) -> None:
    """The schedule, lowering and kernels stages' records of one kernel (when enabled)."""
    if logs.enabled("schedule"):
        logs.logger("schedule").debug("%s <- %s\n  stores the values of %s\n  a new kernel: %s", sk.name,
                                      describe(sk.origins), ", ".join(group.roots), group.started_because)
    if logs.enabled("lowering"):
        logs.logger("lowering").debug("%s", format_kernel(sk))
    if logs.enabled("kernels"):
        logs.logger("kernels").debug("%s (%s):\n%s", sk.name, source.language, source.text)


def _load_all(emitter, sources: list, label: str = "program") -> list:
    """The launchers of ``sources`` (``KernelSource``), ``emitter.load_threads`` of them at once
    (loading waits on compiler subprocesses: Triton's ptxas, g++), with a progress bar on a
    terminal when there are more than a handful."""
    if not sources:
        return []
    threads = min(int(getattr(emitter, "load_threads", 1) or 1), len(sources))
    with Progress(len(sources), label) as progress:
        def load(source):
            launcher = emitter.load(source)
            progress.advance()
            return launcher

        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(threads, thread_name_prefix="fxwrap-load") as pool:
                return list(pool.map(load, sources))
        return [load(source) for source in sources]


class _RenderFailed(Exception):
    """The emitter rejected the kernel fused from ``nodes`` (ATen node names)."""

    def __init__(self, nodes, error):
        super().__init__(str(error))
        self.nodes, self.error = tuple(nodes), error


def _unwrap(result):
    if isinstance(result, Stored):
        return result.buffer
    if isinstance(result, tuple):
        return tuple(_unwrap(r) for r in result)
    return result


def _non_overlapping(size, stride) -> bool:
    """No two in-bounds indices share an element (gaps allowed): concrete sizes."""
    dims = sorted((abs(st), n) for n, st in zip(size, stride) if n != 1)
    if any(n == 0 for n in size):
        return True
    reach = 1
    for st, n in dims:
        if st < reach:
            return False
        reach = st * n
    return True
