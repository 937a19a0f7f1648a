"""Seeded random programs: ``generate(seed)`` gives the source of one program module.

The same seed gives the same source, byte for byte (one ``random.Random(seed)`` makes every
choice; candidate lines are tried on real tensors in eager, in the same order every time).
A program is an ``nn.Module`` whose ``forward`` is a straight line of statements, each
built from one op family, over inputs that the program adds as it needs them::

    SEED = 3
    DYNAMIC = False
    BACKWARD = True
    INPUTS = [
        ("x0", (4, 6), torch.float32, "randn", None, "transposed", True),
        ("i1", (5,), torch.int64, "randint", (0, 6), "contiguous", False),
    ]
    BUFFERS = []


    class Program(torch.nn.Module):
        def forward(self, x0, i1):
            v0 = torch.index_select(x0, 1, i1)
            v1 = torch.softmax(v0, dim=0)
            v1.mul_(0.5)
            v2 = torch.amax(v1, dim=(0,), keepdim=True)
            return (v2, v1)

Families: pointwise (unary, binary with broadcasting and Python scalars, where,
comparisons, casts; float32, bfloat16, int64, bool), reductions (sum, mean, amax, amin,
prod, argmax, argmin, any, all, var, over several dims, keepdim), views (reshape,
permute, transpose, slices with steps, expand, squeeze/unsqueeze, narrow, flatten,
diagonal), indexing (gather, index_select, indexing by a tensor, embedding, scatter_add,
scatter_reduce, index_put and index_copy into a fresh tensor), matmuls (mm, bmm, linear,
matmul), softmax/log_softmax/layer_norm/rms_norm, ``torch.cond``, and mutation (in-place
ops on inputs, on intermediates and their views, on buffers).

Only values that a correct compiler computes bit for bit as eager does (``exact``:
inputs, their views and indexing, comparisons, int and bool arithmetic, max/min/abs/neg)
feed a discontinuous op (a comparison, argmax, a float-to-int cast, floor, a ``cond``
predicate): a rounding difference elsewhere must not turn into a different branch.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import torch

from fxwrap.testing.fuzz import harness

F32, BF16, I64, BOOL = torch.float32, torch.bfloat16, torch.int64, torch.bool
DTYPE_NAMES = {F32: "torch.float32", BF16: "torch.bfloat16", I64: "torch.int64", BOOL: "torch.bool"}
SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16)
MAX_NUMEL = 1024


@dataclass
class Value:
    """A name in ``forward`` and what the generator knows of it."""

    name: str
    exact: bool       # computed bit for bit by any correct compiler
    group: str        # storage group: values that alias one storage share it
    mutable: bool     # may be written in place (not a requires-grad input or its view)


@dataclass
class Builder:
    """The program under construction: its inputs, buffers, lines and eager values."""

    seed: int
    rng: random.Random
    float_dtype: torch.dtype
    backward: bool
    inputs: list = field(default_factory=list)     # input specs
    buffers: list = field(default_factory=list)    # buffer specs
    helpers: list = field(default_factory=list)    # source of cond branch functions
    lines: list = field(default_factory=list)      # forward's statements
    values: list = field(default_factory=list)
    env: dict = field(default_factory=dict)        # name -> eager tensor
    counter: int = 0

    # -- names and values ---------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter - 1}"

    def tensor(self, value: Value) -> torch.Tensor:
        return self.env[value.name]

    def pick(self, predicate=lambda t, v: True) -> Value | None:
        """A value that ``predicate(tensor, value)`` accepts, recent ones more likely."""
        candidates = [v for v in self.values if predicate(self.env[v.name], v)]
        if not candidates:
            return None
        weights = [i + 1 for i in range(len(candidates))]
        return self.rng.choices(candidates, weights)[0]

    def add_input(self, shape, dtype, kind="randn", arg=None, layout=None, requires_grad=None) -> Value:
        name = self.fresh("x" if dtype.is_floating_point else "i" if dtype != BOOL else "b")
        if layout is None:
            layout = self.rng.choice(["contiguous"] * 5 + ["transposed", "strided", "offset", "expanded"])
            if layout == "transposed" and len(shape) < 2 or layout in ("strided", "expanded") and not shape:
                layout = "contiguous"
        if requires_grad is None:
            requires_grad = self.backward and dtype.is_floating_point
        spec = (name, tuple(shape), dtype, kind, arg, layout, requires_grad)
        self.inputs.append(spec)
        self.env[name] = harness.make_tensor(spec, self.seed, len(self.inputs) - 1)
        value = Value(name, True, name, not requires_grad and layout != "expanded")
        self.values.append(value)
        return value

    def add_buffer(self, shape, dtype) -> str:
        name = f"buf{len(self.buffers)}"
        spec = (name, tuple(shape), dtype, "randn", None, "contiguous", False)
        self.buffers.append(spec)
        self.env[f"self.{name}"] = harness.make_tensor(spec, self.seed, 1000 + len(self.buffers) - 1)
        return f"self.{name}"

    def index_input(self, shape, bound) -> Value:
        """An int64 input of ``shape`` with values in ``[0, bound)``."""
        return self.add_input(shape, I64, "randint", (0, bound), "contiguous", False)

    # -- trying lines ---------------------------------------------------------------------
    def namespace(self) -> dict:
        ns = {"torch": torch}
        for source in self.helpers:
            exec(source, ns)  # noqa: S102 - the generator's own code
        ns.update({k: v for k, v in self.env.items() if not k.startswith("self.")})
        ns["self"] = _Buffers({k[5:]: v for k, v in self.env.items() if k.startswith("self.")})
        return ns

    def assign(self, expr: str, exact: bool, group: str | None = None, mutable: bool = True) -> Value | None:
        """``vN = expr`` where eager can run it and the result is a usable tensor."""
        name = self.fresh("v")
        ns = self.namespace()
        try:
            exec(f"{name} = {expr}", ns)  # noqa: S102
        except Exception:  # noqa: BLE001 - an invalid candidate is dropped
            return None
        result = ns[name]
        if not isinstance(result, torch.Tensor) or result.numel() > MAX_NUMEL or result.numel() == 0 \
                or result.dtype not in DTYPE_NAMES:
            return None
        self.lines.append(f"{name} = {expr}")
        self.env[name] = result
        value = Value(name, exact, group or name, mutable)
        self.values.append(value)
        return value

    def statement(self, text: str, mutated_group: str, keeps_exact: bool) -> bool:
        """An in-place statement; on success every value of ``mutated_group`` may change."""
        ns = self.namespace()
        try:
            exec(text, ns)  # noqa: S102
        except Exception:  # noqa: BLE001
            return False
        self.lines.append(text)
        if not keeps_exact:
            for value in self.values:
                if value.group == mutated_group:
                    value.exact = False
        return True


class _Buffers:
    """``self`` while the generator tries a line: buffers by attribute."""

    def __init__(self, tensors):
        self.__dict__.update(tensors)


# -- helpers over shapes ---------------------------------------------------------------------
def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _random_shape(rng, rank=None) -> tuple[int, ...]:
    rank = rng.choice([1, 2, 2, 3, 3, 4]) if rank is None else rank
    while True:
        shape = tuple(rng.choice(SIZES) for _ in range(rank))
        if _numel(shape) <= 256:
            return shape


def _factorizations(n: int, rng) -> tuple[int, ...]:
    """A random shape with ``n`` elements."""
    factors, k, m = [], 2, n
    while m > 1:
        while m % k == 0:
            factors.append(k)
            m //= k
        k += 1
    rank = rng.randint(1, 4)
    dims = [1] * rank
    for f in factors:
        dims[rng.randrange(rank)] *= f
    return tuple(dims)


def _broadcast_partner(shape, rng) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: a suffix, some dims set to 1."""
    keep = rng.randint(0, len(shape))
    part = list(shape[len(shape) - keep:])
    for i in range(len(part)):
        if rng.random() < 0.3:
            part[i] = 1
    if rng.random() < 0.15 and len(part) < 4:
        part = [rng.choice((1, 2))] + part if len(part) == len(shape) else part
    return tuple(part)


