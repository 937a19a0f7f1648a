"""Loop-IR ops, casts and constants as Triton expressions, and the helper functions
a kernel module defines (only those a kernel uses, in a fixed order).

Value conventions (as in ``targets/cstyle.py``): the kernel arrives legalized
(``fxwrap.core.numerics``: every op in the dtype it is computed in, over operands of
that dtype; every rounding to bf16/fp16 a ``cast``); a local holds its dtype's
``compute_dtype`` (bf16/fp16 live in float32); float64 math goes through libdevice::

    >>> r = OpRenderer(); r.op("exp", torch.float32, ["tmp0"], [torch.float32])
    'tl.exp(tmp0)'
    >>> r.op("cast", torch.bfloat16, ["tmp1"], [torch.float32])
    'fx_round_bf16(tmp1)'
"""
from __future__ import annotations

from fxwrap.targets.cstyle import EmitError  # the builder keeps such kernels as ATen externs

import math
from collections.abc import Callable

import torch

from fxwrap.ir.loops import BINARY, BOOL_RESULT, UNARY
from fxwrap.core.numerics import compute_dtype, illegal


class OpError(EmitError):
    """An op the Triton emitter cannot render; names the op, the target and a way out."""


TL_TYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.bfloat16: "tl.bfloat16",
    torch.float16: "tl.float16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
HALF = (torch.bfloat16, torch.float16)
_BITS = {torch.int64: 64, torch.int32: 32, torch.int16: 16, torch.int8: 8, torch.uint8: 8}

# Helper functions (Triton source).  Keyed by name; ``requires`` lists helpers they call.
HELPERS: dict[str, str] = {
    # an index value, checked where it is used (op ``index_check``); the kernel is compiled
    # with ``debug`` on (INDEX_CHECK_OPTIONS) or Triton drops the assert
    # ``lanes``: the lanes the kernel computes; a lane past the end holds no element, and
    # its index (an arange past the plane, a load's 0) must not fire the assert: a device
    # assert kills the process's CUDA context, where eager returns a result (max_unpool1d)
    "_fx_index_check": """
@triton.jit
def _fx_index_check(v, low, high, lanes):
    tl.device_assert(((v >= low) & (v < high)) | (lanes == 0), "fxwrap: index out of bounds")
    return v
""",
    "_fx_ifloordiv": """
@triton.jit
def _fx_ifloordiv(a, b):
    q = a // b
    return q - ((a % b != 0) & ((a < 0) != (b < 0))).to(q.dtype)
""",
    "_fx_imod": """
@triton.jit
def _fx_imod(a, b):
    m = a % b
    return tl.where((m != 0) & ((m < 0) != (b < 0)), m + b, m)
""",
    "_fx_max": """
@triton.jit
def _fx_max(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(a < b, b, a)))
""",
    "_fx_min": """
@triton.jit
def _fx_min(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(b < a, b, a)))
""",
    "_fx_add": """
@triton.jit
def _fx_add(a, b):
    return a + b
""",
    "_fx_mul": """
@triton.jit
def _fx_mul(a, b):
    return a * b
""",
    "_fx_cummax": """
@triton.jit
def _fx_cummax(v1, i1, v2, i2):
    take = (i2 >= 0) & ((v2 != v2) | ((v1 == v1) & (v2 >= v1)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
""",
    "_fx_cummin": """
@triton.jit
def _fx_cummin(v1, i1, v2, i2):
    take = (i2 >= 0) & ((v2 != v2) | ((v1 == v1) & (v2 <= v1)))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)
""",
    "_fx_logaddexp": """
@triton.jit
def _fx_logaddexp(a, b):
    lo = tl.where(a < b, a, b)
    hi = tl.where(a < b, b, a)
    same_inf = (lo == hi) & (tl.abs(lo) == float("inf"))
    return tl.where(same_inf, a, libdevice.log1p(libdevice.exp(lo - hi)) + hi)
""",
    "_fx_welford": """
@triton.jit
def _fx_welford(mean1, m2_1, n1, mean2, m2_2, n2):
    n = n1 + n2
    delta = mean2 - mean1
    frac = tl.where(n == 0, 0.0, n2 / tl.where(n == 0, 1.0, n))
    return mean1 + delta * frac, m2_1 + m2_2 + delta * delta * n1 * frac, n
""",
    "_fx_floordiv_f": """
@triton.jit
def _fx_floordiv_f(a, b):
    m = libdevice.fmod(a, b)
    d = (a - m) / b
    d = tl.where((m != 0) & ((b < 0) != (m < 0)), d - 1, d)
    f = libdevice.floor(d)
    f = tl.where(d - f > 0.5, f + 1, f)
    f = tl.where(d == 0, libdevice.copysign(d * 0, a / b), f)
    return tl.where(b == 0, a / b, f)
""",
    "_fx_floordiv_i": """
@triton.jit
def _fx_floordiv_i(a, b):
    bb = tl.where(b == 0, 1, b)
    q = a // bb
    q = q - ((a % bb != 0) & ((a < 0) != (bb < 0))).to(q.dtype)
    return tl.where(b == 0, 0, q)
""",
    "_fx_truncdiv_i": """
@triton.jit
def _fx_truncdiv_i(a, b):
    bb = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a // bb)
""",
    "_fx_mod_f": """
@triton.jit
def _fx_mod_f(a, b):
    m = libdevice.fmod(a, b)
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)
""",
    "_fx_mod_i": """
@triton.jit
def _fx_mod_i(a, b):
    bb = tl.where(b == 0, 1, b)
    m = a % bb
    m = tl.where((m != 0) & ((m < 0) != (bb < 0)), m + bb, m)
    return tl.where(b == 0, 0, m)
""",
    "_fx_fmod_i": """
@triton.jit
def _fx_fmod_i(a, b):
    bb = tl.where(b == 0, 1, b)
    return tl.where(b == 0, 0, a % bb)
""",
    "_fx_pow_i": """
@triton.jit
def _fx_pow_i(base, e):
    result = tl.zeros_like(base) + 1
    b = base
    k = e
    for _ in tl.static_range(64):
        result = tl.where((k & 1) != 0, result * b, result)
        b = b * b
        k = tl.where(k > 0, k >> 1, 0)
    neg = tl.where(base == 1, 1, tl.where(base == -1, tl.where((e & 1) != 0, -1, 1), 0))
    return tl.where(e < 0, neg.to(result.dtype), result)
""",
}

