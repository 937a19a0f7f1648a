"""From the arguments of the function ``fxwrap.lower`` compiled to a program's graph inputs.

Dynamo orders a graph's inputs by first use, lifts a module's parameters and
captured tensors into them, and adds size symbols under ``dynamic=True``: for
``def f(x, w): return w.sum() + x`` the program takes ``(w, x)``, and a program of
``nn.Linear`` takes ``(weight, bias, x)``.  ``ArgumentMap`` records, per graph
input, where its value comes from::

    ("arg", 1)                    the function's positional argument 1 (a tensor)
    ("item", 1, 3)                argument 1's item 3 (a tensor in a list or tuple: an optimizer's
                                  parameters)
    ("const", tensor)             a tensor the graph captured (a parameter, a global)
    ("size", s0, 1, 0)            size symbol s0 read from argument 1's dimension 0
    ("offset", s3, 1)             symbol s3 read as argument 1's storage offset
    ("stride", s4, 1, 0)          symbol s4 read as argument 1's stride of dimension 0
    ("int", 2)                    argument 2, a Python int that dynamo made a size symbol
    ("float", 2, dtype, device)   argument 2, a Python float that dynamo made a 0-d tensor input

so that ``Program.run(x, w)`` calls the graph with ``(w, x)``.  A Python scalar that
is no graph input was baked into the program by dynamo (every int and float under
``dynamic=False``): the map keeps its value in ``baked`` and ``run`` refuses another
value rather than silently computing with the old one.  ``run`` also refuses a call
with more or fewer arguments than ``lower`` was given.
"""
from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fxwrap.runtime.guards import InputMismatchError

if TYPE_CHECKING:
    import sympy

    from fxwrap.ir.lines import Buffer, SizeInput