def _is_float(t, v=None) -> bool:
    return t.is_floating_point()


def _dims_text(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


# -- the op families ---------------------------------------------------------------------------
FLOAT_UNARY = [  # (template, keeps exactness)
    ("torch.sin({a})", False), ("torch.cos({a})", False), ("torch.tanh({a})", False),
    ("torch.sigmoid({a})", False), ("torch.relu({a})", True), ("torch.abs({a})", True),
    ("torch.neg({a})", True), ("torch.exp({a})", False), ("torch.log(torch.abs({a}) + 1)", False),
    ("torch.sqrt(torch.abs({a}))", False), ("torch.rsqrt({a})", False), ("torch.reciprocal({a})", False),
    ("torch.square({a})", False), ("torch.erf({a})", False), ("torch.nn.functional.gelu({a})", False),
    ("torch.nn.functional.silu({a})", False), ("torch.clamp({a}, min=-0.5, max=0.5)", True),
    ("torch.expm1({a})", False), ("torch.log1p(torch.abs({a}))", False), ("torch.atan({a})", False),
    ("torch.pow({a}, 2)", False), ("{a} ** 3", False), ("torch.nan_to_num({a}, nan=0.0)", True),
    ("torch.log({a})", False), ("{a} * 0.5", False), ("{a} + 2", False), ("2.0 - {a}", False),
    ("{a} / 3", False), ("torch.nn.functional.leaky_relu({a}, 0.1)", False),
]
FLOAT_UNARY_EXACT_ONLY = ["torch.floor({a})", "torch.round({a})", "torch.sign({a})", "torch.ceil({a})",
                          "torch.trunc({a})", "torch.frac({a})", "torch.isnan({a})"]
INT_UNARY = ["torch.neg({a})", "torch.abs({a})", "{a} % 7", "torch.remainder({a}, -5)",
             "torch.div({a}, 3, rounding_mode='floor')", "torch.div({a}, 3, rounding_mode='trunc')",
             "{a} * 3", "torch.bitwise_not({a})", "torch.clamp({a}, min=-5, max=5)", "{a} >> 1",
             "{a} & 5", "{a} // 4", "{a} + 1", "torch.sign({a})"]
BOOL_UNARY = ["~{a}", "torch.logical_not({a})"]
FLOAT_BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "torch.maximum({a}, {b})",
                "torch.minimum({a}, {b})", "torch.atan2({a}, {b})", "{a} / (torch.abs({b}) + 1)",
                "torch.add({a}, {b}, alpha=2)", "torch.lerp({a}, {b}, 0.3)", "torch.hypot({a}, {b})",
                "torch.copysign({a}, {b})"]
