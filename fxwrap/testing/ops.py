"""The ops the conformance kit checks, one small function per op and dtype.

Each ``OpCase`` is a function that computes one ATen op (or one op fed by a view, for
the view ops) on fresh random inputs.  Because the function holds nothing but the op,
"ran in a kernel" can be checked per op: the compiled program launches exactly
``kernels`` generated kernels and calls no ATen op as an extern (see
``fxwrap.testing.checks.check_ran_in_kernels``).

    >>> case = OP_CASES_BY_ID["sin[float32]"]
    >>> case.fn(*case.make_inputs()).shape      # eager: torch.sin(x)
    torch.Size([...])
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

aten = torch.ops.aten

f32, f64, bf16, f16 = torch.float32, torch.float64, torch.bfloat16, torch.float16
SHAPE = (8, 24)  # small: the kit checks behaviour, not speed

# Per-dtype tolerances (``torch.testing.assert_close``): one op, so the only
# difference from eager is the order of float operations and one rounding.
TOLERANCES = {
    f32: dict(rtol=1e-5, atol=1e-5),
    f64: dict(rtol=1e-9, atol=1e-9),
    bf16: dict(rtol=2e-2, atol=2e-2),
    f16: dict(rtol=2e-3, atol=2e-3),
}
EXACT = dict(rtol=0, atol=0)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class OpCase:
    """One op on one dtype, as a compiled-function test.

    ``name`` is the op's name (what a target's exclusions refer to), ``fn(*inputs)``
    computes it, ``inputs(dtype)`` draws fresh random inputs (never all zeros),
    ``ops`` are the ATen op packets that must not run as extern calls, ``kernels``
    is how many generated kernels the op needs, ``group`` its family
    (``pointwise``, ``compare``, ``cast``, ``reduction``, ``view``, ``indexing``,
    ``pooling``), ``tolerance`` overrides the dtype's default, and ``out_dtype`` is
    the dtype a cast produces.
    """

    name: str
    dtype: torch.dtype
    fn: Callable
    inputs: Callable[[torch.dtype], tuple]
    ops: tuple
    group: str
    kernels: int = 1
    tolerance: dict | None = field(default=None)
    out_dtype: torch.dtype | None = None  # casts: the dtype they produce
    zero_signs: bool = False  # zeros' signs compared too (where IEEE fixes them: neg, abs, mul)

    @property
    def id(self) -> str:
        """``"sin[float32]"``: the pytest id of the case."""
        return f"{self.name}[{dtype_name(self.dtype)}]"

    def make_inputs(self) -> tuple:
        """Fresh random inputs from the global torch generator; never all zeros."""
        inputs = self.inputs(self.dtype)
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and t.numel() and not bool(t.ne(0).any()):
                raise AssertionError(f"op case {self.id}: input {i} is all zeros; the kit never compares "
                                     "on zeros (they hide wrong lowerings); draw again")
        return inputs

    def tolerances(self) -> dict:
        if self.tolerance is not None:
            return self.tolerance
        return TOLERANCES.get(self.dtype, EXACT)


# -- inputs ---------------------------------------------------------------------------

def one(dtype):
    """One standard-normal tensor."""
    return (torch.randn(SHAPE).to(dtype),)


def positive(dtype):
    """One tensor in [0.5, 2.5): log, sqrt, rsqrt."""
    return ((torch.rand(SHAPE) * 2 + 0.5).to(dtype),)


def two(dtype):
    """Two standard-normal tensors, the second broadcast along dim 0."""
    return torch.randn(SHAPE).to(dtype), torch.randn(SHAPE[1]).to(dtype)


def numerator_divisor(dtype):
    """A standard-normal tensor and a divisor in [0.5, 1.5), kept away from zero."""
    return torch.randn(SHAPE).to(dtype), (torch.rand(SHAPE) + 0.5).to(dtype)


def integers(dtype):
    """Two integer tensors in [-50, 50), neither all zeros."""
    return (torch.randint(-50, 50, SHAPE, dtype=dtype), torch.randint(1, 50, SHAPE, dtype=dtype))


def booleans(dtype):
    """Two random bool tensors (each has both values with overwhelming odds)."""
    return torch.rand(SHAPE) > 0.5, torch.rand(SHAPE) > 0.3


def unit_interval(dtype):
    """One tensor in (-0.9, 0.9): asin, acos, atanh, erfinv."""
    return ((torch.rand(SHAPE) * 1.8 - 0.9).to(dtype),)


def above_one(dtype):
    """One tensor in [1.1, 3.1): acosh."""
    return ((torch.rand(SHAPE) * 2 + 1.1).to(dtype),)


def one_bool(dtype):
    """One random bool tensor."""
    return (torch.rand(SHAPE) > 0.5,)


def one_int(dtype):
    """One integer tensor in [-50, 50), never all zeros."""
    return (torch.randint(-50, 50, SHAPE, dtype=dtype),)


def shifts(dtype):
    """An integer tensor and shift counts in [0, 8)."""
    return torch.randint(-1000, 1000, SHAPE, dtype=dtype), torch.randint(1, 8, SHAPE, dtype=dtype)


def any_dtype(dtype):
    """One tensor of ``dtype``: standard normal for floats, in [-50, 50) for integers, random for bool
    (the same input serves every dtype of an ``ALL_DTYPES`` case)."""
    if dtype == torch.bool:
        return (torch.rand(SHAPE) > 0.5,)
    if not dtype.is_floating_point:
        return (torch.randint(-50, 50, SHAPE, dtype=dtype),)
    return (torch.randn(SHAPE).to(dtype),)


def two_any_dtype(dtype):
    """Two tensors of ``dtype``, as ``any_dtype`` draws them."""
    return any_dtype(dtype)[0], any_dtype(dtype)[0]


def small_positive(dtype):
    """One tensor in [0.8, 1.2): a product over a row stays near one."""
    return ((torch.rand(SHAPE) * 0.4 + 0.8).to(dtype),)


def three_d(dtype):
    """One (4, 6, 8) tensor, for permutes and views of more than two dims."""
    return (torch.randn(4, 6, 8).to(dtype),)


def cat_inputs(dtype):
    return torch.randn(SHAPE).to(dtype), torch.randn(5, SHAPE[1]).to(dtype)


def gather_inputs(dtype):
    x = torch.randn(SHAPE).to(dtype)
    return x, torch.randint(0, SHAPE[1], (SHAPE[0], 5))


def index_select_inputs(dtype):
    return torch.randn(SHAPE).to(dtype), torch.randint(0, SHAPE[0], (11,))


def embedding_inputs(dtype):
    return torch.randint(0, 30, (4, 7)), torch.randn(30, 16).to(dtype)


def images(dtype):
    """A (2, 3, 10, 12) batch of images."""
    return (torch.randn(2, 3, 10, 12).to(dtype),)


def _with_special_values(x: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """``x`` with NaN, +inf, -inf, -0.0, +0.0, the largest and lowest finite values and the
    smallest normal one put at one position of each row (of its last dim), the kinds turned
    by ``shift`` so two operands meet different values; rows keep their random rest."""
    info = torch.finfo(x.dtype)
    values = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, info.max, info.min, info.tiny]
    flat = x.reshape(-1, x.shape[-1])
    for row in range(flat.shape[0]):
        for k in range(2):  # two per row: a NaN row also has an inf, etc.
            column = (row * 7 + k * 11 + shift) % flat.shape[1]
            flat[row, column] = values[(row + k * 3 + shift) % len(values)]
    return x


def special(dtype):
    """One standard-normal tensor holding NaN, +-inf, -0.0 and extreme values in every row."""
    return (_with_special_values(torch.randn(SHAPE).to(dtype)),)


def two_special(dtype):
    """Two such tensors, their special values at other places and of other kinds."""
    return _with_special_values(torch.randn(SHAPE).to(dtype)), _with_special_values(torch.randn(SHAPE).to(dtype), 3)


def images_special(dtype):
    """A (2, 3, 10, 12) batch of images holding NaN, +-inf, -0.0 and extreme values."""
    return (_with_special_values(torch.randn(2, 3, 10, 12).to(dtype)),)


def constant_rows(dtype):
    """An (8, 16) tensor whose even rows are one small nonzero integer each (their mean is
    exact, so layer norm's result there is an exact zero) and a weight of mixed signs."""
    x = torch.randn(8, 16)
    x[::2] = torch.randint(1, 4, (4, 1)) * (torch.randint(0, 2, (4, 1)) * 2 - 1)
    weight = torch.randn(16)
    weight[:4] = -weight[:4].abs()
    return x.to(dtype), weight.to(dtype)


# -- the cases ------------------------------------------------------------------------

def _python_function(fn: Callable) -> Callable:
    """``fn`` as a Python function: dynamo traces a built-in (``torch.sin``) only from inside one."""
    if hasattr(fn, "__code__"):
        return fn

    def call(*args):
        return fn(*args)
    call.__name__ = call.__qualname__ = getattr(fn, "__name__", "op")
    return call


def _cases(name, fn, inputs, ops, group, dtypes=(f32,), kernels=1, tolerance=None, out_dtype=None):
    fn = _python_function(fn)
    return [OpCase(name, d, fn, inputs, tuple(ops), group, kernels, tolerance, out_dtype) for d in dtypes]


FLOATS = (f32, f64, bf16, f16)
REDUCTION_TOL = {f32: dict(rtol=1e-4, atol=1e-4), f64: dict(rtol=1e-9, atol=1e-9),
                 bf16: dict(rtol=3e-2, atol=3e-2), f16: dict(rtol=4e-3, atol=4e-3)}


def _reduction(name, fn, ops, dtypes=(f32,), kernels=1, inputs=one):
    return [OpCase(name, d, fn, inputs, tuple(ops), "reduction", kernels, REDUCTION_TOL[d]) for d in dtypes]


OP_CASES: list[OpCase] = [
    # pointwise unary
    *_cases("sin", torch.sin, one, [aten.sin], "pointwise", FLOATS),
    *_cases("exp", torch.exp, one, [aten.exp], "pointwise", FLOATS),
    *_cases("erf", torch.erf, one, [aten.erf], "pointwise", (f32, f64)),
    *_cases("cos", torch.cos, one, [aten.cos], "pointwise"),
    *_cases("log", torch.log, positive, [aten.log], "pointwise", (f32, f64)),
    *_cases("sqrt", torch.sqrt, positive, [aten.sqrt], "pointwise"),
    *_cases("rsqrt", torch.rsqrt, positive, [aten.rsqrt], "pointwise"),
    *_cases("tanh", torch.tanh, one, [aten.tanh], "pointwise", (f32, bf16)),
    *_cases("sigmoid", torch.sigmoid, one, [aten.sigmoid], "pointwise"),
    *_cases("relu", torch.relu, one, [aten.relu], "pointwise"),
    *_cases("gelu", F.gelu, one, [aten.gelu], "pointwise"),
    *_cases("abs", torch.abs, one, [aten.abs], "pointwise"),
    *_cases("neg", torch.neg, one, [aten.neg], "pointwise"),
    # pointwise binary
    *_cases("add", torch.add, two, [aten.add], "pointwise", FLOATS),
    *_cases("mul", torch.mul, two, [aten.mul], "pointwise", FLOATS),
    *_cases("sub", torch.sub, two, [aten.sub], "pointwise"),
    *_cases("div", torch.div, numerator_divisor, [aten.div], "pointwise", (f32, f64)),
    *_cases("pow", lambda x, y: torch.pow(x.abs() + 0.5, y), two, [aten.pow], "pointwise", kernels=1),
    *_cases("maximum", torch.maximum, two, [aten.maximum], "pointwise"),
    *_cases("minimum", torch.minimum, two, [aten.minimum], "pointwise"),
    *_cases("add_int", torch.add, integers, [aten.add], "pointwise", (torch.int64, torch.int32)),
    *_cases("floor_divide", lambda a, b: a // b, integers, [aten.floor_divide, aten.div], "pointwise",
            (torch.int64,)),
    *_cases("logical_and", torch.logical_and, booleans, [aten.logical_and], "pointwise", (torch.bool,)),
    # comparisons and where
    *_cases("lt", torch.lt, two, [aten.lt], "compare"),
    *_cases("eq", lambda x, y: x.round() == y.round(), two, [aten.eq, aten.round], "compare"),
    *_cases("ge", torch.ge, two, [aten.ge], "compare", (f32, bf16)),
    *_cases("where", lambda x, y: torch.where(x > y, x, y), two, [aten.where, aten.gt], "compare",
            (f32, f16)),
    *_cases("clamp", lambda x: torch.clamp(x, -0.5, 0.7), one, [aten.clamp], "compare"),
    # casts
    *_cases("to_bfloat16", lambda x: x.to(bf16), one, [aten._to_copy],
            "cast", tolerance=EXACT, out_dtype=bf16),
    *_cases("to_float16", lambda x: x.to(f16), one, [aten._to_copy], "cast", tolerance=EXACT, out_dtype=f16),
    *_cases("to_float32", lambda x: x.to(f32), one, [aten._to_copy], "cast", (bf16, f16), tolerance=EXACT,
            out_dtype=f32),
    *_cases("to_float64", lambda x: x.to(f64), one, [aten._to_copy], "cast", tolerance=EXACT, out_dtype=f64),
    *_cases("to_int32", lambda x: (x * 10).to(torch.int32), one, [aten._to_copy, aten.mul], "cast",
            tolerance=EXACT),
    *_cases("int_to_float32", lambda a, b: a.to(f32), integers, [aten._to_copy], "cast", (torch.int64,),
            tolerance=EXACT),
    *_cases("bool_to_float32", lambda p, q: p.to(f32), booleans, [aten._to_copy], "cast", (torch.bool,),
            tolerance=EXACT),
    # reductions
    *_reduction("sum", lambda x: x.sum(1), [aten.sum], (f32, f64, bf16)),
    *_reduction("sum_all", lambda x: x.sum(), [aten.sum]),
    *_reduction("mean", lambda x: x.mean(0), [aten.mean, aten.sum]),
    *_reduction("amax", lambda x: x.amax(1), [aten.amax], (f32, f16)),
    *_reduction("argmax", lambda x: x.argmax(1), [aten.argmax]),
    *_reduction("var", lambda x: x.var(1), [aten.var], (f32, f64)),
    *_reduction("softmax", lambda x: torch.softmax(x, -1), [aten._softmax, aten.amax, aten.exp, aten.sum],
                (f32, bf16)),
    *_reduction("log_softmax", lambda x: torch.log_softmax(x, -1),
                [aten._log_softmax, aten.amax, aten.exp, aten.log, aten.sum]),
    # views feeding one pointwise op: the kernel reads through the view
    *_cases("permute", lambda x: x.permute(2, 0, 1) * 2, three_d, [aten.permute, aten.mul], "view"),
    *_cases("transpose", lambda x, y: x.t() + 1, two, [aten.t, aten.transpose, aten.add], "view"),
    *_cases("slice", lambda x: x[1:7, ::3] * 2, one, [aten.slice, aten.mul], "view", (f32, f64)),
    *_cases("select_unsqueeze_expand", lambda x: x[2].unsqueeze(0).expand(5, -1) * 2, one,
            [aten.select, aten.unsqueeze, aten.expand, aten.mul], "view"),
    *_cases("reshape", lambda x: x.reshape(4, -1) * 2, one, [aten.view, aten.mul], "view"),
    *_cases("cat", lambda x, y: torch.cat([x, y], 0), cat_inputs, [aten.cat], "view", (f32, bf16)),
    # indexing
    *_cases("gather", lambda x, i: torch.gather(x, 1, i), gather_inputs, [aten.gather], "indexing"),
    *_cases("index_select", lambda x, i: torch.index_select(x, 0, i), index_select_inputs,
            [aten.index_select], "indexing", (f32, f16)),
    *_cases("embedding", lambda i, w: F.embedding(i, w), embedding_inputs, [aten.embedding], "indexing"),
    # pooling
    *_cases("max_pool2d", lambda x: F.max_pool2d(x, 2), images,
            [aten.max_pool2d_with_indices, aten.max_pool2d], "pooling"),
]

# Every loop-IR op (fxwrap.ir.loops.OP_INFO) and every reduction and scan kind
# (REDUCTIONS, SCANS), in every dtype the op takes: bool, integers and floats.
INTS = (torch.int32, torch.int64)
ALL_DTYPES = (*FLOATS, *INTS, torch.bool)
OP_CASES += [
    # unary math over floats
    *_cases("acos", torch.acos, unit_interval, [aten.acos], "pointwise", (f32, f64)),
    *_cases("asin", torch.asin, unit_interval, [aten.asin], "pointwise", (f32, f64)),
    *_cases("atan", torch.atan, one, [aten.atan], "pointwise", (f32, f64)),
    *_cases("acosh", torch.acosh, above_one, [aten.acosh], "pointwise", (f32, f64)),
    *_cases("asinh", torch.asinh, one, [aten.asinh], "pointwise", (f32, f64)),
    *_cases("atanh", torch.atanh, unit_interval, [aten.atanh], "pointwise", (f32, f64)),
    *_cases("cosh", torch.cosh, one, [aten.cosh], "pointwise", (f32, f64)),
    *_cases("sinh", torch.sinh, one, [aten.sinh], "pointwise", (f32, f64)),
    *_cases("tan", torch.tan, unit_interval, [aten.tan], "pointwise", (f32, f64)),
    *_cases("erfc", torch.erfc, one, [aten.erfc], "pointwise", (f32, f64)),
    *_cases("erfinv", torch.erfinv, unit_interval, [aten.erfinv], "pointwise", (f32, f64),
            tolerance=dict(rtol=1e-4, atol=1e-5)),
    *_cases("exp2", torch.exp2, one, [aten.exp2], "pointwise", (f32, f64)),
    *_cases("expm1", torch.expm1, one, [aten.expm1], "pointwise", (f32, f64)),
    *_cases("log10", torch.log10, positive, [aten.log10], "pointwise", (f32, f64)),
    *_cases("log1p", torch.log1p, positive, [aten.log1p], "pointwise", (f32, f64)),
    *_cases("log2", torch.log2, positive, [aten.log2], "pointwise", (f32, f64)),
    *_cases("reciprocal", torch.reciprocal, positive, [aten.reciprocal], "pointwise", FLOATS),
    *_cases("ceil", lambda x: torch.ceil(x * 4), one, [aten.ceil, aten.mul], "pointwise", FLOATS),
    *_cases("floor", lambda x: torch.floor(x * 4), one, [aten.floor, aten.mul], "pointwise", FLOATS),
    *_cases("round", lambda x: torch.round(x * 4), one, [aten.round, aten.mul], "pointwise", FLOATS),
    *_cases("trunc", lambda x: torch.trunc(x * 4), one, [aten.trunc, aten.mul], "pointwise", FLOATS),
    *_cases("isnan", lambda x: torch.isnan(torch.log(x)), one, [aten.isnan, aten.log], "pointwise", (f32, f16)),
    *_cases("isinf", lambda x: torch.isinf(1 / (x.round())), one, [aten.isinf, aten.reciprocal, aten.div,
                                                                   aten.round], "pointwise", (f32,)),
    *_cases("signbit", torch.signbit, one, [aten.signbit], "pointwise", (f32, f64)),
    # ops every dtype has, bool included (maximum(bool, bool) and sign(bool) once rendered as invalid code)
    *_cases("sign", torch.sign, any_dtype, [aten.sign], "pointwise", ALL_DTYPES),
    *_cases("abs_any", torch.abs, any_dtype, [aten.abs], "pointwise", (*FLOATS, *INTS)),
    *_cases("neg_any", torch.neg, any_dtype, [aten.neg], "pointwise", (*FLOATS, *INTS)),
    *_cases("maximum_any", torch.maximum, two_any_dtype, [aten.maximum], "pointwise", ALL_DTYPES),
    *_cases("minimum_any", torch.minimum, two_any_dtype, [aten.minimum], "pointwise", ALL_DTYPES),
    *_cases("eq_any", torch.eq, two_any_dtype, [aten.eq], "compare", ALL_DTYPES),
    *_cases("ne_any", torch.ne, two_any_dtype, [aten.ne], "compare", ALL_DTYPES),
    *_cases("le_any", torch.le, two_any_dtype, [aten.le], "compare", (*FLOATS, *INTS)),
    *_cases("gt_any", torch.gt, two_any_dtype, [aten.gt], "compare", (*FLOATS, *INTS)),
    *_cases("where_any", lambda x, y: torch.where(x != y, x, y), two_any_dtype, [aten.where, aten.ne], "compare",
            ALL_DTYPES),
    *_cases("to_float32_any", lambda x: x.to(f32), any_dtype, [aten._to_copy], "cast", (*INTS, torch.bool, f64),
            tolerance=EXACT, out_dtype=f32),
    *_cases("to_bool", lambda x: x.to(torch.bool), any_dtype, [aten._to_copy], "cast", (f32, *INTS),
            tolerance=EXACT, out_dtype=torch.bool),
    # binary math over floats
    *_cases("atan2", torch.atan2, two, [aten.atan2], "pointwise", (f32, f64)),
    *_cases("copysign", torch.copysign, two, [aten.copysign], "pointwise", (f32, f64)),
    *_cases("fmod", torch.fmod, numerator_divisor, [aten.fmod], "pointwise", (f32, f64)),
    *_cases("remainder", torch.remainder, numerator_divisor, [aten.remainder], "pointwise", (f32, f64)),
    *_cases("pow_float", lambda x, y: torch.pow(x.abs() + 0.5, y), two, [aten.pow], "pointwise", (f64, bf16)),
    # integer and bool ops
    *_cases("sub_int", torch.sub, integers, [aten.sub], "pointwise", INTS),
    *_cases("mul_int", torch.mul, integers, [aten.mul], "pointwise", INTS),
    *_cases("remainder_int", torch.remainder, integers, [aten.remainder], "pointwise", INTS),
    *_cases("fmod_int", torch.fmod, integers, [aten.fmod], "pointwise", INTS),
    *_cases("trunc_divide", lambda a, b: torch.div(a, b, rounding_mode="trunc"), integers, [aten.div],
            "pointwise", INTS),
    *_cases("true_divide_int", torch.true_divide, integers, [aten.div], "pointwise", INTS),
    *_cases("lshift", lambda a, b: a << b, shifts, [aten.bitwise_left_shift, aten.__lshift__], "pointwise", INTS),
    *_cases("rshift", lambda a, b: a >> b, shifts, [aten.bitwise_right_shift, aten.__rshift__], "pointwise",
            INTS),
    *_cases("bitwise_and", torch.bitwise_and, two_any_dtype, [aten.bitwise_and], "pointwise", (*INTS, torch.bool)),
    *_cases("bitwise_or", torch.bitwise_or, two_any_dtype, [aten.bitwise_or], "pointwise", (*INTS, torch.bool)),
    *_cases("bitwise_xor", torch.bitwise_xor, two_any_dtype, [aten.bitwise_xor], "pointwise", (*INTS, torch.bool)),
    *_cases("bitwise_not", torch.bitwise_not, any_dtype, [aten.bitwise_not], "pointwise", (*INTS, torch.bool)),
    *_cases("logical_or", torch.logical_or, booleans, [aten.logical_or], "pointwise", (torch.bool,)),
    *_cases("logical_xor", torch.logical_xor, booleans, [aten.logical_xor], "pointwise", (torch.bool,)),
    *_cases("logical_not", torch.logical_not, one_bool, [aten.logical_not], "pointwise", (torch.bool,)),
    # every reduction kind, in the dtypes it takes
    *_reduction("prod", lambda x: x.prod(1), [aten.prod], (f32, f64), inputs=small_positive),
    *_reduction("amin", lambda x: x.amin(1), [aten.amin], (f32, f64, bf16, f16)),
    *_reduction("argmin", lambda x: x.argmin(1), [aten.argmin], (f32, f64)),
    *_reduction("argmax_f64", lambda x: x.argmax(0), [aten.argmax], (f64,)),
    *_reduction("var_mean", lambda x: torch.var_mean(x, 1), [aten.var_mean, aten.var, aten.mean, aten.sum],
                (f32, f64)),
    *_cases("sum_int", lambda x: x.sum(1), one_int, [aten.sum], "reduction", INTS),
    *_cases("prod_int", lambda x: (x % 3 + 1).prod(1), one_int, [aten.prod, aten.remainder, aten.add],
            "reduction", INTS),
    *_cases("amax_int", lambda x: x.amax(1), one_int, [aten.amax], "reduction", INTS),
    *_cases("amin_int", lambda x: x.amin(0), one_int, [aten.amin], "reduction", INTS),
    *_cases("argmin_int", lambda x: x.argmin(1), one_int, [aten.argmin], "reduction", INTS),
    *_cases("amax_bool", lambda x: x.amax(1), one_bool, [aten.amax], "reduction", (torch.bool,)),
    *_cases("amin_bool", lambda x: x.amin(1), one_bool, [aten.amin], "reduction", (torch.bool,)),
    *_cases("any", lambda x: x.any(1), one_bool, [aten.any], "reduction", (torch.bool,)),
    *_cases("all", lambda x: x.all(1), one_bool, [aten.all], "reduction", (torch.bool,)),
    *_cases("any_float", lambda x: (x > 1).any(0), one, [aten.any, aten.gt], "reduction", (f32,)),
    *_cases("all_int", lambda x: x.all(1), one_int, [aten.all], "reduction", INTS),
    # every scan kind
    *_reduction("cumsum", lambda x: x.cumsum(1), [aten.cumsum], (f32, f64)),
    *_reduction("cumprod", lambda x: x.cumprod(1), [aten.cumprod], (f32, f64), inputs=small_positive),
    *_reduction("logcumsumexp", lambda x: torch.logcumsumexp(x, 1), [aten.logcumsumexp], (f32, f64)),
    *_cases("cummax", lambda x: torch.cummax(x, 1), one, [aten.cummax], "reduction", (f32, f64)),
    *_cases("cummin", lambda x: torch.cummin(x, 1), one, [aten.cummin], "reduction", (f32, f64)),
    *_cases("cumsum_int", lambda x: x.cumsum(1), one_int, [aten.cumsum], "reduction", INTS),
    *_cases("cumsum_bool", lambda x: x.cumsum(1), one_bool, [aten.cumsum], "reduction", (torch.bool,)),
]



def _special(name, fn, inputs, ops, group, dtypes=(f32,), kernels=1, zero_signs=False):
    """Cases whose eager result depends on NaN, inf, -0.0 or extreme values (named
    ``<op>_special``): a target that maps ``maximum`` to C's ``fmax`` (``fmax(NaN, x) == x``)
    or ``relu`` to ``x > 0 ? x : 0`` passes every case on finite inputs and fails these.
    ``zero_signs``: the sign of a zero result is compared too, for the ops whose sign IEEE
    754 fixes (not ``max(-0.0, 0.0)``, which devices answer differently)."""
    fn = _python_function(fn)
    tolerance = {f32: TOLERANCES[f32], f64: TOLERANCES[f64], bf16: REDUCTION_TOL[bf16], f16: REDUCTION_TOL[f16]}
    return [OpCase(f"{name}_special", d, fn, inputs, tuple(ops), group, kernels,
                   tolerance[d] if group != "reduction" else REDUCTION_TOL[d], None, zero_signs) for d in dtypes]


OP_CASES += [
    *_special("relu", torch.relu, special, [aten.relu], "pointwise", (f32, bf16)),
    *_special("maximum", torch.maximum, two_special, [aten.maximum], "pointwise", (f32, f64, f16)),
    *_special("minimum", torch.minimum, two_special, [aten.minimum], "pointwise", (f32, f64)),
    *_special("clamp", lambda x: torch.clamp(x, -0.5, 0.7), special, [aten.clamp], "compare", (f32, bf16)),
    *_special("clamp_min", lambda x: torch.clamp_min(x, 0.25), special, [aten.clamp_min, aten.clamp], "compare"),
    *_special("where", lambda x, y: torch.where(x > y, x, y), two_special, [aten.where, aten.gt], "compare"),
    *_special("abs", torch.abs, special, [aten.abs], "pointwise", (f32, f64), zero_signs=True),
    *_special("neg", torch.neg, special, [aten.neg], "pointwise", zero_signs=True),
    *_special("sign", torch.sign, special, [aten.sign], "pointwise", (f32, f64)),
    *_special("sigmoid", torch.sigmoid, special, [aten.sigmoid], "pointwise"),
    *_special("tanh", torch.tanh, special, [aten.tanh], "pointwise"),
    *_special("exp", torch.exp, special, [aten.exp], "pointwise"),
    *_special("mul", torch.mul, two_special, [aten.mul], "pointwise", zero_signs=True),
    *_special("isnan", torch.isnan, special, [aten.isnan], "pointwise"),
    *_special("isinf", torch.isinf, special, [aten.isinf], "pointwise"),
    *_special("nan_to_num", torch.nan_to_num, special, [aten.nan_to_num], "pointwise", (f32, f64)),
    *_special("amax", lambda x: x.amax(1), special, [aten.amax], "reduction", (f32, f16)),
    *_special("amin", lambda x: x.amin(1), special, [aten.amin], "reduction", (f32, f64)),
    *_special("argmax", lambda x: x.argmax(1), special, [aten.argmax], "reduction"),
    *_special("sum", lambda x: x.sum(1), special, [aten.sum], "reduction"),
    *_special("softmax", lambda x: torch.softmax(x, -1), special, [aten._softmax, aten.amax, aten.exp, aten.sum],
              "reduction"),
    *_special("log_softmax", lambda x: torch.log_softmax(x, -1), special,
              [aten._log_softmax, aten.amax, aten.exp, aten.log, aten.sum], "reduction"),
    *_special("max_pool2d", lambda x: F.max_pool2d(x, 2), images_special,
              [aten.max_pool2d_with_indices, aten.max_pool2d], "pooling"),
    # eager's exact zeros are +0.0 (x * scale + shift), whatever the weight's sign
    *_special("layer_norm_constant_rows", lambda x, w: F.layer_norm(x, (16,), w), constant_rows,
              [aten.native_layer_norm], "reduction", zero_signs=True),
]

OP_CASES_BY_ID: dict[str, OpCase] = {case.id: case for case in OP_CASES}
assert len(OP_CASES_BY_ID) == len(OP_CASES), "op case ids must be unique"
