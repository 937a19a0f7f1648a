"""Provenance of the lowerer's values: the ATen nodes a lazy value, a job and a kernel compute,
in program order (docs/wrapper-ir.md, "Provenance").

For ``y = relu(x); z = y + 1`` lowered lazily, ``computed_by(z)`` is ``(relu, add)``: ``z``'s
own node and the lazy ``relu`` it inlines; a job storing ``z`` carries::

    origins=[Origin(node='relu', ...), Origin(node='add', ...)], roots=['add']
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from fxwrap.core.lowering import Loops
from fxwrap.runtime.provenance import Origin, origin_of
from fxwrap.wrapper_ir.journal import Journal, JournaledDict


def in_program_order(origins, positions: Mapping[str, int]) -> tuple[Origin, ...]:
    """``origins`` without repeats, sorted by their nodes' positions in the graph."""
    unique = {o.node: o for o in origins}
    return tuple(sorted(unique.values(), key=lambda o: positions.get(o.node, -1)))


class Origins:
    """Which ATen nodes each value of one graph computes (``runtime.provenance.Origin``): the
    node's own origin (read once per node) and, for a lazy value, those it inlines
    (``lazy_origins``, undone with the lowerer's journal)."""

    def __init__(self, gm: torch.fx.GraphModule, journal: Journal):
        self.positions = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        self.node_named = {n.name: n for n in gm.graph.nodes}
        self.lazy_origins: dict[torch.fx.Node, tuple[Origin, ...]] = JournaledDict(journal)
        self._read: dict[torch.fx.Node, Origin] = {}

    def origin_of(self, node: torch.fx.Node) -> Origin:
        """The provenance of ATen node ``node`` (``provenance.origin_of``, once per node)."""
        found = self._read.get(node)
        if found is None:
            found = self._read[node] = origin_of(node)
        return found

    def in_program_order(self, origins) -> tuple[Origin, ...]:
        return in_program_order(origins, self.positions)

    def inlined_origins(self, node: torch.fx.Node, env: Mapping) -> tuple[Origin, ...]:
        """The origins of the lazy values ``node`` reads (``env``: node -> value so far),
        inlined into whatever computes it."""
        found: list[Origin] = []
        for arg in node.all_input_nodes:
            value = env.get(arg)
            if isinstance(value, Loops) or (isinstance(value, tuple) and any(isinstance(v, Loops) for v in value)):
                found += self.lazy_origins.get(arg, ())
        return tuple(found)

    def computed_by(self, node: torch.fx.Node, env: Mapping) -> tuple[Origin, ...]:
        """Every ATen node a value of ``node`` computes: itself and the lazy values it inlines."""
        known = self.lazy_origins.get(node)
        if known is not None:
            return known
        own = (self.origin_of(node),) if isinstance(node.target, torch._ops.OpOverload) else ()
        return self.in_program_order(self.inlined_origins(node, env) + own)

    def job_origins(self, names, env: Mapping) -> dict:
        """A job's ``origins`` and ``roots`` for the ATen nodes (by name) whose values it stores."""
        origins = [o for name in names for o in self.computed_by(self.node_named[name], env)]
        return {"origins": list(self.in_program_order(origins)), "roots": list(names)}
