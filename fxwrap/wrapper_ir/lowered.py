"""What the lowerer hands the renderer: the frozen record of one lowered ATen graph.

``lowerer.lower`` walks the graph through the lowering rules and returns a
``LoweredProgram``; ``render.Renderer`` makes kernels of its jobs and lines of the rest.
For ``lambda x: torch.relu(x) + 1`` on target ``cpu`` its ``items`` are one job (the
scheduler fuses jobs into kernels) and the return line::

    Job((8, 16), stores=[Store('buf1', 16*x0 + x1, add(relu(load(arg0, 16*x0 + x1)), 1.0))],
        origins=[relu, add], roots=['add'])
    return (buf1,)

``LoweringSettings`` is how one graph is lowered: the same for every try of a program
(a kernel the target cannot render becomes extern calls: ``extern_nodes`` grows).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import sympy
import torch

from fxwrap.ir.lines import Buffer, Line, SizeInput


@dataclasses.dataclass(frozen=True)
class LoweringSettings:
    """How a graph is lowered: the target's name; for a nested program (a cond branch, a loop
    body) the layout (a ``Buffer``, or None: any) of each result, None for the top program;
    the kernels' name prefix (``fxwrap_pointwise_0``); the memory plan's reuse and the
    wrapper passes of nested programs (``core.passes.LinesPass``, as the top program's); and
    the nodes kept as ATen extern calls (their kernel did not render)."""

    target_name: str
    output_layouts: tuple | None = None
    kernel_prefix: str = "fxwrap"
    reuse: bool = True
    wrapper_passes: tuple = ()
    extern_nodes: frozenset = frozenset()

    def nested(self, name: str, output_layouts) -> "LoweringSettings":
        """The settings of subgraph ``name`` of a control-flow op (its kernels named after it)."""
        return dataclasses.replace(self, output_layouts=tuple(output_layouts),
                                   kernel_prefix=f"{self.kernel_prefix}_{name}", extern_nodes=frozenset())


@dataclasses.dataclass(frozen=True)
class LoweredProgram:
    """One ATen graph lowered: ``items`` (``Line``s and scheduler ``Job``s, in program order),
    every buffer by name and the root buffer whose storage each one views, the program's
    inputs, constants, fake values and size hints, the ATen call of each template job's
    output (its extern candidate), each ATen node's position (origins sort by it), the
    number the next buffer name takes (the renderer's workspaces go on from it), and the
    size relations its kernels rely on (the input guard checks them)."""

    settings: LoweringSettings
    inputs: tuple[Buffer | SizeInput, ...]
    items: tuple[Any, ...]
    buffers: Mapping[str, Buffer]
    roots: Mapping[str, Buffer]
    constants: Mapping[str, torch.Tensor]
    fake_values: Mapping[str, Any]
    symbol_hints: Mapping[sympy.Symbol, int]
    template_externs: Mapping[str, tuple[Line, ...]]
    positions: Mapping[str, int]
    next_name: int
    size_assumptions: tuple = ()  # core.lowering.SizeAssumption: what the kernels rely on, checked by the guard

    def __post_init__(self) -> None:
        for name in ("buffers", "roots", "constants", "fake_values", "symbol_hints", "template_externs",
                     "positions"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        """A value for every size symbol the program uses (``BuiltProgram.hints``)."""
        hints = dict(self.symbol_hints)
        hints.update({i.symbol: i.hint for i in self.inputs if isinstance(i, SizeInput)})
        return hints