# float ops: (float32 rendering, float64 rendering); "{0}" "{1}" are the operands
_FLOAT_UNARY = {
    "exp": ("tl.exp({0})", "libdevice.exp({0})"),
    "exp2": ("tl.exp2({0})", "libdevice.exp2({0})"),
    "log": ("tl.log({0})", "libdevice.log({0})"),
    "log2": ("tl.log2({0})", "libdevice.log2({0})"),
    "sqrt": ("tl.sqrt_rn({0})", "libdevice.sqrt({0})"),
    "rsqrt": ("libdevice.rsqrt({0})", "libdevice.rsqrt({0})"),
    "sin": ("tl.sin({0})", "libdevice.sin({0})"),
    "cos": ("tl.cos({0})", "libdevice.cos({0})"),
    "erf": ("tl.erf({0})", "libdevice.erf({0})"),
    "floor": ("tl.floor({0})", "libdevice.floor({0})"),
    "ceil": ("tl.ceil({0})", "libdevice.ceil({0})"),
    "sigmoid": ("1.0 / (1.0 + tl.exp(-{0}))", "1.0 / (1.0 + libdevice.exp(-{0}))"),
}
for _name in ("expm1 log10 log1p tan asin acos atan sinh cosh tanh asinh acosh atanh erfc erfinv "
              "trunc").split():
    _FLOAT_UNARY[_name] = (f"libdevice.{_name}({{0}})",) * 2
_FLOAT_UNARY["round"] = ("libdevice.nearbyint({0})",) * 2


def const_literal(value, dtype: torch.dtype) -> str:
    """A scalar constant of ``dtype``'s compute type: ``tl.full([], 2.0, tl.float32)``."""
    if dtype == torch.bool:
        return f"tl.full([], {1 if value else 0}, tl.int1)"
    if dtype.is_floating_point:
        v = float(value)
        if dtype in HALF:
            v = torch.tensor(v, dtype=dtype).item()
        elif dtype == torch.float32:
            v = torch.tensor(v, dtype=torch.float32).item()
        if math.isnan(v):
            text = 'float("nan")'
        elif math.isinf(v):
            text = 'float("inf")' if v > 0 else 'float("-inf")'
        else:
            text = repr(v)
        return f"tl.full([], {text}, {TL_TYPES[compute_dtype(dtype)]})"
    if dtype.is_complex or dtype not in TL_TYPES:
        raise OpError(f"constant {value!r} of dtype {dtype} has no Triton type")
    return f"tl.full([], {int(value)}, {TL_TYPES[dtype]})"


