"""The lowering rules in the lowerer (targets whose emitter renders kernels): nodes with a rule
become lazy loop IR, stored by jobs that ``core.scheduler`` fuses into kernels; GEMM nodes a
template computes become template jobs; the rest stay ATen extern calls.  For
``torch.softmax(x, -1)`` the rules give one reduction job storing ``buf2``, which renders to::

    buf2 = empty_strided((64, 128), (128, 1), dtype=torch.float32, device='cpu')
    # kernel fxwrap_reduction_0 (cpu): in_ptr0:input, out_ptr0:output
    fxwrap_reduction_0(arg0, buf2)
    return (buf2,)

A rule that declines (``fxwrap.DECLINE``, ``Unsupported``) leaves no trace: the lowerer's
journal is open while it runs, and undone when it gives up (``journal.Journal``).
"""
from __future__ import annotations

import logging
import operator

import torch

import fxwrap.core.rules  # noqa: F401  (registers the rules)
from fxwrap.core import extern
from fxwrap.core.lowering import (
    LoweringContext, Loops, SizeAssumption, Stored, Unsupported, recording_size_assumptions,
)
from fxwrap.core.scheduler import worth_storing
from fxwrap.ir.capabilities import Capabilities
from fxwrap.ir.lines import Buffer
from fxwrap.ir.loops import xvar
from fxwrap.wrapper_ir.realization import Realizer
from fxwrap.wrapper_ir.template_recognition import TemplateRecognizer

log = logging.getLogger("fxwrap")


class RuleContext(LoweringContext):
    """A rule's context: the node, its device, and the ``Realizer`` (``core.building.RuleBuilder``)
    through which the rule builds.  ``rollback()`` undoes what the rule did, back to the
    journal's mark taken when the context was made (a rule of a chain that declined)."""

    def __init__(self, node, device, realizer: Realizer, capabilities: Capabilities, journal):
        super().__init__(node, device)
        self.builder = realizer
        self._capabilities = capabilities
        self._journal = journal
        self._mark = journal.mark()
        self.outputs_made = 0  # var_mean: one reduction call per output

    def rollback(self) -> None:
        """Put the lowerer back as it was before the rule ran (``fxwrap.DECLINE``)."""
        self._journal.undo_to(self._mark)
        self.outputs_made = 0

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def reduction(self, loops: Loops, dims, keepdim, kind, acc_dtype, finish=None, field=0):
        return self.builder.reduction(self, loops, dims, keepdim, kind, acc_dtype, finish, field)

    def scan(self, loops: Loops, dim: int, kind: str, acc_dtype, fields):
        return self.builder.scan(self, loops, dim, kind, acc_dtype, fields)


