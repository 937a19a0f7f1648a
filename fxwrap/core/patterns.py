"""Patterns rewritten on the ATen graph before lowering.

**Int8 weight-only linear.**  ``F.linear(x, w_int8.to(x.dtype)) * scale`` (and
``(x @ w_int8.to(x.dtype).t()) * scale``), with ``w_int8`` an int8 ``[N, K]`` weight and
``scale`` ``[N]`` of ``x``'s dtype, reaches the backend as::

    _to_copy = aten._to_copy(w, dtype=torch.bfloat16)     # or prims.convert_element_type
    permute = aten.permute(_to_copy, [1, 0])              # or aten.t
    mm = aten.mm(x, permute)                              # x: [M, K] (a view of [..., K])
    view = aten.view(mm, [B, T, N])                       # when x had more than 2 dims
    mul = aten.mul.Tensor(view, scale)                    # either operand order

``int8_weight_only_linears(gm, allow)`` rewrites it to the op that computes exactly that
without a dequantized copy of the weight::

    _weight_int8pack_mm = aten._weight_int8pack_mm(x, w, scale)
    view = aten.view(_weight_int8pack_mm, [B, T, N])      # when x had more than 2 dims

and drops the nodes nobody reads any more (a dequantized weight still read elsewhere,
e.g. saved for a backward graph, stays).  A product read by anything but the scaling
``mul`` stays as it is (the op would not replace it).  Numbers: eager's pattern rounds the product
to the activations' dtype before scaling (two roundings in bf16), the op rounds
``sum * scale`` once; both sum in fp32, so they agree to the dtype's tolerance.

Only rewritten where the result is the same op as the pattern computes: ``x`` bf16 or
fp32 (any device: ``allow`` says which), ``w`` a contiguous 2-D int8 tensor, ``scale`` exactly ``[N]`` (a
``[1, N]`` scale is read through a view) of ``x``'s dtype (another dtype promotes the
product: the pattern's result dtype differs), the mul's result the pattern's dtype;
and where ``allow(x, w, scale)`` (the fake tensors) says so: the caller decides what
may run the op (a template of the target, or ATen's kernel where it is exact).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from fxwrap.core import logs
from fxwrap.core.extern import backend_dispatch_key

aten = torch.ops.aten
prims = torch.ops.prims

INT8_MM = aten._weight_int8pack_mm.default
_ACTIVATION_DTYPES = (torch.bfloat16, torch.float32)


def aten_int8_mm_refusal(dtype: torch.dtype, k, device_type: str = "cpu", rows_contiguous: bool = True) -> str | None:
    """Why ATen's kernel of ``_weight_int8pack_mm`` on ``device_type`` must not run for
    activations of ``dtype``, a reduction of ``k`` (a size: int or sympy) and activations
    whose rows are (``rows_contiguous``) or are not contiguous, or None.

    * a device with no ATen kernel of the op (``torch._C._dispatch_has_kernel_for_dispatch_key``):
      torch 2.13's CUDA kernel exists, older builds may lack it;
    * CUDA: the kernel indexes ``x`` as contiguous rows whatever its strides (torch 2.11-2.13);
    * CPU: in torch 2.13 the bfloat16 path reads past the rows when ``k`` is not a multiple
      of 32: wrong numbers (``k=100``) or a crash (``k=45``).
    """
    key = backend_dispatch_key(device_type)  # the renamed PrivateUse1 backend's too
    if key is None or not torch._C._dispatch_has_kernel_for_dispatch_key(str(INT8_MM.name()), key):
        return f"torch {torch.__version__} has no {device_type} kernel of {INT8_MM}"
    if device_type != "cpu":
        return None if rows_contiguous else \
            f"ATen's {device_type} kernel of {INT8_MM} reads x as contiguous rows whatever its strides"
    if dtype != torch.bfloat16:
        return None
    static = isinstance(k, int) or (getattr(k, "is_number", False) and not isinstance(k, torch.SymInt))
    if static and int(k) % 32 == 0:
        return None
    return (f"ATen's CPU kernel gives wrong numbers or crashes for bfloat16 activations with k = {k}, "
            "not a multiple of 32 (torch 2.13)")


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _dequantized_weight(node, dtype):
    """The int8 ``[N, K]`` weight ``node`` converts to ``dtype``, or None."""
    if _call(node, aten._to_copy.default):
        extra = {k: v for k, v in node.kwargs.items() if k != "dtype"}
        if len(node.args) != 1 or node.kwargs.get("dtype") != dtype or any(v is not None for v in extra.values()):
            return None
    elif _call(node, prims.convert_element_type.default):
        if len(node.args) != 2 or node.args[1] != dtype:
            return None
    else:
        return None
    w = node.args[0]
    val = _val(w)
    if not isinstance(val, torch.Tensor) or val.dtype != torch.int8 or val.dim() != 2 or not val.is_contiguous():
        return None
    return w


def _transposed(node):
    """``a`` when ``node`` is ``a.t()`` / ``a.permute(1, 0)`` of a 2-D ``a``."""
    if _call(node, aten.t.default):
        return node.args[0]
    if _call(node, aten.permute.default) and list(node.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        return node.args[0]
    return None


def _match(mul: torch.fx.Node):
    """``(x, w, scale, product, view_shape)`` of a pattern ending at ``mul``, or None."""
    if not _call(mul, aten.mul.Tensor) or len(mul.args) != 2 or mul.kwargs:
        return None
    for product, scale in (mul.args, tuple(reversed(mul.args))):
        view_shape = None
        mm = product
        if _call(mm, aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            view_shape = mm.args[1]
            mm = mm.args[0]
        if not _call(mm, aten.mm.default) or len(mm.users) != 1 or len(product.users) != 1:
            continue  # a product read elsewhere (saved for a backward graph) would be computed twice
        x, rhs = mm.args
        xv, mv, sv, outv = _val(x), _val(mm), _val(scale), _val(mul)
        if not all(isinstance(v, torch.Tensor) for v in (xv, mv, sv, outv)):
            continue
        if xv.dtype not in _ACTIVATION_DTYPES or outv.dtype != xv.dtype:
            continue
        w = _dequantized_weight(_transposed(rhs), xv.dtype)
        if w is None:
            continue
        n = _val(w).shape[0]
        if sv.dtype != xv.dtype or tuple(sv.shape) not in ((n,), (1, n)):
            continue
        if tuple(outv.shape) != tuple(_val(product).shape):  # the scale broadcast nothing else
            continue
        return x, w, scale, product, view_shape
    return None


def int8_weight_only_linears(gm: torch.fx.GraphModule,
                             allow: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], bool]) -> int:
    """Rewrite every dequantize-and-linear of ``gm`` (module docstring) that ``allow``
    accepts into ``aten._weight_int8pack_mm``; returns how many.  ``meta["val"]`` of the
    new nodes is computed with the graph's fake mode."""
    graph = gm.graph
    rewritten = 0
    for mul in list(graph.nodes):
        found = _match(mul)
        if found is None:
            continue
        x, w, scale, product, view_shape = found
        if not allow(_val(x), _val(w), _val(scale)):
            continue
        with graph.inserting_before(mul):
            if _val(scale).dim() == 2:
                scale = graph.call_function(aten.view.default, (scale, [_val(scale).shape[1]]))
                scale.meta["val"] = _val(scale.args[0]).view(-1)
            node = graph.call_function(INT8_MM, (x, w, scale))
            node.meta.update({k: v for k, v in mul.meta.items() if k in ("stack_trace", "nn_module_stack")})
            node.meta["val"] = INT8_MM(_val(x), _val(w), _val(scale))
            result = node
            if view_shape is not None:
                result = graph.call_function(aten.view.default, (node, view_shape))
                result.meta["val"] = _val(mul)
        mul.replace_all_uses_with(result)
        graph.erase_node(mul)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        gm.recompile()
        logs.logger("capture").debug("rewrote %d int8 weight-only linear(s) to %s", rewritten, INT8_MM)
    return rewritten
