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

import logging
import operator

import torch

import fxwrap.core.rules  # noqa: F401  (registers the rules)
from fxwrap.core import extern, logs
from fxwrap.ir.capabilities import Capabilities
from fxwrap.core.lowering import (
    LoweringContext, Loops, SizeAssumption, Stored, Unsupported, loads, recording_size_assumptions,
)
from fxwrap.ir.lines import Buffer, Line, buffers_defined
from fxwrap.ir.loops import xvar
from fxwrap.core.scheduler import worth_storing
from fxwrap.runtime.provenance import Origin
from fxwrap.wrapper_ir import build
from fxwrap.wrapper_ir.build_provenance import ProvenanceMixin
from fxwrap.wrapper_ir.build_realize import RealizationMixin
from fxwrap.wrapper_ir.build_render import RenderMixin
from fxwrap.wrapper_ir.build_templates import TemplateRecognitionMixin

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



class KernelBuilder(ProvenanceMixin, RealizationMixin, TemplateRecognitionMixin, RenderMixin, build._Builder):
    """The extern builder plus lowering rules, jobs and fusion, for one graph.

    Split by concern: lowering (this module: each node through its rule, or an extern
    call), realization (``build_realize``), provenance (``build_provenance``), template
    recognition (``build_templates``), render / compile / choose (``build_render``).  A
    lowering rule reaches it only through its context (``core.building.RuleBuilder``).

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
        # template groups' candidate times of this program, by group key (template_choice.time_candidates)
        self.template_timings: dict[str, dict[str, float]] = {}
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
            assumed: list[SizeAssumption] = []
            try:
                with recording_size_assumptions(assumed):
                    result = self._template_reshape(node)
                    result = rule(ctx, *args, **kwargs) if result is None else result
            except Unsupported:
                result = None
            if result is None and ctx.checkpoint is not None:
                ctx.checkpoint.restore()  # the extern call below starts from the state before the rule
            if result is not None:
                self.out.size_assumptions += [
                    SizeAssumption(a.condition, f"{node.target} (node {node.name}) reads {a.what}") for a in assumed]
                self.env[node] = _unwrap(result)
                self.lazy_origins[node] = self.computed_by(node)
                source = node.args[0] if node.args else None
                if (extern.is_view(node.target) and isinstance(self.env[node], Loops)
                        and isinstance(source, torch.fx.Node) and isinstance(self.env.get(source), Loops)):
                    self.view_of[node] = source
                return
        super().call_function(node)

    def _store_shared_values(self, node) -> None:
        """Realize each lazy argument of ``node`` that several nodes read and that is
        too costly to inline into each of them (``scheduler.worth_storing``, with the
        emitter's ``costly_ops``)."""
        for arg in node.all_input_nodes:
            loops = self.env.get(arg)
            if isinstance(loops, Loops) and len(arg.users) > 1:
                value = loops(tuple(xvar(i) for i in range(len(loops.size))))
                if worth_storing(value, len(arg.users), getattr(self.target.emitter, "costly_ops", frozenset())):
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


def _unwrap(result):
    if isinstance(result, Stored):
        return result.buffer
    if isinstance(result, tuple):
        return tuple(_unwrap(r) for r in result)
    return result
