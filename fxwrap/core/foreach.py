"""``_foreach_*`` ops as one op per tensor of their lists, so that each becomes
pointwise loop IR the scheduler fuses (and ``core.combo`` batches into combo kernels).

The optimizers' ``foreach`` paths call ``torch._foreach_add_(exp_avgs, grads)`` and the
like; AOTAutograd functionalizes them into ``aten._foreach_add.List`` nodes, which would
otherwise be extern calls, each launching one ATen kernel per list.  The decomposition
of an overload calls the op of the same name once per list position, with the arguments
the schema types as lists (``Tensor[]``, ``Scalar[]``) taken at that position and the
others as they are::

    aten._foreach_addcmul.Scalar([a0, a1], [b0, b1], [c0, c1], 0.5)
      -> [aten.addcmul(a0, b0, c0, value=0.5), aten.addcmul(a1, b1, c1, value=0.5)]
    aten._foreach_pow.ScalarAndTensor(0.9, [s0, s1]) -> [aten.pow(0.9, s0), aten.pow(0.9, s1)]

Overloads with a ``Tensor scalars`` argument (one value per list position, in a tensor)
have no per-tensor op taking it and stay extern calls.
"""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

#: the ``_foreach_<name>`` ops decomposed (their per-tensor op is ``aten.<name>``): the
#: optimizers' (SGD, Adam, AdamW, Adagrad, RMSprop...) and the common pointwise math
FOREACH_POINTWISE = (
    "abs", "add", "addcdiv", "addcmul", "clamp_max", "clamp_min", "copy", "div", "exp", "expm1", "lerp",
    "log", "log1p", "maximum", "minimum", "mul", "neg", "pow", "reciprocal", "rsqrt", "sigmoid", "sign",
    "sqrt", "sub", "tanh", "zero",
)

_LIST_TYPES = ("List[Tensor]", "List[number]", "List[float]", "List[int]")


def _per_tensor(op_name: str, schema, *args, **kwargs) -> list:
    """``aten.<op_name>`` once per list position of a ``_foreach_<op_name>`` call."""
    positional = list(schema.arguments)
    bound = {}
    for argument, value in zip(positional, args):
        bound[argument.name] = value
    bound.update(kwargs)
    listed = [a.name for a in positional if str(a.type) in _LIST_TYPES and a.name in bound]
    count = len(bound[listed[0]])
    single = getattr(aten, op_name)
    results = []
    for i in range(count):
        call_args, call_kwargs = [], {}
        for argument in positional:
            if argument.name not in bound:
                continue
            value = bound[argument.name][i] if argument.name in listed else bound[argument.name]
            if argument.kwarg_only:
                call_kwargs[argument.name] = value
            else:
                call_args.append(value)
        if op_name in ("addcmul", "addcdiv") and len(call_args) == 4:  # the per-tensor op's keyword-only ``value``
            call_kwargs["value"] = call_args.pop()
        results.append(single(*call_args, **call_kwargs))
    return results


def _decomposable(overload) -> bool:
    schema = overload._schema
    if schema.name.endswith("_") or any(a.is_out for a in schema.arguments) or not schema.returns:
        return False
    if str(schema.returns[0].type) != "List[Tensor]":
        return False
    # one value per list position inside a tensor: no per-tensor op takes it
    return not any(str(a.type) == "Tensor" and a.name == "scalars" for a in schema.arguments)


@functools.lru_cache(maxsize=1)
def foreach_decompositions() -> dict:
    """``{aten._foreach_<name>.<overload>: its per-tensor decomposition}`` for every
    functional overload of ``FOREACH_POINTWISE`` this torch has."""
    table = {}
    for name in FOREACH_POINTWISE:
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None or not hasattr(aten, name):
            continue
        for overload_name in sorted(packet.overloads()):
            overload = getattr(packet, overload_name)
            if _decomposable(overload):
                table[overload] = functools.partial(_per_tensor, name, overload._schema)
    return table
