"""Elementwise rules: math, comparisons, logic, casts, where, clamp, fills.

``aten.add.Tensor(a, b, alpha=2)`` at index ``i`` becomes
``Op("add", f32, (a[i], Op("mul", f32, (b[i], const 2.0))))``.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.loops import Op
from fxwrap.core.lowering import Loops, Unsupported, as_loops, broadcast, cast, compute_dtype, const, register

aten = torch.ops.aten
prims = torch.ops.prims

UNARY_OPS = {
    "abs": "abs", "neg": "neg", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log2": "log2", "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "asinh": "asinh", "acosh": "acosh",
    "atanh": "atanh", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "floor": "floor",
    "ceil": "ceil", "round": "round", "trunc": "trunc", "sigmoid": "sigmoid", "sign": "sign",
    "reciprocal": "reciprocal", "logical_not": "logical_not", "bitwise_not": "bitwise_not",
    "isnan": "isnan", "isinf": "isinf", "signbit": "signbit",
}
for _aten_name, _ir in UNARY_OPS.items():
    _packet = getattr(aten, _aten_name)
    register(_packet.default, lambda ctx, x, _ir=_ir: ctx.pointwise(_ir, x))

BINARY_OPS = {
    "mul": "mul", "div": "truediv", "remainder": "mod", "fmod": "fmod", "pow": "pow",
    "maximum": "maximum", "minimum": "minimum", "atan2": "atan2", "copysign": "copysign",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
    "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
    "bitwise_left_shift": "lshift", "bitwise_right_shift": "rshift",
    "__lshift__": "lshift", "__rshift__": "rshift",  # a << b, a >> b (the conformance kit found them externs)
    "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
}
_OVERLOADS = ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor", "Self_Scalar")
for _aten_name, _ir in BINARY_OPS.items():
    _packet = getattr(aten, _aten_name)
    for _ov in _OVERLOADS:
        if _ov in _packet.overloads():
            register(getattr(_packet, _ov), lambda ctx, a, b, _ir=_ir: _binary(ctx, _ir, a, b))


def _binary(ctx, name, a, b):
    if name in ("logical_and", "logical_or", "logical_xor"):
        return ctx.pointwise(name, a, b, compute=torch.bool)
    if name == "truediv" and not ctx.out_dtype.is_floating_point:
        raise Unsupported("integer true division result")
    if name == "pow" and type(b) in (int, float) and b in (2, 3) and ctx.out_dtype.is_floating_point:
        # x*x and (x*x)*x, as eager's pow kernels compute these exponents: no call to pow
        # (libdevice.pow made GPT-2's written-out GELU kernel 2.4x slower than Inductor's)
        def power(x):
            square = Op("mul", x.dtype, (x, x))
            return square if b == 2 else Op("mul", x.dtype, (square, x))
        return ctx.map(power, a, compute=compute_dtype(ctx.out_dtype))
    return ctx.pointwise(name, a, b)


@register([aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar])
def _add_sub(ctx, a, b, alpha=1):
    name = "add" if ctx.node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    if alpha == 1:
        return ctx.pointwise(name, a, b)
    return ctx.map(lambda x, y: Op(name, x.dtype, (x, Op("mul", x.dtype, (y, const(alpha, x.dtype))))), a, b)


@register(aten.div.Tensor_mode)
def _div_mode(ctx, a, b, *, rounding_mode=None):
    name = {None: "truediv", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return ctx.pointwise(name, a, b)


@register(aten.where.self)
def _where(ctx, cond, a, b):
    compute = compute_dtype(ctx.out_dtype)
    return ctx.map(lambda c, x, y: Op("where", compute, (cast(c, torch.bool), x, y)),
                   cond, a, b, compute=compute)


@register([aten.clamp.default, aten.clamp.Tensor])
def _clamp(ctx, x, min=None, max=None):
    args, names = [x], []
    if min is not None:
        args.append(min); names.append("maximum")
    if max is not None:
        args.append(max); names.append("minimum")

    def body(v, *bounds):
        for name, bound in zip(names, bounds):
            v = Op(name, v.dtype, (v, bound))  # maximum/minimum propagate NaN like clamp
        return v
    return ctx.map(body, *args, compute=compute_dtype(ctx.out_dtype))


@register(aten.hardtanh.default)
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    """``relu6`` (MobileNet) is ``hardtanh(x, 0, 6)``: a clamp, in the kernel with the rest."""
    return _clamp(ctx, x, min_val, max_val)


register(aten.clamp_min.default, lambda ctx, x, m: ctx.map(lambda v, b: Op("maximum", v.dtype, (v, b)), x, m))
register(aten.clamp_max.default, lambda ctx, x, m: ctx.map(lambda v, b: Op("minimum", v.dtype, (v, b)), x, m))
register(aten.relu.default, lambda ctx, x: ctx.map(lambda v: Op("maximum", v.dtype, (v, const(0, v.dtype))), x))


@register(aten.gelu.default)
def _gelu(ctx, x, *, approximate="none"):
    def exact(v):
        t = v.dtype
        inner = Op("erf", t, (Op("mul", t, (v, const(0.7071067811865476, t))),))
        return Op("mul", t, (Op("mul", t, (v, const(0.5, t))), Op("add", t, (inner, const(1.0, t)))))

    def tanh(v):
        # 0.5 * v * (1 + tanh(z)) written as v * sigmoid(2 * z): the same function, one exp
        # and one division where tanh costs a polynomial and an exp on most targets, and
        # no cancellation in 1 + tanh(z) for negative v
        t = v.dtype
        cube = Op("mul", t, (Op("mul", t, (v, v)), v))
        twice_inner = Op("mul", t, (const(2 * 0.7978845608028654, t),
                                    Op("add", t, (v, Op("mul", t, (cube, const(0.044715, t)))))))
        return Op("mul", t, (v, Op("sigmoid", t, (twice_inner,))))
    return ctx.map(tanh if approximate == "tanh" else exact, x)


register(aten.silu.default, lambda ctx, x: ctx.map(lambda v: Op("mul", v.dtype, (v, Op("sigmoid", v.dtype, (v,)))), x))


def _to_dtype(ctx, x):
    if ctx.val.device != ctx.device:
        raise Unsupported("device copy")
    src = as_loops(x)
    out = ctx.out_dtype
    return Loops(src.size, out, ctx.device, lambda i: cast(src(i), out))


@register([aten._to_copy.default, prims.convert_element_type.default, aten.clone.default,
           aten.lift_fresh_copy.default])
def _copy_like(ctx, x, *args, **kwargs):
    return _to_dtype(ctx, x)


@register(aten.copy.default)
def _copy(ctx, dst, src, non_blocking=False):
    out = ctx.out_dtype
    if isinstance(src, (bool, int, float)):  # ``x.copy_(0.5)`` under dynamic=True: a Python scalar
        return Loops(ctx.out_size, out, ctx.device, lambda i: const(src, out))
    if isinstance(src, sympy.Expr):
        return Loops(ctx.out_size, out, ctx.device, lambda i: cast(Op.index(src), out))
    loops = broadcast(as_loops(src), ctx.out_size)
    return Loops(ctx.out_size, out, ctx.device, lambda i: cast(loops(i), out))


@register([aten.full.default])
def _full(ctx, size, fill_value, **kwargs):
    out = ctx.out_dtype
    if isinstance(fill_value, sympy.Expr):
        return Loops(ctx.out_size, out, ctx.device, lambda i: cast(Op.index(fill_value), out))
    if not isinstance(fill_value, (bool, int, float)):  # a run-time scalar (``.item()``)
        raise Unsupported(f"fill value {fill_value!r} is not known at compile time")
    return Loops(ctx.out_size, out, ctx.device, lambda i: const(fill_value, out))


@register(aten.full_like.default)
def _full_like(ctx, x, fill_value, **kwargs):
    """A fill of ``x``'s shape; the result's strides are the node's (``memory_format``)."""
    return _full(ctx, ctx.out_size, fill_value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx, value, **kwargs):
    return _full(ctx, (), value)


@register([aten.arange.start_step, prims.iota.default])
def _arange(ctx, *args, **kwargs):
    if ctx.node.target is prims.iota.default:
        start, step = kwargs["start"], kwargs["step"]
    else:
        start, step = args[0], args[2] if len(args) > 2 else kwargs.get("step", 1)
    out = ctx.out_dtype
    if not all(isinstance(v, int) for v in (start, step)):
        raise Unsupported("non-integer arange")
    return Loops(ctx.out_size, out, ctx.device,
                 lambda i: cast(Op.index(start + step * i[0]), out))