class RuleLowering:
    """The kernel side of one lowerer: each node through its rule (the session's lowering
    table) or its template, with a ``Realizer`` and a ``TemplateRecognizer`` of its own.

    ``session`` (a ``fxwrap.plugins.session.CompileSession``) gives the target, the lowering
    table (``session.lowerings.rule(op)``), the dtypes kernels may hold (``session.kernel_dtypes``)
    and the emitter (``session.new_emitter(size_hints)``, for user-written Triton kernels).
    """

    def __init__(self, lowerer, session):
        self.lowerer = lowerer
        self.session = session
        self.target = session.target
        self.origins = lowerer.origins
        self.realizer = Realizer(lowerer, session.target.emitter)
        self.templates = TemplateRecognizer(lowerer, session)
        self._user_kernel_emitter = None

    @property
    def template_externs(self) -> dict:
        """Template output buffer -> the lines of its ATen call (the extern candidate)."""
        return self.templates.template_externs

    def realize(self, node: torch.fx.Node, loops: Loops) -> Buffer:
        return self.realizer.realize(node, loops)

    def pointwise_job(self, buf: Buffer, loops: Loops, origins) -> None:
        self.realizer.pointwise_job(buf, loops, origins)

    def is_lazy_view(self, node: torch.fx.Node) -> bool:
        return self.realizer.is_lazy_view(node)

    def user_kernel_emitter(self):
        if self._user_kernel_emitter is None:
            self._user_kernel_emitter = self.session.new_emitter(self.lowerer.hints)
        return self._user_kernel_emitter

    def rule_value(self, arg):
        """An argument as a rule sees it: a buffer as ``Stored``, a lazy value as it is."""
        if isinstance(arg, torch.fx.Node):
            v = self.lowerer.value_of(arg)
            return Stored(v) if isinstance(v, Buffer) else v
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.rule_value(a) for a in arg)
        return self.lowerer.value(arg)

    def lower(self, node: torch.fx.Node) -> bool:
        """Lower ``node`` through its template or rule; False where it stays what the lowerer
        makes of it without rules (``Lowerer.lower_extern``)."""
        lowerer = self.lowerer
        if node.target is operator.getitem:  # one result of a lazy multi-output value
            lowerer.lower_extern(node)
            self.origins.lazy_origins[node] = self.origins.in_program_order(
                self.origins.inlined_origins(node, lowerer.env))
            return True
        if (self.session.template_mode != "off" and isinstance(node.target, torch._ops.OpOverload)
                and node.target in self.session.template_ops and node.name not in lowerer.extern_nodes
                and self._all_on_device(node)):
            self.templates.lower(node)
            return True
        rule = self.session.lowerings.rule(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
        if rule is None or node.name in lowerer.extern_nodes or not self._all_on_device(node):
            return False
        self._store_shared_values(node)
        journal = lowerer.journal
        journal.open()
        try:
            ctx = RuleContext(node, self._device_of(node), self.realizer, self.session.capabilities, journal)
            args = self.rule_value(node.args)
            kwargs = {k: self.rule_value(v) for k, v in node.kwargs.items()}
            assumed: list[SizeAssumption] = []  # size relations the rule relies on (broadcasts)
            try:
                with recording_size_assumptions(assumed):
                    result = self.templates.reshape_of_template(node)
                    result = rule(ctx, *args, **kwargs) if result is None else result
            except Unsupported:
                result = None
            if result is None:
                journal.undo_to(0)  # the extern call starts from the state before the rule
        finally:
            journal.close()
        if result is None:
            return False
        lowerer.size_assumptions += [
            SizeAssumption(a.condition, f"{node.target} (node {node.name}) reads {a.what}") for a in assumed]
        lowerer.define(node, _unwrap(result))
        self.origins.lazy_origins[node] = self.origins.computed_by(node, lowerer.env)
        source = node.args[0] if node.args else None
        if (extern.is_view(node.target) and isinstance(lowerer.value_of(node), Loops)
                and isinstance(source, torch.fx.Node) and isinstance(lowerer.value_of(source), Loops)):
            self.realizer.note_lazy_view(node, source)
        return True

    def _store_shared_values(self, node) -> None:
        """Realize each lazy argument of ``node`` that several nodes read and that is
        too costly to inline into each of them (``scheduler.worth_storing``, with the
        emitter's ``costly_ops``)."""
        for arg in node.all_input_nodes:
            loops = self.lowerer.value_of(arg)
            if isinstance(loops, Loops) and len(arg.users) > 1:
                value = loops(tuple(xvar(i) for i in range(len(loops.size))))
                if worth_storing(value, len(arg.users), getattr(self.target.emitter, "costly_ops", frozenset())):
                    self.realizer.realize(arg, loops)

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
        kernel_dtypes = self.session.kernel_dtypes
        bad = sorted({str(t.dtype) for t in (*vals, *inputs) if t.dtype not in kernel_dtypes})
        if bad:
            log.info("fxwrap: %s (%s) stays an ATen extern call on target %s: its kernels cannot hold %s "
                     "(session.kernel_dtypes: the device's capabilities().dtypes and the emitter's "
                     "supported_dtypes)", node.name, node.target, self.target.name, ", ".join(bad))
            return False
        return True


def _unwrap(result):
    if isinstance(result, Stored):
        return result.buffer
    if isinstance(result, tuple):
        return tuple(_unwrap(r) for r in result)
    return result