EXACT_BINARY = {"torch.maximum({a}, {b})", "torch.minimum({a}, {b})"}
INT_BINARY = ["{a} + {b}", "{a} - {b}", "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
              "{a} & {b}", "{a} | {b}", "{a} ^ {b}", "({a} * {b}) % 1000",
              "torch.remainder({a}, torch.abs({b}) + 1)", "torch.div({a}, torch.abs({b}) + 1, rounding_mode='floor')",
              "torch.fmod({a}, torch.abs({b}) + 1)"]
BOOL_BINARY = ["torch.logical_and({a}, {b})", "torch.logical_or({a}, {b})", "torch.logical_xor({a}, {b})",
               "{a} & {b}", "{a} | {b}", "{a} ^ {b}", "{a} == {b}", "torch.maximum({a}, {b})",
               "torch.minimum({a}, {b})"]
COMPARISONS = ["{a} > {b}", "{a} < {b}", "{a} >= {b}", "{a} <= {b}", "{a} == {b}", "{a} != {b}",
               "{a} > 0", "{a} <= 0"]


def pointwise_unary(b: Builder) -> bool:
    v = b.pick()
    if v is None:
        return False
    t = b.tensor(v)
    if t.dtype == BOOL:
        return b.assign(b.rng.choice(BOOL_UNARY).format(a=v.name), v.exact) is not None
    if t.dtype == I64:
        return b.assign(b.rng.choice(INT_UNARY).format(a=v.name), v.exact) is not None
    if v.exact and b.rng.random() < 0.25:
        return b.assign(b.rng.choice(FLOAT_UNARY_EXACT_ONLY).format(a=v.name), True) is not None
    template, keeps = b.rng.choice(FLOAT_UNARY)
    return b.assign(template.format(a=v.name), v.exact and keeps) is not None