@dataclass(frozen=True)
class ArgumentMap:
    """One source per graph input (see the module docstring), the function's parameter
    names, and the Python scalars dynamo baked in (``(position, value)``)."""

    sources: tuple
    parameters: tuple[str, ...] = ()
    baked: tuple = ()

    @classmethod
    def build(cls, graph_inputs: Sequence[Buffer | SizeInput], dynamo_inputs: Sequence,
              fn_args: Sequence, fn=None, input_names: Sequence[str | None] = (),
              input_sizes: Sequence[tuple[str, int] | None] = ()) -> "ArgumentMap | None":
        """Match dynamo's example inputs to ``fn_args``: tensors by identity, else by the
        name of the function's local that dynamo read (``input_names``, one per dynamo
        input); a size input by a tensor input with its symbol as a dimension, else by the
        ``(local, dim)`` dynamo read it from (``input_sizes``: a size that a guard made a
        constant in every buffer, ``x.shape[0] == 2``).  None when the program's inputs are
        not dynamo's (a backward program) or a value is unknown."""
        from fxwrap.ir.lines import Buffer, SizeInput  # the compiler's types; loading needs neither

        if len(graph_inputs) != len(dynamo_inputs):
            return None
        parameters = parameter_names(fn, len(fn_args))
        position = {id(a): j for j, a in enumerate(fn_args) if isinstance(a, torch.Tensor)}
        items = {id(t): (j, i) for j, a in enumerate(fn_args) if isinstance(a, (list, tuple))
                 for i, t in enumerate(a) if isinstance(t, torch.Tensor)}
        by_name = {name: j for j, name in enumerate(parameters)}
        names = list(input_names) + [None] * (len(dynamo_inputs) - len(input_names))
        sources: list = []
        for graph_input, value, name in zip(graph_inputs, dynamo_inputs, names):
            j = by_name.get(name)
            arg = fn_args[j] if j is not None else None
            if isinstance(value, torch.Tensor) and id(value) in position:
                sources.append(("arg", position[id(value)]))
            elif isinstance(value, torch.Tensor) and id(value) in items:
                sources.append(("item", *items[id(value)]))
            elif isinstance(arg, bool):
                return None
            elif isinstance(graph_input, SizeInput) and isinstance(arg, int):
                sources.append(("int", j))
            elif isinstance(graph_input, SizeInput):
                sources.append(("size", graph_input.symbol))
            elif isinstance(graph_input, Buffer) and isinstance(arg, float) and graph_input.size == ():
                sources.append(("float", j, graph_input.dtype, graph_input.device))
            elif isinstance(value, torch.Tensor):
                sources.append(("const", value))
            else:
                return None
        read_from = list(input_sizes) + [None] * (len(dynamo_inputs) - len(input_sizes))
        resolved = [s if s[0] != "size" else
                    _size_source(s[1], graph_inputs, sources) or _read_size(s[1], read_from[i], by_name, fn_args)
                    for i, s in enumerate(sources)]
        if any(s is None for s in resolved):
            return None
        used = {s[1] for s in resolved if s[0] in ("arg", "item", "int", "float")}
        baked = tuple((j, a) for j, a in enumerate(fn_args)
                      if j not in used and isinstance(a, (bool, int, float, complex, str)))
        return cls(tuple(resolved), parameters, baked)

    def __repr__(self) -> str:
        def show(source):
            if source[0] == "const":
                return f"('const', tensor{tuple(source[1].shape)})"
            return repr(source[:2] if source[0] == "float" else source)
        baked = f", baked={list(self.baked)}" if self.baked else ""
        return f"ArgumentMap({', '.join(show(s) for s in self.sources)}{baked})"

    def describe(self, j: int) -> str:
        """How errors name argument ``j``: ``"x (argument 0)"``."""
        name = self.parameters[j] if j < len(self.parameters) else None
        return f"{name} (argument {j})" if name else f"argument {j}"

    def labels(self, graph_inputs: Sequence[Buffer | SizeInput]) -> dict[str, str]:
        """Graph input name -> how guard errors name it (see ``InputGuard.name_inputs``)."""
        labels = {}
        for graph_input, source in zip(graph_inputs, self.sources):
            kind = source[0]
            if kind in ("arg", "int", "float"):
                labels[graph_input.name] = self.describe(source[1])
            elif kind == "item":
                labels[graph_input.name] = f"{self.describe(source[1])}[{source[2]}]"
            elif kind == "size":
                name = self.parameters[source[2]] if source[2] < len(self.parameters) else None
                labels[graph_input.name] = (f"the size {graph_input.name} = {name or 'argument'}.shape"
                                            f"[{source[3]}] (argument {source[2]})")
            elif kind in ("offset", "stride"):
                name = self.parameters[source[2]] if source[2] < len(self.parameters) else None
                read = "storage_offset()" if kind == "offset" else f"stride({source[3]})"
                labels[graph_input.name] = (f"the {kind} {graph_input.name} = {name or 'argument'}"
                                            f".{read} (argument {source[2]})")
            else:
                labels[graph_input.name] = f"captured tensor {graph_input.name}"
        return labels

    def __call__(self, args: Sequence) -> list:
        """The graph inputs for the function's positional ``args``."""
        self.check_call(args)
        out = []
        for source in self.sources:
            kind = source[0]
            if kind == "arg":
                out.append(args[source[1]])
            elif kind == "item":
                out.append(self._item(args, source[1], source[2]))
            elif kind == "int":  # a size symbol: checked here, before any runner computes with it
                value = args[source[1]]
                if type(value) is not int:
                    raise InputMismatchError(f"{self.describe(source[1])} is a size of the program (dynamo made "
                                             f"the int a size symbol) and must be an int, got "
                                             f"{type(value).__name__} {value!r}"[:300] + "; pass an int")
                out.append(value)
            elif kind == "const":
                out.append(source[1])
            elif kind == "float":
                out.append(self._wrapped_float(source, args[source[1]]))
            elif kind == "offset":
                value = self._tensor_read(args, source[2], 0, "storage_offset()", source[1])
                out.append(int(value.storage_offset()))
            elif kind == "stride":
                value, dim = self._tensor_read(args, source[2], source[3] + 1, f"stride({source[3]})",
                                               source[1]), source[3]
                out.append(int(value.stride(dim)))
            else:
                _, symbol, j, dim = source
                value = self._tensor_read(args, j, dim + 1, f"shape[{dim}]", symbol)
                out.append(int(value.shape[dim]))
        return out

    def _tensor_read(self, args: Sequence, j: int, rank: int, read: str, symbol) -> torch.Tensor:
        """Argument ``j``, a tensor of at least ``rank`` dimensions that the program reads
        size symbol ``symbol`` off (``read``: ``"shape[1]"``); anything else is an
        ``InputMismatchError`` here, before any runner computes with the symbol (a target's
        runner may plan its memory from the sizes before its GraphModule's input guard runs)."""
        value = args[j]
        if isinstance(value, torch.Tensor) and value.dim() >= rank:
            return value
        name = self.parameters[j] if j < len(self.parameters) else "argument"
        reads = f"the program reads its size symbol {symbol} = {name}.{read}"
        redo = "or lower the function again with an example like it"
        if isinstance(value, torch.Tensor):
            raise InputMismatchError(f"{self.describe(j)} has {value.dim()} dimensions (size {tuple(value.shape)}); "
                                     f"{reads}: pass a tensor of the rank lowered for, {redo}")
        raise InputMismatchError(f"{self.describe(j)} must be a tensor ({reads}), got "
                                 f"{type(value).__name__} {value!r}"[:300] + f"; pass a tensor, {redo}")

    def check_call(self, args: Sequence) -> None:
        """Raise ``TypeError`` on a wrong number of arguments, ``InputMismatchError`` on None
        for a tensor argument or a Python scalar other than the one baked into the program."""
        expected = len(self.parameters)
        if len(args) != expected:
            names = ", ".join(self.parameters)
            missing = self.parameters[len(args):]
            detail = (f"missing {', '.join(missing)}" if missing
                      else f"{len(args) - expected} extra")
            raise TypeError(f"program.run() takes {expected} positional argument"
                            f"{'s' if expected != 1 else ''} ({names}), as given to fxwrap.lower, "
                            f"but got {len(args)} ({detail})")
        for source in self.sources:
            if source[0] == "arg" and args[source[1]] is None:
                raise InputMismatchError(f"{self.describe(source[1])} is None; the program was compiled for a "
                                         "tensor there: pass a tensor")
        for j, value in self.baked:
            got = args[j]
            if type(got) is not type(value) or got != value:
                raise InputMismatchError(
                    f"{self.describe(j)} was baked into the program as {value!r} (dynamo specializes "
                    f"Python scalars under dynamic=False), got {got!r}; pass {value!r}, or lower the "
                    "function again with this value (or with dynamic=True, which makes ints and "
                    "floats program inputs)")

    def _item(self, args: Sequence, j: int, i: int) -> torch.Tensor:
        """Item ``i`` of argument ``j`` (a list or tuple of tensors), or an ``InputMismatchError``."""
        container = args[j]
        if not isinstance(container, (list, tuple)) or len(container) <= i or \
                not isinstance(container[i], torch.Tensor):
            raise InputMismatchError(f"{self.describe(j)} must be a list or tuple with a tensor at item {i}, as "
                                     f"given to fxwrap.lower; got {type(container).__name__} {container!r}"[:300])
        return container[i]

    def _wrapped_float(self, source, value):
        _, j, dtype, device = source
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputMismatchError(f"{self.describe(j)} must be a Python float (the program takes it "
                                     f"as a 0-d {dtype} tensor), got {type(value).__name__} {value!r}; "
                                     "pass a float")
        return torch.tensor(value, dtype=dtype, device=device)


