"""Input guards: what a program checks about its inputs before anything runs.

A program's kernels are compiled for one layout of each input: its dtype, device, rank,
sizes (numbers, or size symbols such as ``s0`` under ``dynamic=True``) and strides.  A
kernel computes addresses from that layout and trusts it; an input of another layout
would give wrong numbers (a transposed input) or make the kernel read past the input's
memory (a smaller input).  So the GraphModule's first node checks every input against
the layout it was compiled for::

    def forward(self, s0, arg1):
        check_inputs = fxwrap_runtime_guards_check_inputs(self._fxwrap_input_guard, s0, arg1)
        buf0 = torch.empty_strided([s0, 16], [16, 1], dtype = torch.float32, ...)

and a mismatch raises :class:`InputMismatchError`, naming the input, what the program
expected and what came::

    InputMismatchError: x (argument 0) has strides (1, 8); the program's kernels were
    compiled for strides (16, 1) (dimension 0: expected 16, got 1); pass .contiguous() ...

The :class:`InputGuard` is an attribute of the GraphModule and pickles with it, so a
GraphModule called directly, copied by a target's wrapper or pickled and loaded is
guarded as well.  This module imports only torch.

Not checked, on purpose:

- for an input that no kernel reads (only ATen extern calls do, and they dispatch on the
  tensor's own device), a CPU tensor of no dimensions in place of one of another device:
  torch's own rule for CPU scalars, which mix with any device (a backward program of SDPA
  on CUDA gets the dropout seed and offset as CPU scalars where the traced graph said
  CUDA).  Any other device is refused, as eager refuses the device mix it would make, and
  the meta device always: ATen calls run on a meta tensor and give no numbers;

- the storage offset: a kernel gets the address of the input's first element, and a view
  of an input reads the input's offset when the program runs (``sym_storage_offset``),
  so a slice of a larger tensor with the compiled strides is as good as a tensor of its
  own;
- the bytes of storage behind the input: a tensor whose sizes and strides are the
  compiled ones spans exactly the elements the kernels read, and torch checks when a
  tensor is made (``as_strided``, ``set_``) that its storage holds them.  Only a storage
  shrunk afterwards (``untyped_storage().resize_(0)``) escapes that, as it does in eager;
  a ``TensorInputSpec`` can still ask for the check (``storage_bytes``), which costs more
  than the rest of a tensor's check.

Cost: the check is one generated Python function of straight-line comparisons (about a
quarter of a microsecond per tensor input, ``benchmarks/guard_cost.py``); once a call has
passed it, the tensors of static layout (a model's parameters: hundreds of them) are checked
by one call of torch's C++ ``TensorGuards`` instead (a fifth of the time), the rest by the
generated function.  Only when both fail does the slower explanation run, which finds the
first mismatch and words the error.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

import torch
import torch.fx

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - a torch without dynamo's C++ guards
    _TensorGuards = None

__all__ = [
    "InputGuard", "InputMismatchError", "OtherInputSpec", "SizeCondition", "SizeInputSpec",
    "SymbolBinding", "TensorInputSpec", "check_inputs",
]


class InputMismatchError(ValueError):
    """An input that the program was not compiled for (wrong dtype, device, rank, sizes,
    strides, storage offset, too little storage, a size symbol that breaks a constraint,
    or a Python scalar other than the one baked into the program).

    The message names the input (the lowered function's argument where the program knows
    it, else the graph input), what the program expected, what came, and what to do.
    """


# A size or stride in a spec: an int, Python source over size-symbol names ("s0*s1"), or
# None: not checked (an expression the compiler could not print as Python).
Expr = int | str | None


@dataclass(frozen=True)
class TensorInputSpec:
    """A tensor input: ``TensorInputSpec("arg1", torch.float32, torch.device("cpu"),
    ("s0", 16), (16, 1))`` is a row-major ``s0 x 16`` float tensor.  The stride of a
    dimension of size 1 is not checked (no address depends on it).  ``offset``: the
    storage offset it must have (None: any); ``storage_bytes``: the bytes its storage
    must hold from its first element on (None: not checked).  ``build_input_guard``
    leaves both None (see the module docstring).  ``cpu_scalar_ok``: a CPU tensor of no
    dimensions passes in place of ``device`` (an input that only extern calls read: they
    run on whatever device it is on, and torch mixes CPU scalars with any device)."""

    name: str
    dtype: torch.dtype
    device: torch.device | None  # None: not checked
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = None
    storage_bytes: Expr = None
    cpu_scalar_ok: bool = False

    def device_ok(self, value: torch.Tensor) -> bool:
        return (self.device is None or value.device == self.device
                or (self.cpu_scalar_ok and value.dim() == 0 and value.device.type == "cpu"))


@dataclass(frozen=True)
class SizeInputSpec:
    """A size symbol the program takes as an input (``s0``): a Python ``int``."""

    name: str


@dataclass(frozen=True)
class OtherInputSpec:
    """An input the guard does not check (an opaque value, such as a generator)."""

    name: str


@dataclass(frozen=True)
class SizeCondition:
    """A constraint on size symbols that the program was compiled under: ``code`` is
    Python over symbol names (``"s0 >= 2"``), ``text`` how the error shows it, ``origin``
    where it came from (``"dynamo's ShapeEnv"``)."""

    code: str
    text: str
    origin: str = "the ShapeEnv of the traced graph"


InputSpec = TensorInputSpec | SizeInputSpec | OtherInputSpec


@dataclass(frozen=True)
class SymbolBinding:
    """A size symbol that is not a program input: its value is ``inputs[name].size(dim)``."""

    symbol: str
    name: str
    dim: int


_EVAL_NAMES = {"__builtins__": {}, "max": max, "min": min, "abs": abs, "int": int, "math": math}


class InputGuard:
    """Checks a program's inputs; ``guard(*inputs)`` returns None or raises.

    Checks, in order, for every input of ``inputs`` (a spec per graph input):

    - a size input is an ``int``; its value binds the symbol;
    - a tensor input is None (AOTAutograd passes None for an input a backward program
      does not use) or a tensor of the expected dtype, device and rank, whose sizes and
      strides (other than those of size-1 dimensions) equal the expected ones (for
      symbolic ones, with the symbols bound by the size inputs);
    - then every :class:`SizeCondition` holds (the symbols' ranges and the guards the
      ShapeEnv recorded while tracing, e.g. ``s0 >= 2``).

    ``labels`` maps a graph input's name to how errors call it (``"x (argument 0)"``);
    ``fxwrap.lower`` fills it in.  Values traced symbolically
    (FakeTensors, SymInts: a compiler propagating shapes through the GraphModule) are
    not checked.
    """

    def __init__(self, inputs: Sequence[InputSpec], conditions: Sequence[SizeCondition] = (),
                 bindings: Sequence[SymbolBinding] = (), labels: Mapping[str, str] | None = None,
                 target: str | None = None):
        self.inputs = tuple(inputs)
        self.conditions = tuple(conditions)
        self.bindings = tuple(bindings)
        self.labels: dict[str, str] = dict(labels or {})
        self.target = target  # the target the kernels were compiled for, for the errors
        self._fast = _compile_fast_check(self.inputs, self.conditions, self.bindings)
        # after the first call that passes: the tensors of static layout checked together by
        # one C++ call (torch's TensorGuards: dtype, device, sizes, strides, requires_grad,
        # dispatch keys) and the rest by ``_fast_rest``; a miss of either falls back to
        # ``_fast`` (a requires_grad flip, inference mode: slower, never wrong), and a miss
        # that ``_fast`` passes builds it again from those inputs, ``_STATIC_BUILDS`` times at
        # most (calls that keep changing such a property then pay ``_fast`` alone)
        self._static: _StaticTensorCheck | None = None
        self._static_builds = 0

    def __reduce__(self):
        return (InputGuard, (self.inputs, self.conditions, self.bindings, self.labels, self.target))

    def __repr__(self) -> str:
        return f"InputGuard({', '.join(spec.name for spec in self.inputs)})"

    def name_inputs(self, labels: Mapping[str, str]) -> None:
        """Say how errors name graph inputs: ``{"arg1": "x (argument 0 ...)"}`` (in place,
        so every GraphModule holding this guard uses the names)."""
        self.labels.update(labels)

    def label(self, name: str) -> str:
        return self.labels.get(name, f"graph input {name!r}")

    def __call__(self, *values) -> None:
        static = self._static
        if static is not None and len(values) == len(self.inputs) and static.check(values):
            return None
        if len(values) == len(self.inputs) and self._fast(*values):
            if self._static_builds < _STATIC_BUILDS:
                self._static_builds += 1
                self._static = _StaticTensorCheck.build(self, values)
            elif static is not None:
                self._static = None
            return None
        self.explain(values)
        return None

    # -- the slow path: find the first mismatch and word it ------------------------
    def explain(self, values: Sequence) -> None:
        """Raise the error for the first input of ``values`` that does not match."""
        if len(values) != len(self.inputs):
            names = ", ".join(spec.name for spec in self.inputs)
            raise TypeError(f"the program takes {len(self.inputs)} inputs ({names}), got {len(values)}")
        if any(_symbolic_value(v) for v in values):
            return None
        for spec, value in zip(self.inputs, values):  # what needs no symbol first
            if isinstance(spec, TensorInputSpec) and value is not None:
                self._explain_kind(spec, value)
        env: dict[str, int] = {}
        origin: dict[str, str] = {}  # symbol -> where its value came from, for the errors
        for spec, value in zip(self.inputs, values):
            if isinstance(spec, SizeInputSpec):
                origin[spec.name] = self.labels.get(spec.name, f"size input {spec.name}")
                if type(value) is not int:
                    self._fail(spec.name, f"is a size of the program's inputs and must be an int, "
                               f"got {value!r} ({type(value).__name__})", "pass an int")
                env[spec.name] = value
        by_name = {spec.name: value for spec, value in zip(self.inputs, values)}
        for binding in self.bindings:
            value = by_name[binding.name]
            if isinstance(value, torch.Tensor) and value.dim() > binding.dim:
                if binding.symbol not in env:
                    env[binding.symbol] = value.size(binding.dim)
                    origin[binding.symbol] = f"dimension {binding.dim} of {self.label(binding.name)}"
        for spec, value in zip(self.inputs, values):
            if isinstance(spec, TensorInputSpec) and value is not None:
                self._explain_layout(spec, value, env, origin)
        for condition in self.conditions:
            if not _evaluate(condition.code, env):
                names = [k for k in sorted(env) if re.search(rf"\b{k}\b", condition.code)]
                shown = ", ".join(f"{k} = {env[k]}" + (f" ({self.labels[k]})" if k in self.labels else "")
                                  for k in names)
                on_target = f" (target {self.target!r})" if self.target else ""
                self._fail(None, f"{shown}: the program{on_target} was compiled under {condition.text} "
                           f"({condition.origin})", "pass inputs of sizes that satisfy it, or lower the function "
                           "again with inputs of these sizes")
        return None

    def _fail(self, name: str | None, what: str, remedy: str):
        subject = f"{self.label(name)} " if name is not None else ""
        raise InputMismatchError(f"{subject}{what}; {remedy}")

    @staticmethod
    def _symbols_from(expr: Expr, env: Mapping[str, int], origin: Mapping[str, str]) -> str:
        """`` where s1 = 15 is dimension 1 of x (argument 0)``: what set the symbols of ``expr``
        (a mismatch may be the other input's fault)."""
        if not isinstance(expr, str):
            return ""
        found = [f"{k} = {env[k]} is {origin[k]}" for k in sorted(origin)
                 if k in env and re.search(rf"\b{k}\b", expr)]
        return f", where {' and '.join(found)}" if found else ""

    def _explain_kind(self, spec: TensorInputSpec, value) -> None:
        """Tensor, dtype, device and rank: what needs no size symbol."""
        redo = _REDO
        if not isinstance(value, torch.Tensor):
            self._fail(spec.name, f"must be a tensor ({_describe_spec(spec, {})}), got "
                       f"{type(value).__name__} {value!r}"[:400], f"pass a tensor, {redo}")
        if value.dtype != spec.dtype:
            self._fail(spec.name, f"has dtype {value.dtype}; the program was compiled for {spec.dtype}",
                       f"convert it with .to({spec.dtype}), {redo}")
        on_target = f" (target {self.target!r})" if self.target else ""
        if not spec.device_ok(value):
            self._fail(spec.name, f"is on device {value.device}; the program was compiled for "
                       f"{spec.device}{on_target}", f"move it with .to({str(spec.device)!r}), {redo}")
        if value.is_meta:  # an input only ATen calls read: they would run on it and give no numbers
            self._fail(spec.name, f"is on the meta device, a tensor without data; the program{on_target} "
                       "reads its values", f"pass a tensor with data, {redo}")
        if value.dim() != len(spec.size):
            self._fail(spec.name, f"has {value.dim()} dimensions (size {tuple(value.shape)}); the program "
                       f"was compiled for {len(spec.size)} (size {_shown(spec.size, {})})",
                       f"pass a tensor of {len(spec.size)} dimensions, {redo}")

    def _explain_layout(self, spec: TensorInputSpec, value, env: dict, origin: dict) -> None:
        """Sizes, strides, storage offset and storage bytes, with the symbols of ``env``."""
        redo = _REDO
        for dim, expr in enumerate(spec.size):
            expected = _evaluate(expr, env)
            if expected is None and isinstance(expr, str) and expr.isidentifier():
                env[expr] = expected = value.size(dim)  # first occurrence binds the symbol
                origin[expr] = f"dimension {dim} of {self.label(spec.name)}"
            if expected is not None and value.size(dim) != expected:
                self._fail(spec.name, f"has size {tuple(value.shape)}; the program was compiled for size "
                           f"{_shown(spec.size, env)} (dimension {dim}: expected {expected}"
                           f"{self._symbols_from(expr, env, origin)}, got {value.size(dim)})",
                           f"pass an input of that size, {redo}"
                           + (" (with dynamic=True, sizes become symbols)" if not _is_symbolic(spec) else ""))
        for dim, expr in enumerate(spec.stride):
            expected = _evaluate(expr, env)
            if value.size(dim) != 1 and expected is not None and value.stride(dim) != expected:
                self._fail(spec.name, f"has strides {tuple(value.stride())}; the program's kernels were "
                           f"compiled for strides {_shown(spec.stride, env)} (dimension {dim}: expected "
                           f"{expected}{self._symbols_from(expr, env, origin)}, got {value.stride(dim)})",
                           f"pass .contiguous() or a tensor of that layout, {redo}")
        offset = _evaluate(spec.offset, env)
        if offset is not None and value.storage_offset() != offset:
            self._fail(spec.name, f"starts at storage offset {value.storage_offset()} (a view into a larger "
                       f"tensor); the program was compiled for offset {offset}",
                       f"pass .clone() (a tensor of its own), {redo}")
        needed = _evaluate(spec.storage_bytes, env)
        have = value.untyped_storage().nbytes() - value.storage_offset() * value.element_size()
        if needed is not None and have < needed:
            self._fail(spec.name, f"has {have} bytes of storage from its first element on; the program "
                       f"reads {needed} "
                       "bytes from it", f"pass a tensor that owns its memory (.clone()), {redo}")


_REDO = "or lower the function again with an example like it"


def _is_symbolic(spec: TensorInputSpec) -> bool:
    return any(isinstance(e, str) for e in (*spec.size, *spec.stride, spec.offset))


def _describe_spec(spec: TensorInputSpec, env) -> str:
    return f"{spec.dtype} on {spec.device}, size {_shown(spec.size, env)}"


def _shown(exprs, env) -> str:
    """``(s0, 16)``, with the symbols' values where known: ``(s0=8, 16)``."""
    parts = []
    for e in exprs:
        value = _evaluate(e, env)
        parts.append(str(e) if isinstance(e, int) or value is None or str(e) == str(value)
                     else f"{e}={value}")
    return f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"


def _evaluate(expr: Expr, env: Mapping[str, int]):
    """``expr`` at ``env``; None when it is None or a symbol is unbound."""
    if expr is None or isinstance(expr, int):
        return expr
    try:
        return eval(expr, _EVAL_NAMES, dict(env))  # noqa: S307 -- our own generated source
    except NameError:
        return None


def _symbolic_value(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(value, torch.Tensor):
        from torch._subclasses.fake_tensor import is_fake
        return is_fake(value)
    return False


class _StaticTensorCheck:
    """The tensor inputs whose expected sizes and strides are all numbers, checked by one
    ``torch._C._dynamo.guards.TensorGuards`` call (about a fifth of the generated Python
    check's time for a model's parameters), and ``rest``: the generated check of every
    other input and condition."""

    def __init__(self, pick, tensor_guards, rest):
        self.pick, self.tensor_guards, self.rest = pick, tensor_guards, rest

    def check(self, values) -> bool:
        return self.tensor_guards.check(*self.pick(values)) and self.rest(*values)

    @staticmethod
    def build(guard: "InputGuard", values) -> "_StaticTensorCheck | None":
        """From inputs that passed the whole check; None when fewer than
        ``_STATIC_MIN`` tensors qualify or torch has no ``TensorGuards``."""
        static = [i for i, (spec, value) in enumerate(zip(guard.inputs, values))
                  if isinstance(spec, TensorInputSpec) and isinstance(value, torch.Tensor)
                  and type(value) in (torch.Tensor, torch.nn.Parameter) and spec.device is not None
                  and not spec.cpu_scalar_ok
                  and spec.offset is None and spec.storage_bytes is None
                  and all(isinstance(e, int) for e in (*spec.size, *spec.stride))]
        if len(static) < _STATIC_MIN or _TensorGuards is None:
            return None
        try:
            tensors = [values[i] for i in static]
            sizes = [list(guard.inputs[i].size) for i in static]
            # a size-1 dimension's stride is not checked (no address depends on it)
            strides = [[None if n == 1 else st for n, st in zip(guard.inputs[i].size, guard.inputs[i].stride)]
                       for i in static]
            tensor_guards = _TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
            if not tensor_guards.check(*tensors):
                return None
        except Exception:  # noqa: BLE001 - another signature in some torch: the Python check
            return None
        skip = {guard.inputs[i].name for i in static}
        rest = _compile_fast_check(guard.inputs, guard.conditions, guard.bindings, skip=skip)
        pick = (lambda values, i=static[0]: (values[i],)) if len(static) == 1 else itemgetter(*static)
        return _StaticTensorCheck(pick, tensor_guards, rest)


#: fewer static tensor inputs than this: the generated Python check alone
_STATIC_MIN = 4
#: how many times a guard builds its ``_StaticTensorCheck`` (the first passing call, then
#: each call the C++ check refuses and the generated one accepts)
_STATIC_BUILDS = 3


def _compile_fast_check(inputs, conditions, bindings, skip=frozenset()):
    """A function ``fast(*values) -> bool``: True when every check passes (the tensor
    inputs named in ``skip`` are not checked: ``_StaticTensorCheck`` does).

    For ``TensorInputSpec("arg1", float32, cpu, ("s0", 16), (16, 1))`` after
    ``SizeInputSpec("s0")`` it is::

        def fast(s0, arg1):
            try:
                if type(s0) is not int: return False
                if arg1 is not None:
                    if arg1.dtype is not _c0 or arg1.device != _c1: return False
                    if arg1.size() != (s0, 16): return False
                    if arg1.stride() != (16, 1): return False
                return True
            except Exception:
                return False
    """
    constants: dict[str, object] = {}

    def const(value) -> str:
        name = f"_c{len(constants)}"
        constants[name] = value
        return name

    params = [_param(spec.name, i) for i, spec in enumerate(inputs)]
    param_of = {spec.name: p for spec, p in zip(inputs, params)}
    body: list[str] = []
    for spec, p in zip(inputs, params):
        if isinstance(spec, SizeInputSpec):
            body.append(f"if type({p}) is not int: return False")
            if spec.name != p:
                body.append(f"{spec.name} = {p}")
    bound = {spec.name for spec in inputs if isinstance(spec, SizeInputSpec)}
    for binding in bindings:
        if binding.symbol not in bound:
            body.append(f"{binding.symbol} = {param_of[binding.name]}.size({binding.dim})")
            bound.add(binding.symbol)
    for spec, p in zip(inputs, params):
        if not isinstance(spec, TensorInputSpec) or spec.name in skip:
            continue
        if spec.device is None:
            checks = [f"if {p}.dtype is not {const(spec.dtype)} or {p}.is_meta: return False"]
        elif spec.cpu_scalar_ok:
            checks = [f"if {p}.dtype is not {const(spec.dtype)} or ({p}.device != {const(spec.device)} and "
                      f"({p}.dim() != 0 or {p}.device.type != 'cpu')): return False"]
        else:
            checks = [f"if {p}.dtype is not {const(spec.dtype)} or {p}.device != {const(spec.device)}: return False"]
        if None in spec.size:  # a size tuple compared whole checks the rank too
            checks.append(f"if {p}.dim() != {len(spec.size)}: return False")
        checks += _tuple_check(f"{p}.size", spec.size, range(len(spec.size)))
        checks += _tuple_check(f"{p}.stride", spec.stride, [d for d, n in enumerate(spec.size) if n != 1])
        if spec.offset is not None:
            checks.append(f"if {p}.storage_offset() != {spec.offset}: return False")
        if spec.storage_bytes is not None:
            checks.append(f"if {p}.untyped_storage().nbytes() < {p}.storage_offset() * "
                          f"{spec.dtype.itemsize} + {spec.storage_bytes}: return False")
        body.append(f"if {p} is not None:")  # AOTAutograd passes None for some unused inputs
        body += [f"    {check}" for check in checks]
    for condition in conditions:
        body.append(f"if not ({condition.code}): return False")
    lines = [f"def fast({', '.join(params)}):", "    try:"]
    lines += [f"        {line}" for line in body]
    lines += ["        return True", "    except Exception:", "        return False"]
    namespace = dict(constants, max=max, min=min, abs=abs, math=math)
    exec(compile("\n".join(lines), "<fxwrap input guard>", "exec"), namespace)  # noqa: S102
    return namespace["fast"]


def _tuple_check(method: str, exprs, dims) -> list[str]:
    """``x.size() != (s0, 16)`` when every dimension is checked, else one line per dimension."""
    dims = [d for d in dims if exprs[d] is not None]
    if len(dims) == len(exprs):
        shown = ", ".join(str(e) for e in exprs)
        return [f"if {method}() != ({shown}{',' if len(exprs) == 1 else ''}): return False"]
    return [f"if {method}({d}) != {exprs[d]}: return False" for d in dims]


def _param(name: str, index: int) -> str:
    ok = name.isidentifier() and not name.startswith(("_c", "_in")) and name not in _EVAL_NAMES
    return name if ok else f"_in{index}"


@torch.fx.node.has_side_effect
def check_inputs(guard: InputGuard, *inputs) -> None:
    """The GraphModule's first node: ``guard(*inputs)`` (see :class:`InputGuard`)."""
    # FX re-tracing (on unpickle) makes every placeholder a Proxy: one isinstance per call,
    # not one per input, on this per-call path
    if inputs and isinstance(inputs[0], torch.fx.Proxy):
        return inputs[0].tracer.create_proxy("call_function", check_inputs, (guard, *inputs), {})
    return guard(*inputs)