def tl_type(dtype: torch.dtype, target: str = "triton") -> str:
    try:
        return TL_TYPES[dtype]
    except KeyError:
        raise OpError(f"dtype {dtype} has no Triton type on target {target}; let the lowering "
                      "fall back to ATen (it keeps such ops as extern calls)") from None


def round16(x: str, dtype: torch.dtype) -> str:
    """Round a float32 value to bf16/fp16 precision (nearest-even, as torch).

    bf16 goes through ``fx_round_bf16`` (``libm``): a plain cast on the GPU, torch's
    rounding under the interpreter, whose own float32->bf16 cast truncates."""
    if dtype == torch.bfloat16:
        return f"fx_round_bf16({x})"
    return f"{x}.to({TL_TYPES[dtype]}).to(tl.float32)"


def cast(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """``x`` (of ``src``'s compute type) as ``dst``'s compute type, PyTorch style."""
    if src == dst:
        return x
    csrc, cdst = compute_dtype(src), compute_dtype(dst)
    if dst == torch.bool:
        return f"({x} != 0)"
    if dst in HALF:
        inner = x if csrc == torch.float32 else f"{x}.to(tl.float32)"
        return round16(inner, dst)
    if csrc.is_floating_point and not cdst.is_floating_point:
        if cdst == torch.int64:
            return f"{x}.to(tl.int64)"
        return f"{x}.to(tl.int64).to({TL_TYPES[cdst]})"
    if csrc == cdst:
        return x
    return f"{x}.to({TL_TYPES[cdst]})"


def scalar_bool(x: str) -> str:
    """A bool computed on scalars only (no block axis: loads at a constant index), made again
    through a select: ``tmp2 = (tmp0 != tmp1)`` becomes ``tl.where((tmp0 != tmp1), True, False)``.

    Triton's interpreter (3.6 to 3.9 at least) labels a comparison's result with its operands'
    dtype; a scalar comparison broadcast into a block then turns into float32 data, and ``|``,
    ``&`` or ``^`` with it raise ``TypeError: ufunc 'bitwise_or' not supported`` (fuzz seed 1206:
    ``any(x != y)`` of two stride-0 inputs).  The select carries the right ``int1`` label.
    Compiled Triton folds ``select(c, true, false)`` to ``c`` (MLIR's arith canonicalization),
    so the GPU code is the same (``tests/cuda/test_triton_scalar_bool.py`` checks the PTX)."""
    return f"tl.where({x}, True, False)"


def _infix(op: str) -> Callable[..., str]:
    return lambda r, t, x, b: f"({x} {op} {b})"


def _by_kind(floating: Callable[..., str], integer: Callable[..., str]) -> Callable[..., str]:
    return lambda r, t, *a: (floating if t.is_floating_point else integer)(r, t, *a)


def _div(x: str, b: str, t: torch.dtype) -> str:
    """IEEE division (Triton's float32 ``/`` is the approximate one)."""
    return f"tl.math.div_rn({x}, {b})" if t == torch.float32 else f"({x} / {b})"


def _sign(r, t, x):
    if t == torch.bool:
        return x
    z = "0.0" if t.is_floating_point else "0"
    return f"((({z} < {x}).to({TL_TYPES[t]})) - (({x} < {z}).to({TL_TYPES[t]})))"


def _shift(name: str) -> Callable[..., str]:
    def render(r, t, x, b):
        bits = _BITS.get(t)
        if bits is None:
            raise OpError(f"op {name!r} on {t} (target {r.target_name})")
        out_of_range = f"(({b} < 0) | ({b} >= {bits}))"
        safe = f"tl.where({out_of_range}, 0, {b})"
        if name == "lshift":
            return f"tl.where({out_of_range}, 0, {x} << {safe})"
        fill = f"tl.where({x} < 0, -1, 0)" if t != torch.uint8 else "0"
        return f"tl.where({out_of_range}, {fill}, {x} >> {safe})"
    return render


# One rendering per loop-IR op: ``(renderer, compute dtype t, *operand locals) -> expression``
# (float unary math: ``_FLOAT_UNARY``, by float width).  ``r.need(helper)`` names a helper of
# ``HELPERS`` and makes the kernel module define it.
TRITON_OPS: dict[str, Callable[..., str]] = {
    **{name: (lambda r, t, x: x) for name in ("floor", "ceil", "round", "trunc")},  # integers
    # a float's negation flips its sign bit (eager: neg(0.0) == -0.0); Triton's unary minus is
    # 0 - x, which gives +0.0 for +0.0 on the GPU: multiply by -1, which is exact
    "neg": lambda r, t, x: f"({x} == 0)" if t == torch.bool else (f"({x} * -1.0)" if t.is_floating_point
                                                                   else f"-{x}"),
    "abs": lambda r, t, x: x if t in (torch.bool, torch.uint8) else f"tl.abs({x})",
    "sign": _sign,
    "reciprocal": lambda r, t, x: (f"tl.math.div_rn(tl.full([], 1.0, tl.float32), {x})" if t == torch.float32
                                   else f"1.0 / {x}"),
    "logical_not": lambda r, t, x: f"({x} == 0)",
    "bitwise_not": lambda r, t, x: f"({x} == 0)" if t == torch.bool else f"~{x}",
    "isnan": lambda r, t, x: f"({x} != {x})",
    "isinf": _by_kind(lambda r, t, x: f"(tl.abs({x}) == float(\"inf\"))", lambda r, t, x: f"({x} != {x})"),
    "signbit": _by_kind(lambda r, t, x: f"(libdevice.signbit({x}) != 0)", lambda r, t, x: f"({x} < 0)"),
    "where": lambda r, t, c, x, b: f"tl.where({c}, {x}, {b})",
    "index_check": lambda r, t, v, low, high, lanes="1": (f"{r.need('_fx_index_check')}"
                                                           f"({v}, {low}, {high}, {lanes})"),
    **{name: _infix(op) for name, op in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="), ("eq", "=="),
                                         ("ne", "!="), ("bitwise_and", "&"), ("bitwise_or", "|"))},
    "add": lambda r, t, x, b: f"({x} | {b})" if t == torch.bool else f"({x} + {b})",
    "sub": lambda r, t, x, b: f"({x} != {b})" if t == torch.bool else f"({x} - {b})",
    "mul": lambda r, t, x, b: f"({x} & {b})" if t == torch.bool else f"({x} * {b})",
    "truediv": lambda r, t, x, b: _div(x, b, t),
    "floordiv": _by_kind(lambda r, t, x, b: f"{r.need('_fx_floordiv_f')}({x}, {b})",
                         lambda r, t, x, b: f"{r.need('_fx_floordiv_i')}({x}, {b})"),
    "truncdiv": _by_kind(lambda r, t, x, b: f"libdevice.trunc({_div(x, b, t)})",
                         lambda r, t, x, b: f"{r.need('_fx_truncdiv_i')}({x}, {b})"),
    "mod": _by_kind(lambda r, t, x, b: f"{r.need('_fx_mod_f')}({x}, {b})",
                    lambda r, t, x, b: f"{r.need('_fx_mod_i')}({x}, {b})"),
    "fmod": _by_kind(lambda r, t, x, b: f"libdevice.fmod({x}, {b})",
                     lambda r, t, x, b: f"{r.need('_fx_fmod_i')}({x}, {b})"),
    "pow": _by_kind(lambda r, t, x, b: f"libdevice.pow({x}, {b})",
                    lambda r, t, x, b: (f"({x} | ({b} == 0))" if t == torch.bool
                                        else f"{r.need('_fx_pow_i')}({x}, {b})")),
    "maximum": lambda r, t, x, b: f"({x} | {b})" if t == torch.bool else f"{r.need('_fx_max')}({x}, {b})",
    "minimum": lambda r, t, x, b: f"({x} & {b})" if t == torch.bool else f"{r.need('_fx_min')}({x}, {b})",
    "atan2": lambda r, t, x, b: f"libdevice.atan2({x}, {b})",
    "copysign": lambda r, t, x, b: f"libdevice.copysign({x}, {b})",
    "logical_and": lambda r, t, x, b: f"(({x} != 0) & ({b} != 0))",
    "logical_or": lambda r, t, x, b: f"(({x} != 0) | ({b} != 0))",
    "logical_xor": lambda r, t, x, b: f"(({x} != 0) != ({b} != 0))",
    "bitwise_xor": lambda r, t, x, b: f"({x} != {b})" if t == torch.bool else f"({x} ^ {b})",
    "lshift": _shift("lshift"), "rshift": _shift("rshift"),
}


