"""Provenance of the kernel builder's values: the ATen nodes a lazy value, a job and a kernel
compute, in program order (docs/wrapper-ir.md, "Provenance").  Mixed into
``build_kernels.KernelBuilder``."""
from __future__ import annotations

import torch

from fxwrap.core.lowering import Loops
from fxwrap.runtime.provenance import Origin


class ProvenanceMixin:
    """Which ATen nodes each value, job and kernel computes (``runtime.provenance.Origin``):
    the part of ``KernelBuilder`` that keeps ``lazy_origins`` and reads ``position``,
    ``node_named`` and ``env``."""

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
