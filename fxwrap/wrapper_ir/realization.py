"""Realization: lazy loop IR (``Loops``) stored into buffers by jobs (pointwise, reduction,
scan) that the scheduler fuses into kernels.  ``Realizer`` is what a lowering rule's context
reaches (``core.building.RuleBuilder``)::

    ctx.realized(loops)   -> Realizer.realize(node, loops)    buf4
    items += Job((64, 128), stores=[Store('buf4', 128*x0 + x1, exp(load(arg0, 128*x0 + x1)))],
                 origins=[exp], roots=['exp'])
"""
from __future__ import annotations

import sympy
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fxwrap.core import logs, reinplace
from fxwrap.core.lowering import Loops, Stored, Unsupported, cast
from fxwrap.core.scheduler import Job
from fxwrap.ir.lines import Buffer, View
from fxwrap.ir.loops import Op, Reduction, Store, load_buffer, rvar, walk, xvar
from fxwrap.ir.symbolic import contiguous_strides, evaluate, is_non_overlapping_and_dense, to_expr, to_exprs
from fxwrap.wrapper_ir.journal import JournaledCount, JournaledDict
from fxwrap.wrapper_ir.layouts import is_dense, non_overlapping as _non_overlapping


class Realizer:
    """Lazy values put in memory for one lowerer (``lowerer.Lowerer``: its buffers, items and
    values): a value realized into a buffer of its traced layout (or a ``View`` of its
    source's), pointwise, reduction and scan jobs, the indexed writes' targets.  It keeps
    which lazy values are views of which (``view_of``) and numbers the accumulators, in the
    lowerer's journal.  Implements ``core.building.RuleBuilder``."""

    def __init__(self, lowerer, emitter):
        self.lowerer = lowerer
        self.origins = lowerer.origins
        self.emitter = emitter  # the target's KernelEmitter class (its indexed_stores)
        self.view_of: dict[torch.fx.Node, torch.fx.Node] = JournaledDict(lowerer.journal)  # lazy view -> lazy source
        self.acc_counter = JournaledCount(lowerer.journal)

    def job_origins(self, names) -> dict:
        """A job's ``origins`` and ``roots`` (``origins.Origins.job_origins``)."""
        return self.origins.job_origins(names, self.lowerer.env)

    def note_lazy_view(self, node: torch.fx.Node, source: torch.fx.Node) -> None:
        """Lazy ``node`` is a view of lazy ``source`` (``realize`` stores the source and views it)."""
        self.view_of[node] = source

    def is_lazy_view(self, node: torch.fx.Node) -> bool:
        return node in self.view_of

    # RuleBuilder: what the lowerer does itself
    def new_buffer(self, fake: torch.Tensor) -> Buffer:
        return self.lowerer.new_buffer(fake)

    def emit(self, line) -> None:
        self.lowerer.emit(line)

    def write_barrier(self, node: torch.fx.Node) -> None:
        self.lowerer.write_barrier(node)

    def realize(self, node: torch.fx.Node, loops: Loops) -> Buffer:
        view = self._realize_as_view(node)
        if view is not None:
            return view
        fake = node.meta["val"]
        hints = self.lowerer.hints
        size = [evaluate(n, hints) for n in to_exprs(fake.shape)]
        stride = [evaluate(s, hints) for s in to_exprs(fake.stride())]
        buf = self.lowerer.new_buffer(fake)
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
            self.lowerer.buffers[buf.name] = buf
            self.lowerer.roots[buf.name] = buf
            self.lowerer.fake_values.pop(buf.name, None)
            if strides == buf.stride and fake.storage_offset() != 0:
                self.lowerer.traced_offsets[buf.name] = to_expr(fake.storage_offset())  # views of it: Lowerer.view_buffer
        self.pointwise_job(buf, loops, [node.name])
        self.lowerer.define(node, buf)
        return buf

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
        hints = self.lowerer.hints
        size = [evaluate(n, hints) for n in to_exprs(src_fake.shape)]
        stride = [evaluate(st, hints) for st in to_exprs(src_fake.stride())]
        if src_fake.storage_offset() != 0 or not is_non_overlapping_and_dense(size, stride):
            return None
        base = self.lowerer.value(source)
        # ``base`` may itself be a view (a chain ``stack -> flatten -> transpose``): what
        # must hold is that the chain's root buffer holds its traced node's elements in
        # the traced layout at offset 0, so every view of that storage is ``as_strided``
        # of it with its own traced strides and offset.
        root = self.lowerer.roots.get(base.name)
        root_fake = self.lowerer.fake_values.get(root.name) if root is not None else None
        if (not isinstance(root_fake, torch.Tensor) or root_fake.storage_offset() != 0
                or StorageWeakRef(root_fake.untyped_storage()) != StorageWeakRef(fake.untyped_storage())
                or root.name in self.lowerer.traced_offsets or tuple(root.stride) != to_exprs(root_fake.stride())
                or not self.lowerer._as_strided_view((base,), fake)):
            return None
        self.lowerer.view(node, (base,), fake)
        return self.lowerer.value_of(node)

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
        self.lowerer.buffers[base.name] = base
        self.lowerer.roots[base.name] = base
        fake = self.lowerer.fake_values.pop(base.name)
        xs = tuple(sympy.Integer(0) if i in bcast else xvar(i) for i in range(len(size)))
        index = sympy.expand(sum((x * st for x, st, n in zip(xs, base.stride, base.size) if n != 1),
                                 sympy.Integer(0)))
        self.lowerer.items.append(Job(tuple(base.size), stores=[Store(base.name, index, cast(loops(xs), base.dtype))],
                              **self.job_origins([node.name])))
        view = Buffer(self.lowerer.fresh(), buf.size, buf.stride, buf.dtype, buf.device)
        self.lowerer.buffers[view.name] = view
        self.lowerer.roots[view.name] = base
        self.lowerer.fake_values[view.name] = fake
        self.lowerer.emit(View(view, base))
        self.lowerer.define(node, view)
        return view

    def pointwise_job(self, buf: Buffer, loops: Loops, origins) -> None:
        xs = tuple(xvar(i) for i in range(len(buf.size)))
        index = sympy.expand(sum((x * s for x, s, n in zip(xs, buf.stride, buf.size) if n != 1), sympy.Integer(0)))
        self.lowerer.items.append(Job(tuple(buf.size), stores=[Store(buf.name, index, cast(loops(xs), buf.dtype))],
                              **self.job_origins(origins)))

    # -- indexed writes (core/rules/indexed_writes.py) ---------------------------
    def indexed_stores(self, mode: str | None, dtype: torch.dtype) -> bool:
        """Whether the target's emitter renders an indexed store of ``mode`` (None: a plain
        write, ``"add"``) into a ``dtype`` buffer (``KernelEmitter.indexed_stores``)."""
        table = getattr(self.emitter, "indexed_stores", None) or {}
        return dtype in table.get(mode or "set", ())

    def in_place_refusal(self, node: torch.fx.Node) -> str | None:
        """Why indexed write ``node`` may not store into its ``self``'s storage; None when it
        may: ``self`` is in memory, in a storage of its own (not a view) that the program
        may write -- an input written back anyway, or a buffer the program allocated --, and
        nothing reads its old value after ``node`` (``core.reinplace.refusal``)."""
        arg = node.args[0] if node.args else None
        value = self.lowerer.value_of(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(value, Buffer):
            return "its self is not in memory"
        root = self.lowerer.roots.get(value.name)
        if root is None or root.name != value.name or value.offset != root.offset:
            return f"{value.name} is a view of {root.name if root is not None else 'another tensor'}"
        inputs = {b.name for b in self.lowerer.inputs if isinstance(b, Buffer)}
        if value.name in self.lowerer.constants:
            return f"{value.name} is a constant of the program"
        if value.name in self.lowerer.foreign and value.name not in inputs:
            return f"{value.name} is storage an extern op chose"
        return reinplace.refusal(node, self.lowerer.order)

    def indexed_write_target(self, node: torch.fx.Node) -> tuple[Buffer, bool]:
        """The buffer indexed write ``node`` stores into, and whether it is ``self``'s own
        storage (``in_place_refusal``: then every earlier value read later is realized
        first).  Otherwise a new buffer in the node's traced layout holding ``self``'s
        value (a lazy ``self`` computed straight into it, a stored one copied): the
        copying path, as eager's clone."""
        refused = self.in_place_refusal(node)
        arg = node.args[0]
        value = self.lowerer.value_of(arg)
        if refused is None:
            self._realize_readers_before_write(node, value)
            return value, True
        logs.logger("schedule").info("fxwrap: %s writes a copy of its self: %s", node.name, refused)
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) and self.lowerer.layout_bound(val)):
            raise Unsupported(f"{node.target}: a result whose layout uses sizes the program has no value for")
        dst = Buffer.from_fake("", val)
        if not is_dense(dst, self.lowerer.hints):
            raise Unsupported(f"{node.target}: a result that is not dense")
        dst = self.lowerer.fresh_buffer_like(dst)
        self.lowerer.fake_values[dst.name] = val
        if isinstance(value, Loops):
            self.pointwise_job(dst, value, [arg.name])
        else:
            self.lowerer.copy_into(dst, self.lowerer.value(arg), arg)
        return dst, False

    def reads_storage(self, loops: Loops, buf: Buffer) -> bool:
        """Whether lazy ``loops`` loads ``buf``'s storage (``buf`` or a view of it)."""
        value = loops(tuple(xvar(i) for i in range(len(loops.size))))
        root = self.lowerer.roots.get(buf.name, buf).name
        return any(n.op == "load" and self.lowerer.roots.get(load_buffer(n), buf).name == root
                   for n in walk(value) if n.op == "load")

    def same_storage(self, a: Buffer, b: Buffer) -> bool:
        """Whether ``a`` and ``b`` are views of one storage (the same root buffer)."""
        return self.lowerer.roots.get(a.name, a).name == self.lowerer.roots.get(b.name, b).name

    def value_of(self, node: torch.fx.Node):
        """What ``node`` computed so far: a ``Buffer`` in memory or a lazy ``Loops``."""
        return self.lowerer.value_of(node)

    def _realize_readers_before_write(self, node: torch.fx.Node, buf: Buffer) -> None:
        """Every lazy value made before ``node``, used after it and reading ``buf``'s storage,
        realized now: it holds what ``buf`` held before ``node`` writes into it (the values
        that do not read it stay lazy, unlike the full barrier of ``copy_``)."""
        for earlier in node.graph.nodes:
            if earlier is node:
                break
            value = self.lowerer.value_of(earlier)
            if (isinstance(value, Loops) and any(self.lowerer.order[u] > self.lowerer.order[node] for u in earlier.users)
                    and self.reads_storage(value, buf)):
                self.lowerer.value(earlier)

    def indexed_job(self, ranges, store: Store, origins) -> None:
        """A kernel job of one indexed store over ``ranges`` (a kernel of its own)."""
        self.lowerer.items.append(Job(tuple(ranges), stores=[store], **self.job_origins(origins)))

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
        name = f"acc{self.acc_counter.take()}"
        vals = ctx.val if isinstance(ctx.val, (tuple, list)) else [ctx.val]
        out = self.lowerer.new_buffer(vals[ctx.outputs_made])
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
        self.lowerer.items.append(Job(outer, reduced, (rank, tuple(dims)),
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
        name = f"acc{self.acc_counter.take()}"
        vals = ctx.val if isinstance(ctx.val, (tuple, list)) else [ctx.val]
        stores, results = [], []
        for out_index, field in enumerate(fields):
            out = self.lowerer.new_buffer(vals[out_index])
            acc = Op.acc(name, field, torch.int64 if kind in ("cummax", "cummin") and field == 0 else acc_dtype)
            # the scanned dim's term stays even at size 1: a scan's stores are indexed by r
            store_index = sympy.expand(sum((v * s for d, (v, s, n) in enumerate(zip(index, out.stride, out.size))
                                            if n != 1 or d == dim), sympy.Integer(0)))
            stores.append(Store(out.name, store_index, cast(acc, out.dtype)))
            results.append(Stored(out))
        self.lowerer.items.append(Job(tuple(loops.size[d] for d in kept), (loops.size[dim],), (rank, (dim,)),
                              reductions=[Reduction(name, kind, value, acc_dtype)], stores=stores,
                              **self.job_origins([ctx.node.name])))
        return results[0] if len(results) == 1 else tuple(results)

    def in_memory(self, node: torch.fx.Node, value):
        """The buffer holding ``value`` when it is the value of an argument node of ``node``
        (realized now if lazy), else None."""
        for arg in node.all_input_nodes:
            if self.lowerer.value_of(arg) is value:
                return self.lowerer.value(arg)
        return None