class OpRenderer:
    """Renders one op over already-rendered operands (``TRITON_OPS``); records the helpers it needs."""

    def __init__(self, target_name: str = "triton", intrinsics: tuple = ()):
        self.target_name = target_name
        self.helpers: set[str] = set()
        #: the target's own ops by name (``fxwrap.Intrinsic``: the emitter's ``intrinsics``)
        self.intrinsics = {i.name: i for i in intrinsics}

    def need(self, name: str) -> str:
        self.helpers.add(name)
        return name

    def op(self, name: str, dtype: torch.dtype, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        """``name`` over argument locals of ``arg_dtypes``; the kernel is legalized, so
        they already have the dtype the op is computed in (a comparison: its operands')."""
        if name == "cast":
            return cast(args[0], arg_dtypes[0], dtype)
        if (why := illegal(name, dtype, arg_dtypes)) is not None:
            raise OpError(f"{why} (target {self.target_name})")
        cdt = compute_dtype(arg_dtypes[-1] if name in BOOL_RESULT else dtype)
        return self._render(name, cdt, args)

    def intrinsic(self, name: str, dtype: torch.dtype, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        """A node of the target's own op ``name`` (``fxwrap/ir/intrinsics.py``) through its
        declared spelling, ``{t}`` the Triton type: ``intrinsic.f32 my_gelu(%1)`` -> ``my_gelu(tmp1)``."""
        declared = self.intrinsics.get(name)
        if declared is None:
            raise OpError(f"op intrinsic {name!r} ({dtype}) is not declared by target {self.target_name}; "
                          f"add an fxwrap.Intrinsic named {name!r} to its emitter's intrinsics")
        if (why := illegal("intrinsic", dtype, arg_dtypes)) is not None:
            raise OpError(f"{why} (target {self.target_name})")
        if dtype not in declared.dtypes or len(args) != declared.operands:
            raise OpError(f"intrinsic {name!r} of target {self.target_name} takes {declared.operands} "
                          f"operand(s) of {[str(d) for d in declared.dtypes]}, got {len(args)} of {dtype}")
        return declared.render(args, TL_TYPES[dtype])

    def _render(self, name: str, t: torch.dtype, a: list[str]) -> str:
        if name in _FLOAT_UNARY and t.is_floating_point:
            return _FLOAT_UNARY[name][1 if t == torch.float64 else 0].format(*a)
        fn = TRITON_OPS.get(name)
        if fn is not None and (name not in BINARY or len(a) == 2):
            return fn(self, t, *a)
        if name in UNARY:
            raise OpError(f"op {name!r} ({t}) has no rendering on target {self.target_name}; "
                          "add it to fxwrap.targets.cuda_triton.ops or let the lowering fall back")
        known = name in BINARY and len(a) == 2
        raise OpError(f"op {name!r} ({t}) has no rendering on target {self.target_name}"
                      + ("; add it to fxwrap.targets.cuda_triton.ops" if known else
                         "; it is not a loop-IR op (see fxwrap.ir.loops), so the lowering should emit "
                         "an extern call instead"))


# launch options of a kernel that checks index values (``_fx_index_check``): Triton keeps
# ``tl.device_assert`` only in a kernel compiled with ``debug``; its integer-overflow
# checks, which ``debug`` would also turn on, stay off (as Inductor's kernels do)
INDEX_CHECK_OPTIONS = (("debug", True), ("sanitize_overflow", False))


def helper_source(names) -> list[str]:
    """The helper definitions for ``names``, in a fixed (sorted) order."""
    out: list[str] = []
    for name in sorted(names):
        out.extend(HELPERS[name].strip("\n").splitlines())
        out.append("")
    return out