def parameter_names(fn, count: int) -> tuple[str, ...]:
    """The names of ``fn``'s first ``count`` positional parameters (``arg{j}`` where
    the signature does not say, e.g. ``*args``)."""
    names: list[str] = []
    if isinstance(fn, torch.nn.Module):  # its call's signature is (*args, **kwargs): forward's names
        fn = fn.forward
    try:
        params = list(inspect.signature(fn).parameters.values()) if fn is not None else []
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    names = names[:count]
    return tuple(names + [f"arg{j}" for j in range(len(names), count)])


def _size_source(symbol: sympy.Symbol, graph_inputs, sources):
    """``("size", symbol, j, dim)`` for the first argument tensor with ``symbol`` as a dim."""
    from fxwrap.ir.lines import Buffer

    for graph_input, source in zip(graph_inputs, sources):
        if isinstance(graph_input, Buffer) and source[0] == "arg":
            for dim, n in enumerate(graph_input.size):
                if n == symbol:
                    return ("size", symbol, source[1], dim)
    return None


def _read_size(symbol: sympy.Symbol, read_from: tuple[str, int | None] | None, by_name: dict, fn_args: Sequence):
    """``("size", symbol, j, dim)`` for the size dynamo read as ``fn_args[j].shape[dim]``,
    ``("stride", symbol, j, d)`` for ``fn_args[j].stride(d)`` (``dim`` is ``-1 - d``),
    ``("offset", symbol, j)`` for ``fn_args[j].storage_offset()``."""
    if read_from is None or read_from[0] not in by_name:
        return None
    j, dim = by_name[read_from[0]], read_from[1]
    arg = fn_args[j]
    if not isinstance(arg, torch.Tensor):
        return None
    if dim is None:
        return ("offset", symbol, j)
    if dim < 0:
        return ("stride", symbol, j, -1 - dim) if arg.dim() > -1 - dim else None
    return ("size", symbol, j, dim) if arg.dim() > dim else None