def _partner(b: Builder, v: Value, dtype) -> tuple[str, bool] | None:
    """A second operand for ``v``: an existing value that broadcasts, a new input, a scalar."""
    shape = tuple(b.tensor(v).shape)
    choice = b.rng.random()
    if choice < 0.45:
        def fits(t, w):
            try:
                return (t.dtype == dtype and w.name != v.name
                        and tuple(torch.broadcast_shapes(t.shape, shape)) == shape)
            except RuntimeError:
                return False
        w = b.pick(fits)
        if w is not None:
            return w.name, w.exact
    if choice < 0.9:
        kind, arg = {BOOL: ("bool", None), I64: ("randint", (-20, 20))}.get(dtype, ("randn", None))
        w = b.add_input(_broadcast_partner(shape, b.rng), dtype, kind, arg)
        return w.name, True
    scalar = {BOOL: "True", I64: str(b.rng.choice((-3, 2, 5)))}.get(dtype, b.rng.choice(("0.5", "-1.25", "3.0")))
    return scalar, True


def pointwise_binary(b: Builder) -> bool:
    v = b.pick()
    if v is None:
        return False
    t = b.tensor(v)
    dtype = t.dtype
    if b.rng.random() < 0.15:  # mixed dtypes: type promotion
        dtype = b.rng.choice([F32, I64, BOOL, b.float_dtype])
    other = _partner(b, v, dtype)
    if other is None:
        return False
    name, exact = other
    operands = [v.name, name]
    if b.rng.random() < 0.3:
        operands.reverse()
    if t.dtype == BOOL and dtype == BOOL:
        template = b.rng.choice(BOOL_BINARY)
        keeps = True
    elif t.dtype == I64 and dtype == I64:
        template, keeps = b.rng.choice(INT_BINARY), True
    else:
        template = b.rng.choice(FLOAT_BINARY[:6] if not t.is_floating_point() else FLOAT_BINARY)
        keeps = template in EXACT_BINARY
    return b.assign(template.format(a=operands[0], b=operands[1]), v.exact and exact and keeps) is not None


def comparison(b: Builder) -> bool:
    v = b.pick(lambda t, w: w.exact and t.dtype != BOOL)
    if v is None:
        return False
    other = _partner(b, v, b.tensor(v).dtype)
    if other is None or not other[1]:
        return False
    return b.assign(b.rng.choice(COMPARISONS).format(a=v.name, b=other[0]), True) is not None


def where(b: Builder) -> bool:
    c = b.pick(lambda t, w: t.dtype == BOOL and w.exact)
    v = b.pick()
    if v is None:
        return False
    shape = tuple(b.tensor(v).shape)
    if c is None or b.rng.random() < 0.3:
        c = b.add_input(_broadcast_partner(shape, b.rng), BOOL, "bool")
    other = _partner(b, v, b.tensor(v).dtype)
    if other is None:
        return False
    zero = {BOOL: "False", I64: "0"}.get(b.tensor(v).dtype, "0.0")
    third = other[0] if b.rng.random() < 0.7 else zero
    return b.assign(f"torch.where({c.name}, {v.name}, {third})", v.exact and other[1]) is not None


def cast(b: Builder) -> bool:
    v = b.pick()
    if v is None:
        return False
    t = b.tensor(v)
    if t.is_floating_point():
        options = [(f"{v.name}.to(torch.bfloat16)", False), (f"{v.name}.to(torch.float32)", v.exact and t.dtype == F32)]
        if v.exact:
            options += [(f"{v.name}.to(torch.int64)", True), (f"{v.name}.bool()", True)]
        if t.dtype == BF16:
            options.append((f"{v.name}.float()", v.exact))
    else:
        options = [(f"{v.name}.to(torch.float32)", v.exact), (f"{v.name}.to({DTYPE_NAMES[b.float_dtype]})", False),
                   (f"{v.name}.bool()", v.exact), (f"{v.name}.long()", v.exact)]
    expr, exact = b.rng.choice(options)
    return b.assign(expr, exact) is not None


