"""Template recognition: which GEMM nodes become template jobs (``fxwrap.core.templates``,
docs/templates.md).  ``addmm(b, x, w)`` that template ``cpp_gemm`` accepts becomes its ATen
call, kept aside as the extern candidate::

    buf2 = empty_strided((128, 3072), (3072, 1), ...)
    aten.addmm.out(arg2, arg0, buf0, out=buf2)

and a template job in its place, which the scheduler fuses with the epilogue::

    Job((128, 3072), stores=[Store('buf2', 3072*x0 + x1, add(load(arg2, x1), template_out(...)))],
        template=TemplateCall(aten.addmm.default, ...))
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.core import logs
from fxwrap.core.lowering import Loops, broadcast, cast, loads
from fxwrap.core.scheduler import Job
from fxwrap.core.templates import TemplateCall
from fxwrap.ir.lines import Allocate, Buffer, CallExtern, Line
from fxwrap.ir.loops import Op, Store, xvar
from fxwrap.ir.symbolic import contiguous_strides, evaluate, to_exprs
from fxwrap.wrapper_ir.journal import JournaledDict


class TemplateRecognizer:
    """GEMM nodes a template may compute (``core.templates``), for one lowerer: the ATen call
    kept as the extern candidate (``template_externs``: output buffer -> its lines), a
    template job storing the op's result, and reshapes of a template's result read lazily
    so that its epilogue joins the template (``template_reshape_of``: the reshape node ->
    the template's buffer); both in the lowerer's journal."""

    def __init__(self, lowerer, session):
        self.lowerer = lowerer
        self.session = session
        self.target = session.target
        self.origins = lowerer.origins
        self.template_externs: dict[str, list[Line]] = JournaledDict(lowerer.journal)
        self.template_reshape_of: dict[torch.fx.Node, Buffer] = JournaledDict(lowerer.journal)

    def reshape_of_template(self, node) -> Loops | None:
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
            value = self.lowerer.value_of(source)
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

    def lower(self, node) -> None:
        """``node`` (an op some template computes) as its ATen call, as without templates;
        then, when a template of the session applies, that call becomes the extern
        candidate of a template job storing the op's result (``template_out``, plus
        ``addmm``'s bias and scales) into the same buffer (``fxwrap.core.templates``)."""
        self.lowerer.value(node.args)  # operands in memory first: their kernels stay where they are
        mark = len(self.lowerer.items)
        self.lowerer.lower_extern(node)
        made = self.lowerer.items[mark:]
        out = self.lowerer.value_of(node)
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
        del self.lowerer.items[mark:]
        self.template_externs[out.name] = made
        xs = call.index
        value = cast(self._template_value(node, call, xs), out.dtype)
        index = sympy.expand(sum((x * st for x, st, n in zip(xs, out.stride, out.size) if n != 1), sympy.Integer(0)))
        self.lowerer.items.append(Job(tuple(out.size), stores=[Store(out.name, index, value)], template=call,
                              **self.origins.job_origins([node.name], self.lowerer.env)))

    def _template_call(self, node, out: Buffer) -> TemplateCall | None:
        """The ``TemplateCall`` of a GEMM node (mm, addmm, bmm: operands of one floating dtype;
        ``_weight_int8pack_mm(x, w, scales)``: ``w`` int8 ``(N, K)``, presented as the operand
        ``b`` of size ``(K, N)`` -- the same buffer through transposed strides --, ``scales``
        a third operand); None otherwise (the node stays its ATen call)."""
        op = node.target
        args = [self.lowerer.value(a) for a in node.args]
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
        hints = tuple((k, evaluate(v, self.lowerer.hints)) for k, v in sizes)
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
            bias = cast(broadcast(loads(self.lowerer.value(node.args[0])), call.output.size)(xs), dtype)
            bias = bias if beta == 1 else Op("mul", dtype, (bias, Op.const(beta, dtype)))
            value = Op("add", dtype, (bias, value))
        return value



#: views that keep the row-major order of elements: a template's result seen through one
#: stays lazy, so that the epilogue over it joins the template (``reshape_of_template``)
_RESHAPES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default,
                       torch.ops.aten.reshape.default, torch.ops.aten.alias.default})