@dataclass(frozen=True)
class OutputMap:
    """How ``Program.run`` rebuilds what the lowered function returns from the graph's
    flat outputs: the function's output pytree (``spec``) and, per leaf, ``("out", i)``
    (graph output ``i``), ``("arg", j)`` (the function returned its argument ``j``) or
    ``("value", v)`` (a constant dynamo folded into the return value)."""

    spec: object
    leaves: tuple

    @classmethod
    def build(cls, returned, graph_outputs: Sequence, fn_args: Sequence) -> "OutputMap | None":
        """Match the leaves of ``returned`` (what the compiled function returned during
        lowering) to the ``graph_outputs`` of that same call: by identity, else (a view
        of an input, which AOTAutograd regenerates from the graph's output as a new
        tensor object) by storage and layout.  None when a tensor leaf is none of these."""
        leaves, spec = torch.utils._pytree.tree_flatten(returned)
        tensors = [(i, o) for i, o in enumerate(graph_outputs) if isinstance(o, torch.Tensor)]
        outputs = {id(o): i for i, o in tensors}
        aliases: dict = {}
        for i, o in tensors:
            aliases.setdefault(_alias_key(o), i)
        args = {id(a): j for j, a in enumerate(fn_args) if isinstance(a, torch.Tensor)}
        sources = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor) and id(leaf) in outputs:
                sources.append(("out", outputs[id(leaf)]))
            elif isinstance(leaf, torch.Tensor) and id(leaf) in args:
                sources.append(("arg", args[id(leaf)]))
            elif isinstance(leaf, torch.Tensor) and _alias_key(leaf) in aliases:
                sources.append(("out", aliases[_alias_key(leaf)]))
            elif isinstance(leaf, torch.Tensor):
                return None
            else:
                sources.append(("value", leaf))
        return cls(spec, tuple(sources))

    def __reduce__(self):
        # the spec pickles as pytree's own text form where it has one (a pickled TreeSpec
        # names pytree's internal classes, some deprecated)
        try:
            spec = torch.utils._pytree.treespec_dumps(self.spec)
        except Exception:  # noqa: BLE001 - a node type pytree cannot serialize: pickle the object
            spec = self.spec
        return (_output_map, (spec, self.leaves))

    def __call__(self, graph_outputs: Sequence, args: Sequence):
        values = [graph_outputs[s[1]] if s[0] == "out" else args[s[1]] if s[0] == "arg" else s[1]
                  for s in self.leaves]
        return torch.utils._pytree.tree_unflatten(values, self.spec)


def _alias_key(t: torch.Tensor) -> tuple:
    """Two tensors with this key view the same elements of the same storage."""
    return (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.storage_offset())


def _output_map(spec, leaves) -> OutputMap:
    """Unpickles an ``OutputMap`` (see ``OutputMap.__reduce__``)."""
    if isinstance(spec, str):
        spec = torch.utils._pytree.treespec_loads(spec)
    return OutputMap(spec, leaves)