def reduction(b: Builder) -> bool:
    v = b.pick(lambda t, w: t.dim() >= 1)
    if v is None:
        return False
    t = b.tensor(v)
    rank = t.dim()
    dims = tuple(sorted(b.rng.sample(range(rank), b.rng.randint(1, rank))))
    keep = b.rng.random() < 0.4
    tail = f"dim={_dims_text(dims)}, keepdim={keep}"
    if t.dtype == BOOL:
        ops = [f"torch.any({v.name}, {tail})", f"torch.all({v.name}, {tail})", f"torch.sum({v.name}, {tail})",
               f"torch.any({v.name})"]
        exact = v.exact
    elif t.dtype == I64:
        ops = [f"torch.sum({v.name}, {tail})", f"torch.amax({v.name}, {tail})", f"torch.amin({v.name}, {tail})",
               f"torch.any({v.name}, {tail})", f"{v.name}.sum()"]
        exact = v.exact
    else:
        ops = [f"torch.sum({v.name}, {tail})", f"torch.mean({v.name}, {tail})", f"torch.amax({v.name}, {tail})",
               f"torch.amin({v.name}, {tail})", f"torch.prod({v.name}, {dims[0]}, keepdim={keep})",
               f"torch.var({v.name}, {tail})", f"torch.var({v.name}, {tail}, correction=0)",
               f"torch.logsumexp({v.name}, {tail})", f"{v.name}.sum()", f"torch.std({v.name}, {tail})"]
        exact = False
    expr = b.rng.choice(ops)
    exact = exact or (v.exact and ("amax" in expr or "amin" in expr))
    if v.exact and t.dtype != BOOL and b.rng.random() < 0.25:
        op = b.rng.choice(["argmax", "argmin"])
        expr, exact = f"torch.{op}({v.name}, dim={dims[0]}, keepdim={keep})", True
    return b.assign(expr, exact) is not None


def view(b: Builder) -> bool:
    v = b.pick()
    if v is None:
        return False
    t = b.tensor(v)
    shape, rank, rng = tuple(t.shape), t.dim(), b.rng
    options = [f"{v.name}.reshape({_dims_text(_factorizations(t.numel(), rng))})",
               f"{v.name}.unsqueeze({rng.randint(-rank - 1, rank)})"]
    if rank >= 2:
        options += [f"{v.name}.permute({_dims_text(rng.sample(range(rank), rank))})",
                    f"{v.name}.transpose({rng.randrange(rank)}, {rng.randrange(rank)})",
                    f"{v.name}.flatten({rng.randrange(rank - 1)})",
                    f"torch.diagonal({v.name}, 0, 0, {rank - 1})"]
    if rank == 2:
        options.append(f"{v.name}.t()")
    if rank >= 1:
        d = rng.randrange(rank)
        n = shape[d]
        start = rng.randrange(n)
        length = rng.randint(1, n - start)
        step = rng.choice((1, 1, 2, 3))
        index = ", ".join([":"] * d + [f"{start}:{start + length}:{step}"])
        options += [f"{v.name}[{index}]", f"{v.name}.narrow({d}, {start}, {length})",
                    f"{v.name}[{', '.join([':'] * d + [str(start)])}]",
                    f"{v.name}[..., {rng.randrange(shape[-1])}:]"]
        ones = [i for i, s in enumerate(shape) if s == 1]
        if ones:
            target = list(shape)
            for i in ones:
                target[i] = rng.choice((2, 3, 4))
            options += [f"{v.name}.expand({_dims_text(target)})", f"{v.name}.squeeze({ones[0]})"]
        if _numel(shape) * 3 <= MAX_NUMEL:
            options.append(f"{v.name}.expand({_dims_text((3,) + shape)})")
    expr = rng.choice(options)
    mutable = v.mutable and ".expand(" not in expr
    if rng.random() < 0.15:  # the copying relatives of views
        d = rng.randrange(max(rank, 1)) if rank else 0
        expr = rng.choice([f"torch.flip({v.name}, ({d},))", f"torch.roll({v.name}, 1, {d})",
                           f"torch.cat([{v.name}, {v.name} * 2], {d})", f"torch.stack([{v.name}, {v.name}], {d})",
                           f"{v.name}.contiguous()", f"{v.name}.clone()"]) if rank else f"{v.name}.clone()"
        exact = v.exact and "* 2" not in expr
        return b.assign(expr, exact) is not None
    return b.assign(expr, v.exact, group=v.group, mutable=mutable) is not None


