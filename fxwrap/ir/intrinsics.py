"""Target-defined ops (intrinsics): an op of a target's kernel language that lowerings emit
inside fused kernels, where other targets compute a decomposition.

A target declares its intrinsics on its kernel emitter (``KernelEmitter.intrinsics``), here a
native exact GELU for float32 that replaces ``aten.gelu`` with ``approximate="none"``::

    class GeluEmitter(fxwrap.CppEmitter):
        prelude = fxwrap.CppEmitter.prelude + "static inline float my_gelu(float x) { ... }\\n"
        intrinsics = (fxwrap.Intrinsic("my_gelu", "my_gelu({0})", replaces=aten.gelu.default,
                                       when={"approximate": "none"}, dtypes=(torch.float32,)),)

On that target ``gelu(x.sin()) * y`` is one kernel whose loop IR holds one node of op
``intrinsic`` carrying the intrinsic's name (``format_ssa``)::

    %0 = load.f32 arg0[x0]
    %1 = sin.f32 %0
    %2 = intrinsic.f32 my_gelu(%1)
    %3 = load.f32 arg1[x0]
    %4 = mul.f32 %2 %3

and the C-family engine renders that node through the spelling: ``const float tmp2 =
my_gelu(tmp1);``.  The node is pointwise: the scheduler fuses it with its neighbours as it
fuses ``sin``.  A call that the declaration does not cover (``approximate="tanh"``, a float64
gelu) and every call on a target that declares nothing lower as before (gelu: its erf
decomposition), so no other target ever sees the op.

The record is data (names, dtypes, strings): the program and warm-start caches key on a
session's intrinsics (``fxwrap.programs.cache_key``), so two targets declaring different intrinsics
never share a cached program; kernel binaries are keyed on their source, which holds the
spelling and the prelude defining it.
"""
from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fxwrap.ir.loops import Op, OpCode

#: what a ``when`` value may be: the literal arguments of an ATen call (``approximate="none"``)
_LITERALS = (str, bool, int, float, type(None))


@dataclass(frozen=True)
class Intrinsic:
    """``Intrinsic("my_gelu", "my_gelu({0})", replaces=aten.gelu.default, when={"approximate": "none"})``.

    * ``name``: the op's name in the loop IR (an identifier, unique among the target's).
    * ``spelling``: how the target's kernel language writes a call, a ``str.format`` template
      over the operands' rendered values ``{0}``, ``{1}``... and ``{t}``, the language's name
      of the compute type (C: ``float``): ``"my_gelu({0})"``, ``"fast_exp_{t}({0})"``.
    * ``operands``: how many operands it takes.
    * ``dtypes``: the dtypes it computes in; its operands and its result are of one of them
      (a bf16/fp16 call computes in float32, as every op does: ``fxwrap.core.numerics``).
    * ``replaces``: the ATen overload it computes (``aten.gelu.default``, kept by name), or
      None: no ATen op lowers to it by itself (a rule builds it by calling the record).
    * ``when``: the values the overload's other arguments must have (``{"approximate":
      "none"}``, defaults included); a call with other values keeps its own lowering.

    The operands of a replaced call are its ``Tensor`` and ``Scalar`` arguments in schema
    order (``gelu(Tensor self, *, str approximate)``: ``self``).  Calling the record builds
    the loop-IR node: ``intrinsic(x) -> Op("intrinsic", x.dtype, (x,), "my_gelu")``.
    """

    name: str
    spelling: str
    operands: int = 1
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    replaces: str | None = None
    when: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"Intrinsic name {self.name!r} must be an identifier (it names the loop-IR op)")
        if not isinstance(self.operands, int) or isinstance(self.operands, bool) or self.operands < 0:
            raise ValueError(f"intrinsic {self.name!r}: operands={self.operands!r} must be a count (an int >= 0)")
        dtypes = tuple(self.dtypes)
        bad = [d for d in dtypes if not isinstance(d, torch.dtype)]
        if not dtypes or bad:
            raise ValueError(f"intrinsic {self.name!r}: dtypes={self.dtypes!r} must be torch dtypes "
                             "(the dtypes it computes in, e.g. (torch.float32,))")
        object.__setattr__(self, "dtypes", dtypes)
        if self.replaces is not None and not isinstance(self.replaces, str):
            if not isinstance(self.replaces, torch._ops.OpOverload):
                raise ValueError(f"intrinsic {self.name!r}: replaces={self.replaces!r} must be an ATen "
                                 "overload (torch.ops.aten.gelu.default), not a packet or a function")
            object.__setattr__(self, "replaces", str(self.replaces))
        when = dict(self.when)
        odd = {k: v for k, v in when.items() if not isinstance(k, str) or not isinstance(v, _LITERALS)}
        if odd:
            raise ValueError(f"intrinsic {self.name!r}: when={odd!r}: argument names with literal values "
                             "(str, bool, int, float, None) only")
        object.__setattr__(self, "when", tuple(sorted(when.items())))
        self._check_spelling()

    def _check_spelling(self) -> None:
        if not isinstance(self.spelling, str):
            raise ValueError(f"intrinsic {self.name!r}: spelling {self.spelling!r} must be a str.format template")
        fields = [f for _, f, _, _ in string.Formatter().parse(self.spelling) if f is not None]
        wanted = {str(i) for i in range(self.operands)} | {"t"}
        unknown = sorted(set(fields) - wanted)
        if unknown:
            raise ValueError(f"intrinsic {self.name!r}: spelling {self.spelling!r} may name only its "
                             f"{self.operands} operand(s) {{0}}..{{{self.operands - 1}}} and {{t}} (the "
                             f"compute type); it names {unknown}")

    @property
    def overload(self) -> torch._ops.OpOverload | None:
        """``replaces`` as the ``OpOverload`` (None when it replaces none)."""
        if self.replaces is None:
            return None
        namespace, name, overload = self.replaces.split(".")
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)

    def matches(self, arguments: Mapping[str, Any], dtype: torch.dtype) -> bool:
        """Whether a call of ``replaces`` with ``arguments`` (name -> value, defaults filled
        in), computed in ``dtype``, is this intrinsic."""
        return dtype in self.dtypes and all(arguments.get(k, _MISSING) == v for k, v in self.when)

    def __call__(self, *operands: Op) -> Op:
        """The loop-IR node of this intrinsic over ``operands`` (Ops of one of ``dtypes``)."""
        if len(operands) != self.operands:
            raise TypeError(f"intrinsic {self.name!r} takes {self.operands} operand(s), got {len(operands)}")
        dtype = operands[0].dtype if operands else self.dtypes[0]
        if dtype not in self.dtypes or any(o.dtype != dtype for o in operands):
            raise TypeError(f"intrinsic {self.name!r} computes in {[str(d) for d in self.dtypes]}, got "
                            f"operands of {[str(o.dtype) for o in operands]}")
        return Op(OpCode.INTRINSIC, dtype, operands, self.name)

    def render(self, args: list[str], type_name: str) -> str:
        """The call in the target's language: ``render(["tmp1"], "float") -> "my_gelu(tmp1)"``."""
        return self.spelling.format(*args, t=type_name)


_MISSING = object()
