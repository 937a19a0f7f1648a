"""``BuiltProgram``: one ATen graph's Wrapper IR lines, and what the FX converter, the memory
planner and the debug dump need beside them.  For ``lambda x: x.sin()`` on target ``cpu``::

    inputs  [Buffer('arg0', (8,), (1,), torch.float32, cpu)]
    lines   buf0 = empty_strided((8,), (1,), dtype=torch.float32, device='cpu')
            fxwrap_pointwise_0(arg0, buf0)
            return (buf0,)
    kernels [KernelRecord(fxwrap_pointwise_0, ...)]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from fxwrap.ir.lines import Buffer, Line, SizeInput


@dataclass
class BuiltProgram:
    """The lines of one graph, plus what the FX converter needs beside them."""

    inputs: list[Buffer | SizeInput]
    lines: list[Line]
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    fake_values: dict[str, Any] = field(default_factory=dict)
    symbol_hints: dict[sympy.Symbol, int] = field(default_factory=dict)
    #: the kernels made, in program order (``render.KernelRecord``): the debug dump's
    kernels: list = field(default_factory=list)
    #: one ``core.templates.TemplateChoiceRecord`` per template group, in program order
    template_choices: list = field(default_factory=list)
    #: the relations between size symbols its kernels rely on beyond what the traced shapes
    #: state (``core.lowering.SizeAssumption``): the input guard checks them
    size_assumptions: list = field(default_factory=list)

    @property
    def hints(self) -> dict[sympy.Symbol, int]:
        """A value for every size symbol the lines use: the inputs' hints, and those of
        symbols read off tensor sizes (``sym_size`` lines) or defined by ops."""
        hints = dict(self.symbol_hints)
        hints.update({i.symbol: i.hint for i in self.inputs if isinstance(i, SizeInput)})
        return hints