def indexing(b: Builder) -> bool:
    v = b.pick(lambda t, w: t.dim() >= 1)
    if v is None:
        return False
    t = b.tensor(v)
    shape, rank, rng = tuple(t.shape), t.dim(), b.rng
    d = rng.randrange(rank)
    n = shape[d]
    m = rng.choice((1, 2, 3, 5, 8))
    kind = rng.choice(["gather", "index_select", "getitem", "embedding", "scatter_add", "scatter_amax",
                       "index_put", "index_copy"])
    if kind == "gather":
        idx = b.index_input(shape[:d] + (m,) + shape[d + 1:], n)
        return b.assign(f"torch.gather({v.name}, {d}, {idx.name})", v.exact) is not None
    if kind == "index_select":
        idx = b.index_input((m,), n)
        return b.assign(f"torch.index_select({v.name}, {d}, {idx.name})", v.exact) is not None
    if kind == "getitem":
        idx = b.index_input((m,) if rng.random() < 0.7 else (2, m), n)
        where_ = ", ".join([":"] * d + [idx.name])
        return b.assign(f"{v.name}[{where_}]", v.exact) is not None
    if kind == "embedding" and t.is_floating_point():
        last = shape[-1]
        idx = b.index_input(_random_shape(rng, rng.choice((1, 2))), t.numel() // last)
        weight = v.name if rank == 2 else f"{v.name}.reshape(-1, {last})"
        return b.assign(f"torch.nn.functional.embedding({idx.name}, {weight})", v.exact) is not None
    if kind in ("scatter_add", "scatter_amax") and t.dtype != BOOL:
        out = shape[:d] + (rng.choice((1, 2, 4, 6)),) + shape[d + 1:]
        idx = b.index_input(shape, out[d])
        fresh = f"torch.zeros({_dims_text(out)}, dtype={v.name}.dtype)"
        if kind == "scatter_add":
            return b.assign(f"{fresh}.scatter_add({d}, {idx.name}, {v.name})", v.exact and t.dtype == I64) is not None
        return b.assign(f"{fresh}.scatter_reduce({d}, {idx.name}, {v.name}, reduce='amax', include_self=True)",
                        v.exact) is not None
    if kind == "index_put" and t.dtype != BOOL:
        rows = rng.choice((1, 3, 6))
        idx = b.index_input((shape[0],), rows)
        fresh = f"torch.zeros({_dims_text((rows,) + shape[1:])}, dtype={v.name}.dtype)"
        return b.assign(f"{fresh}.index_put(({idx.name},), {v.name}, accumulate=True)",
                        v.exact and t.dtype == I64) is not None
    if kind == "index_copy":
        perm = b.add_input((n,), I64, "perm", None, "contiguous", False)
        fresh = f"torch.zeros({_dims_text(shape)}, dtype={v.name}.dtype)"
        return b.assign(f"{fresh}.index_copy({d}, {perm.name}, {v.name})", v.exact) is not None
    return False


def matmul(b: Builder) -> bool:
    v = b.pick(lambda t, w: t.is_floating_point() and t.dim() >= 1)
    if v is None:
        return False
    t = b.tensor(v)
    shape, rank, rng = tuple(t.shape), t.dim(), b.rng
    k, n = shape[-1], rng.choice((1, 3, 4, 8, 16))
    if rank == 2 and rng.random() < 0.4:
        w = b.add_input((k, n), t.dtype)
        return b.assign(f"torch.mm({v.name}, {w.name})", False) is not None
    if rank == 3 and rng.random() < 0.5:
        w = b.add_input((shape[0], k, n), t.dtype)
        return b.assign(f"torch.bmm({v.name}, {w.name})", False) is not None
    if rng.random() < 0.6:
        w = b.add_input((n, k), t.dtype)
        bias = b.add_input((n,), t.dtype).name if rng.random() < 0.6 else "None"
        return b.assign(f"torch.nn.functional.linear({v.name}, {w.name}, {bias})", False) is not None
    w = b.add_input(((shape[0],) if rank >= 3 and rng.random() < 0.5 else ()) + (k, n)
                    if rank >= 3 else (k, n), t.dtype)
    return b.assign(f"torch.matmul({v.name}, {w.name})", False) is not None


def normalization(b: Builder) -> bool:
    v = b.pick(lambda t, w: t.is_floating_point() and t.dim() >= 1)
    if v is None:
        return False
    t = b.tensor(v)
    d = b.rng.randrange(t.dim())
    last = t.shape[-1]
    kind = b.rng.choice(["softmax", "log_softmax", "layer_norm", "rms_norm"])
    if kind in ("softmax", "log_softmax"):
        return b.assign(f"torch.{kind}({v.name}, dim={d})", False) is not None
    weight = b.add_input((last,), t.dtype).name if b.rng.random() < 0.7 else "None"
    if kind == "layer_norm":
        bias = b.add_input((last,), t.dtype).name if weight != "None" and b.rng.random() < 0.7 else "None"
        return b.assign(f"torch.nn.functional.layer_norm({v.name}, ({last},), {weight}, {bias})",
                        False) is not None
    return b.assign(f"torch.nn.functional.rms_norm({v.name}, ({last},), {weight}, eps=1e-5)", False) is not None


BRANCHES = ["torch.sin({a}) * 2", "torch.cos({a}) + 1", "{a} * {a} - 0.5", "torch.tanh({a}) - {a}",
            "torch.relu({a}) + 0.25", "torch.exp(-torch.abs({a}))"]


def control_flow(b: Builder) -> bool:
    p = b.pick(lambda t, w: w.exact and t.dtype != BOOL)
    v = b.pick(lambda t, w: t.is_floating_point())
    if p is None or v is None:
        return False
    reduce_ = "amax" if b.tensor(p).is_floating_point() else "sum"
    threshold = "0" if reduce_ == "sum" else b.rng.choice(("0.0", "0.5", "1.0"))
    index = len(b.helpers)
    true_body, false_body = b.rng.sample(BRANCHES, 2)
    b.helpers.append(f"def branch_a{index}(a):\n    return {true_body.format(a='a')}\n\n\n"
                     f"def branch_b{index}(a):\n    return {false_body.format(a='a')}\n")
    expr = f"torch.cond({p.name}.{reduce_}() > {threshold}, branch_a{index}, branch_b{index}, ({v.name},))"
    if b.assign(expr, False) is None:
        b.helpers.pop()
        return False
    return True


INPLACE_FLOAT = ["{a}.add_({b})", "{a}.mul_({b})", "{a}.sub_({b})", "{a}.clamp_(min=-1.0)", "{a}.mul_(0.5)",
                 "{a}.copy_({b})", "{a}.fill_(1.5)", "{a}.neg_()", "{a}.sin_()", "{a}.div_(2.0)"]
INPLACE_INT = ["{a}.add_({b})", "{a}.mul_(2)", "{a}.clamp_(min=-3)", "{a}.fill_(4)", "{a}.copy_({b})",
               "{a}.neg_()", "{a}.bitwise_and_(7)"]
INPLACE_BOOL = ["{a}.logical_not_()", "{a}.fill_(True)", "{a}.copy_({b})", "{a}.logical_or_({b})"]
EXACT_INPLACE = {"{a}.clamp_(min=-1.0)", "{a}.fill_(1.5)", "{a}.neg_()", "{a}.copy_({b})", "{a}.clamp_(min=-3)",
                 "{a}.fill_(4)", "{a}.bitwise_and_(7)", "{a}.logical_not_()", "{a}.fill_(True)",
                 "{a}.logical_or_({b})"}


def mutation(b: Builder) -> bool:
    rng = b.rng
    if rng.random() < 0.2:  # a buffer, updated as a running statistic
        v = b.pick(lambda t, w: t.is_floating_point())
        if v is None:
            return False
        t = b.tensor(v)
        buffer = b.add_buffer(tuple(t.shape), t.dtype)
        text = rng.choice([f"{buffer}.mul_(0.9).add_({v.name} * 0.1)", f"{buffer}.copy_({v.name})",
                           f"{buffer}.add_({v.name})"])
        if not b.statement(text, buffer, False):
            b.buffers.pop()
            return False
        b.values.append(Value(buffer, False, buffer, True))
        return True
    v = b.pick(lambda t, w: w.mutable)
    if v is None:
        return False
    t = b.tensor(v)
    target_name = v.name
    if t.dim() >= 1 and rng.random() < 0.3:  # through a view
        d = rng.randrange(t.dim())
        target_name = f"{v.name}[{', '.join([':'] * d + [str(rng.randrange(t.shape[d]))])}]"
    table = INPLACE_BOOL if t.dtype == BOOL else INPLACE_INT if t.dtype == I64 else INPLACE_FLOAT
    template = rng.choice(table)
    other, exact_other = v.name, v.exact
    if "{b}" in template:
        partner = _partner(b, v, t.dtype)
        if partner is None:
            return False
        other, exact_other = partner
    if t.dim() >= 1 and rng.random() < 0.2 and t.dtype != BOOL:  # index_put_ in place
        idx = b.index_input((rng.choice((1, 2, 4)),), t.shape[0])
        text = f"{v.name}.index_put_(({idx.name},), torch.ones((), dtype={v.name}.dtype), accumulate=True)"
        return b.statement(text, v.group, t.dtype == I64)
    keeps = template in EXACT_INPLACE and exact_other
    return b.statement(template.format(a=target_name, b=other), v.group, keeps)


FAMILIES = [(pointwise_unary, 4), (pointwise_binary, 4), (comparison, 1), (where, 1), (cast, 1),
            (reduction, 2.5), (view, 2.5), (indexing, 2), (matmul, 1), (normalization, 1),
            (control_flow, 0.4), (mutation, 1.5)]


def _build(seed: int, rng: random.Random) -> Builder:
    float_dtype = BF16 if rng.random() < 0.25 else F32
    b = Builder(seed, rng, float_dtype, backward=rng.random() < 0.5)
    for _ in range(rng.randint(1, 3)):
        dtype = rng.choices([float_dtype, I64, BOOL], [6, 1, 1])[0]
        kind, arg = {BOOL: ("bool", None), I64: ("randint", (-20, 20))}.get(dtype, ("randn", None))
        b.add_input(_random_shape(rng), dtype, kind, arg)
    families, weights = zip(*FAMILIES)
    steps = rng.randint(2, 8)
    tries = 0
    while len(b.lines) < steps and tries < 60:
        tries += 1
        rng.choices(families, weights)[0](b)
    return b


def _outputs(b: Builder) -> list[str]:
    """The last value, and up to three values that no later line reads (so that little is dead)."""
    names = [v.name for v in b.values if v.name.startswith("v")]
    if not names:
        return [b.values[-1].name]
    text = "\n".join(b.lines)
    unread = [n for n in names[:-1] if len(re.findall(rf"\b{n}\b", text)) == 1]
    chosen = [names[-1]] + b.rng.sample(unread, min(len(unread), 3))
    if b.rng.random() < 0.3 and len(names) > 1:
        extra = b.rng.choice(names[:-1])
        if extra not in chosen:
            chosen.append(extra)
    return chosen


def _source(b: Builder, outputs: list[str], dynamic: bool) -> str:
    def spec_text(spec):
        name, shape, dtype, kind, arg, layout, grad = spec
        return f"    ({name!r}, {_dims_text(shape) if shape else '()'}, {DTYPE_NAMES[dtype]}, {kind!r}, {arg!r}, {layout!r}, {grad}),\n"
    args = ", ".join(["self"] + [s[0] for s in b.inputs])
    body = "".join(f"        {line}\n" for line in b.lines)
    helpers = "\n\n".join(b.helpers)
    return (f"SEED = {b.seed}\nDYNAMIC = {dynamic}\nBACKWARD = {b.backward}\n"
            f"INPUTS = [\n{''.join(spec_text(s) for s in b.inputs)}]\n"
            f"BUFFERS = [\n{''.join(spec_text(s) for s in b.buffers)}]\n\n\n"
            + (f"{helpers}\n\n" if helpers else "")
            + f"class Program(torch.nn.Module):\n    def forward({args}):\n{body}"
            f"        return ({', '.join(outputs)},)\n")


def load(source: str) -> dict:
    """The namespace of a program's source (what ``harness.check`` takes)."""
    ns = {"torch": torch}
    exec(compile(source, "<fuzz program>", "exec"), ns)  # noqa: S102 - the generator's own code
    return ns


def _valid(source: str) -> bool:
    """Eager runs the whole program, forward and backward, and twice gives the same bits."""
    try:
        ns = load(source)
        first, second = harness.run(ns), harness.run(ns)
    except Exception:  # noqa: BLE001 - an invalid program is regenerated
        return False
    return not harness.compare_runs(first, second) and all(
        torch.equal(torch.isnan(x), torch.isnan(y)) and torch.equal(x.nan_to_num(), y.nan_to_num())
        for part in ("outputs", "inputs", "buffers") for x, y in zip(first[part], second[part])
        if isinstance(x, torch.Tensor) and x.is_floating_point())


def generate(seed: int) -> str:
    """The source of program ``seed`` (the body of a module that imports torch)."""
    rng = random.Random(seed)
    dynamic = rng.random() < 0.35
    for _attempt in range(20):
        b = _build(seed, rng)
        if not b.lines:
            continue
        source = _source(b, _outputs(b), dynamic)
        if _valid(source):
            return source
    raise RuntimeError(f"fuzz: no valid program for seed {seed} in 20 attempts")
