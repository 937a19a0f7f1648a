"""How an ATen op is called as an extern: its out= overload, when it has one that
computes into ``out`` itself.

``aten.add.Tensor`` is called as ``aten.add.out(a, b, out=buf)`` so the program
allocates ``buf`` itself (an ``Allocate`` line the memory planner can reuse);
ops without an out= overload are called functionally and own their result.

Many out= overloads are no kernel of their own: ``aten.convolution.out`` (and
``_native_batch_norm_legit_no_training.out``, ``native_layer_norm.out``,
``embedding.out``, ...) are generated wrappers that call the functional op into a
temporary and copy it into ``out``: one extra pass over the result and twice its
memory.  ``native_out_variant(op, device_type)`` asks the dispatcher whether the
out= overload has a kernel for the device's backend (or is a composite of other
ops); where it has not, the op is called in its functional form instead.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

aten = torch.ops.aten

# Ops whose out= overload is not a drop-in for the functional one.
_NO_OUT = {
    aten.empty_like.default,  # out= would still be uninitialised; kept functional
}


@dataclass(frozen=True)
class OutVariant:
    """``OutVariant(aten.topk.values, ("values", "indices"))``."""

    op: torch._ops.OpOverload
    out_names: tuple[str, ...]


def _is_write(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def is_mutating(op) -> bool:
    """True for in-place / out= ops (``add_``, ``copy_``): they write an argument."""
    return isinstance(op, torch._ops.OpOverload) and any(_is_write(a) for a in op._schema.arguments)


def is_view(op) -> bool:
    """True for ops whose result aliases an input without writing it."""
    if op is aten._unsafe_view.default:  # declared functional, aliases in practice
        return True
    return isinstance(op, torch._ops.OpOverload) and bool(op.is_view) and not is_mutating(op)


# Functional indexed writes -> their in-place forms (same arguments, same result shape
# and dtype as ``self``).  Eager computes each as ``self.clone()`` and then the in-place
# op; a program does the same with the clone as a buffer of its own, planned like any
# other, and computed straight into it when ``self`` is a lazy value (an embedding's
# backward: ``index_put(zeros, [ids], grad, accumulate=True)`` writes into the zeros
# it filled, with no second buffer of the table's size).
_IN_PLACE_WRITES = {
    aten.index_put.default: aten.index_put_.default,
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value: aten.scatter_.value,
    aten.scatter.reduce: aten.scatter_.reduce,
    aten.scatter.value_reduce: aten.scatter_.value_reduce,
    aten.scatter_reduce.two: aten.scatter_reduce_.two,
    aten.index_add.default: aten.index_add_.default,
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_fill.int_Scalar: aten.index_fill_.int_Scalar,
}


def in_place_write(op) -> torch._ops.OpOverload | None:
    """The in-place form of a functional indexed write (``index_put`` -> ``index_put_``),
    called on a copy of ``self`` the program owns; None for any other op."""
    return _IN_PLACE_WRITES.get(op)


# torch device type -> dispatch key of its backend kernels
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "hpu": "HPU", "meta": "Meta"}


def backend_dispatch_key(device_type: str) -> str | None:
    """``"cuda"`` -> ``"CUDA"``; the renamed PrivateUse1 backend -> ``"PrivateUse1"``."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    return _BACKEND_KEYS.get(device_type)


@functools.cache
def native_out_variant(op, device_type: str) -> OutVariant | None:
    """``out_variant(op)`` when calling it writes ``out`` directly on ``device_type``:
    the out= overload has a kernel for the device's backend or is a composite of
    other ops; None when it only wraps the functional op and copies (call that)."""
    variant = out_variant(op)
    key = backend_dispatch_key(device_type)
    if variant is None or key is None:
        return variant
    name = variant.op._schema.name
    overload = variant.op._schema.overload_name
    qualified = f"{name}.{overload}" if overload else name
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    if has_kernel(qualified, key) or has_kernel(qualified, "CompositeImplicitAutograd"):
        return variant
    return None


@functools.cache
def out_variant(op) -> OutVariant | None:
    """The out= overload of a functional op with tensor results, or None."""
    if not isinstance(op, torch._ops.OpOverload) or op in _NO_OUT or is_mutating(op):
        return None
    if op.is_view:  # a view called as an extern keeps its aliasing; out= would copy
        return None
    schema = op._schema
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments]
    packet = op.overloadpacket
    for overload in sorted(packet.overloads()):
        candidate = getattr(packet, overload)
        args = candidate._schema.arguments
        outs = [a for a in args if a.kwarg_only and _is_write(a)]
        if len(outs) != len(schema.returns) or any(str(a.type) != "Tensor" for a in outs):
            continue
        out_names = {a.name for a in outs}
        rest = [(a.name, str(a.type)) for a in args if a.name not in out_names]
        if rest == wanted:
            return OutVariant(candidate, tuple(a.name for a in outs))
    return None
