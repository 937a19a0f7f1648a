"""From the arguments of the function ``fxwrap.lower`` compiled to a program's graph inputs.

Dynamo orders a graph's inputs by first use, lifts a module's parameters and
captured tensors into them, and adds size symbols under ``dynamic=True``: for
``def f(x, w): return w.sum() + x`` the program takes ``(w, x)``, and a program of
``nn.Linear`` takes ``(weight, bias, x)``.  ``ArgumentMap`` records, per graph
input, where its value comes from::

    ("arg", 1)           the function's positional argument 1
    ("const", tensor)    a tensor the graph captured (a parameter, a global)
    ("size", s0, 1, 0)   size symbol s0 read from argument 1's dimension 0

so that ``Program.run(x, w)`` calls the graph with ``(w, x)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy
import torch

from fxwrap.wrapper_ir.lines import Buffer, SizeInput


@dataclass(frozen=True)
class ArgumentMap:
    """One source per graph input (see the module docstring)."""

    sources: tuple

    @classmethod
    def build(cls, graph_inputs: Sequence[Buffer | SizeInput], dynamo_inputs: Sequence,
              fn_args: Sequence) -> "ArgumentMap | None":
        """Match dynamo's example inputs to ``fn_args`` by identity; None when the
        program's inputs are not dynamo's (a backward program) or a value is unknown."""
        if len(graph_inputs) != len(dynamo_inputs):
            return None
        position = {id(a): j for j, a in enumerate(fn_args) if isinstance(a, torch.Tensor)}
        sources: list = []
        for graph_input, value in zip(graph_inputs, dynamo_inputs):
            if isinstance(graph_input, SizeInput):
                sources.append(("size", graph_input.symbol))
            elif isinstance(value, torch.Tensor) and id(value) in position:
                sources.append(("arg", position[id(value)]))
            elif isinstance(value, torch.Tensor):
                sources.append(("const", value))
            else:
                return None
        resolved = [_size_source(s[1], graph_inputs, sources) if s[0] == "size" else s for s in sources]
        return None if any(s is None for s in resolved) else cls(tuple(resolved))

    def __repr__(self) -> str:
        def show(source):
            if source[0] == "const":
                return f"('const', tensor{tuple(source[1].shape)})"
            return repr(source)
        return f"ArgumentMap({', '.join(show(s) for s in self.sources)})"

    def __call__(self, args: Sequence) -> list:
        """The graph inputs for the function's positional ``args``."""
        out = []
        for source in self.sources:
            kind = source[0]
            if kind == "arg":
                out.append(args[source[1]])
            elif kind == "const":
                out.append(source[1])
            else:
                _, _, j, dim = source
                out.append(int(args[j].shape[dim]))
        return out


def _size_source(symbol: sympy.Symbol, graph_inputs, sources):
    """``("size", symbol, j, dim)`` for the first argument tensor with ``symbol`` as a dim."""
    for graph_input, source in zip(graph_inputs, sources):
        if isinstance(graph_input, Buffer) and source[0] == "arg":
            for dim, n in enumerate(graph_input.size):
                if n == symbol:
                    return ("size", symbol, source[1], dim)
    return None
