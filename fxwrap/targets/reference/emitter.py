"""Loop IR evaluated with torch: the ``reference`` target's emitter.

It runs the kernel as the kernel builder hands it over, legalized
(``fxwrap.core.numerics``): every op over operands of the dtype it is computed in, every
rounding to bf16/fp16 a ``cast``; torch computes each op in exactly that dtype and
nothing is converted implicitly, so the reference checks the pass.

A kernel's source is its loop IR, one line per distinct value (``format_ssa``), so
its size grows with the number of values, not with the size of their tree::

    # fxwrap_pointwise_0 from mul: aten.mul.Tensor, sigmoid: aten.sigmoid.default
    ranges=(64,) reduction_ranges=()
    %0 = load.f32 arg0[x0]
    %1 = sigmoid.f32 %0
    %2 = mul.f32 %0 %1
    buf0[x0] = %2
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.combo import ComboKernel, ComboLimits
from fxwrap.ir.loops import (Op, OpCode, ScheduledKernel, acc_key, format_ssa, format_store, load_buffer, load_mask,
                            rvar, walk, xvar)
from fxwrap.core.numerics import illegal
from fxwrap.ir.symbolic import SizeArithmetic, evaluate_with
from fxwrap.runtime.launch import ReferenceLaunch
from fxwrap.targets.base import KernelEmitter, KernelSource, kernel_header

_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "erfc": torch.erfc, "erfinv": torch.erfinv,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "sigmoid": torch.sigmoid, "sign": torch.sign, "reciprocal": torch.reciprocal,
    "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not, "isnan": torch.isnan,
    "isinf": torch.isinf, "signbit": torch.signbit,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "mod": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "maximum": torch.maximum,
    "minimum": torch.minimum, "atan2": torch.atan2, "copysign": torch.copysign,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "lshift": torch.bitwise_left_shift, "rshift": torch.bitwise_right_shift,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
}


class _TensorIndexArithmetic(SizeArithmetic):
    """Index arithmetic over int64 tensors and ints (Python's floor division and modulo)."""

    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def mul(a, b):
        return a * b

    @staticmethod
    def floordiv(a, b):
        return a // b

    @staticmethod
    def mod(a, b):
        return a % b

    @staticmethod
    def minimum(a, b):
        if isinstance(a, int) and isinstance(b, int):
            return min(a, b)
        return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))

    @staticmethod
    def maximum(a, b):
        if isinstance(a, int) and isinstance(b, int):
            return max(a, b)
        return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


_INDEX_ARITHMETIC = _TensorIndexArithmetic()


def eval_index(expr, env: dict):
    """A sympy index expression over int64 tensors / ints (``env``: symbol name -> value)."""
    try:
        return evaluate_with(_INDEX_ARITHMETIC, expr, env)
    except (KeyError, NotImplementedError) as exc:
        raise NotImplementedError(f"reference target: index expression {expr}: {exc}") from exc


def _flat(t: torch.Tensor) -> torch.Tensor:
    """The tensor's storage from its data pointer on, as a 1-d tensor."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return torch.as_strided(t, (max(n, 0),), (1,), t.storage_offset())


class ReferenceLauncher:
    """``launcher(*inputs, *outputs, *sizes)`` evaluating a ScheduledKernel with torch."""

    def __init__(self, kernel: ScheduledKernel):
        self.k = kernel
        self.scans = frozenset(r.name for r in kernel.reductions if r.is_scan)

    def __call__(self, *args):
        k = self.k
        names = [b.name for b in (*k.inputs, *k.outputs)]
        tensors = dict(zip(names, args))
        env = {s.name: int(v) for s, v in zip(k.size_symbols, args[len(names):])}
        ranges = [int(eval_index(n, env)) for n in (*k.ranges, *k.reduction_ranges)]
        device = args[0].device if args else torch.device("cpu")
        grids = torch.meshgrid(*[torch.arange(n, device=device) for n in ranges], indexing="ij") \
            if ranges else []
        nx = len(k.ranges)
        for i, g in enumerate(grids):
            env[(xvar(i) if i < nx else rvar(i - nx)).name] = g
        shape = tuple(ranges)
        accs: dict[str, tuple] = {}
        for red in k.reductions:
            v = self.value(red.value, tensors, env, accs, shape)
            if red.is_scan:
                accs[red.name] = self.scan(red.kind, v, red.dtype, shape)
            else:
                accs[red.name] = self.reduce(red.kind, v, red.dtype, len(k.reduction_ranges), shape)
        for store in k.stores:
            v = self.value(store.value, tensors, env, accs, shape)
            if store.indexed:
                self.indexed_store(store, v, tensors, env, accs, shape, device)
                continue
            index = eval_index(store.index, env)
            uses_r = any(s.name.startswith("r") for s in sympy.sympify(store.index).free_symbols)
            if k.reduction_ranges and not uses_r:
                sel = (Ellipsis,) + (0,) * len(k.reduction_ranges)
                index = torch.as_tensor(index, device=device).expand(shape)[sel]
                v = torch.as_tensor(v).expand(shape)[sel] if torch.as_tensor(v).dim() else v
            index = torch.as_tensor(index, device=device)
            out = _flat(tensors[store.buffer])
            v = torch.as_tensor(v, device=device).to(out.dtype)
            index, v = torch.broadcast_tensors(index, v)
            out[index.reshape(-1)] = v.reshape(-1)

    def indexed_store(self, store, v, tensors, env, accs, shape, device) -> None:
        """A store at offsets the kernel computes (``Store.indexed``), over every element of
        the ranges; ``mode="add"`` sums every value that reaches an element (``index_put_``
        with ``accumulate``), a plain store keeps one of them."""
        out = _flat(tensors[store.buffer])
        index = torch.as_tensor(self.value(store.index, tensors, env, accs, shape), device=device).long()
        v = torch.as_tensor(v, device=device).to(out.dtype)
        index, v = torch.broadcast_tensors(index.expand(shape), v)
        out.index_put_((index.reshape(-1),), v.reshape(-1), accumulate=store.mode == "add")

    @staticmethod
    def scan(kind, v, dtype, shape):
        """A scan's running values over the last dim (one r var), every element: the
        fields of its ``acc`` (cummax/cummin: 0 the index, 1 the value)."""
        v = torch.as_tensor(v).expand(shape)
        if kind == "cumsum":
            return (torch.cumsum(v.to(dtype), -1),)
        if kind == "cumprod":
            return (torch.cumprod(v.to(dtype), -1),)
        if kind == "logcumsumexp":
            return (torch.logcumsumexp(v.to(dtype), -1),)
        if kind in ("cummax", "cummin"):
            values, indices = (torch.cummax if kind == "cummax" else torch.cummin)(v, -1)
            return (indices, values)
        raise NotImplementedError(f"reference target: scan {kind}")

    def reduce(self, kind, v, dtype, nr, shape):
        v = torch.as_tensor(v).expand(shape)
        flat = v.reshape(*shape[:len(shape) - nr], -1)
        if kind == "sum":
            return (flat.to(dtype).sum(-1, keepdim=True),)
        if kind == "prod":
            return (flat.to(dtype).prod(-1, keepdim=True),)
        if kind == "max":
            return (flat.amax(-1, keepdim=True),)
        if kind == "min":
            return (flat.amin(-1, keepdim=True),)
        if kind == "any":
            return (flat.bool().any(-1, keepdim=True),)
        if kind == "all":
            return (flat.bool().all(-1, keepdim=True),)
        if kind in ("argmax", "argmin"):
            fn = torch.argmax if kind == "argmax" else torch.argmin
            idx = fn(flat, -1, keepdim=True)
            return (idx, torch.gather(flat, -1, idx))
        if kind == "welford":
            f = flat.to(torch.float64)
            mean = f.mean(-1, keepdim=True)
            m2 = ((f - mean) ** 2).sum(-1, keepdim=True)
            return (mean.to(dtype), m2.to(dtype), torch.full_like(mean, f.shape[-1]).to(dtype))
        raise NotImplementedError(f"reference target: reduction {kind}")

    @staticmethod
    def load(node: Op, operands, tensors, env):
        """A direct, indirect (its index operand already a tensor of offsets) or masked load.

        A masked load reads only where its mask holds (elsewhere it is 0), like the
        C emitter's ``mask ? ptr[i] : 0``: offsets under a false mask are never used.
        """
        flat = _flat(tensors[load_buffer(node)])
        direct = node.arg[1]
        index = operands[0] if direct is None else eval_index(direct, env)
        index = torch.as_tensor(index).long()
        if load_mask(node) is None:
            return flat[index]
        mask = torch.as_tensor(operands[-1]).bool()
        index, mask = torch.broadcast_tensors(index, mask)
        if flat.numel() == 0:
            return torch.zeros(index.shape, dtype=flat.dtype)
        got = flat[torch.where(mask, index, torch.zeros_like(index))]
        return torch.where(mask, got, torch.zeros((), dtype=got.dtype))

    def value(self, root: Op, tensors, env, accs, shape):
        vals: dict[Op, object] = {}
        nr = len(self.k.reduction_ranges)
        for node in walk(root):
            if (why := illegal(node.op, node.dtype, [c.dtype for c in node.src])) is not None:
                raise NotImplementedError(f"reference target: {why}")
            a = [vals[c] for c in node.src]
            if node.op == OpCode.LOAD:
                vals[node] = self.load(node, a, tensors, env)
            elif node.op == OpCode.CONST:
                vals[node] = torch.tensor(node.arg, dtype=node.dtype)
            elif node.op == OpCode.INDEX:
                vals[node] = torch.as_tensor(eval_index(node.arg, env)).to(node.dtype)
            elif node.op == OpCode.ACC:
                name, field = acc_key(node)
                acc = accs[name][field]
                vals[node] = acc if name in self.scans else acc.reshape(acc.shape[:len(shape) - nr] + (1,) * nr)
            elif node.op == OpCode.CAST:
                vals[node] = torch.as_tensor(a[0]).to(node.dtype)
            elif node.op == OpCode.WHERE:
                vals[node] = torch.where(a[0], a[1], a[2])
            elif node.op in _UNARY:
                vals[node] = _UNARY[node.op](torch.as_tensor(a[0]))
            elif node.op in _BINARY:
                vals[node] = _BINARY[node.op](torch.as_tensor(a[0]), torch.as_tensor(a[1]))
            elif node.op == OpCode.INTRINSIC:
                raise NotImplementedError(f"reference target: op intrinsic {node.arg!r} is a target's own op; "
                                          "the reference evaluates fxwrap's ops only (leave it out of the "
                                          "emitter's intrinsics)")
            else:
                raise NotImplementedError(f"reference target: op {node.op}")
            got = vals[node]
            if isinstance(got, torch.Tensor) and got.dtype != node.dtype and node.op != OpCode.ACC:
                # the IR is legalized (fxwrap.core.numerics): each op, computed by torch over
                # operands of its compute dtype, gives that dtype; nothing is converted here
                raise NotImplementedError(f"reference target: {node.op}.{node.dtype} computed {got.dtype} "
                                          "(the kernel is not legalized)")
        return vals[root]


_DTYPES = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                     torch.int16, torch.int8, torch.uint8, torch.bool})


class ReferenceEmitter(KernelEmitter):
    """Renders a kernel as its loop IR (``format_ssa``); the launcher evaluates it with torch."""

    language = "loop-ir"
    # indexed writes through torch's own index_put_ (accumulate for "add")
    indexed_stores = {"set": _DTYPES, "add": _DTYPES - {torch.bool}}
    # a combo kernel's members evaluated one after another (``ComboLauncher``)
    combo_kernels = ComboLimits(max_members=16, max_arguments=128)

    def render(self, kernel: ScheduledKernel) -> KernelSource:
        names: dict[Op, str] = {}
        lines = [*kernel_header(kernel, "#"),
                 f"ranges={kernel.ranges} reduction_ranges={kernel.reduction_ranges}"]
        for r in kernel.reductions:
            lines += format_ssa([r.value], names)
            lines.append(f"{r.name} = {r.kind}({names[r.value]})")
        for s in kernel.stores:
            lines += format_ssa(list(s.roots()), names)
            lines.append(format_store(s, names))
        text = "\n".join(lines)
        return KernelSource(kernel.name, text, self.language, launch=ReferenceLaunch(kernel=kernel))

    def render_combo(self, kernel: ComboKernel) -> KernelSource:
        text = "\n\n".join([f"# combo kernel {kernel.name}: {len(kernel.members)} members",
                             *(self.render(member).text for member in kernel.members)])
        return KernelSource(kernel.name, text, self.language, launch=ReferenceLaunch(kernel=kernel))

    def load(self, source: KernelSource):
        return launcher_of(source.launch.kernel)

    def saved_loader(self, kernel):
        """The kernel's loop IR (in its launch metadata) is what the reference target runs."""
        return kernel_loader


def kernel_loader(kernel) -> "ReferenceLauncher | ComboLauncher":
    """``fxwrap.Kernel`` loader (picklable): evaluate the kernel's loop IR with torch."""
    return launcher_of(kernel.launch.kernel)


class ComboLauncher:
    """``launcher(*inputs, *outputs, *sizes)`` of a ``ComboKernel``: each member evaluated
    in turn on its own arguments."""

    def __init__(self, kernel: ComboKernel):
        self.members = [(ReferenceLauncher(m), kernel.argument_positions(m)) for m in kernel.members]

    def __call__(self, *args):
        for launcher, positions in self.members:
            launcher(*(args[i] for i in positions))


def launcher_of(kernel: "ScheduledKernel | ComboKernel") -> "ReferenceLauncher | ComboLauncher":
    return ComboLauncher(kernel) if isinstance(kernel, ComboKernel) else ReferenceLauncher(kernel)


kernel_loader.fxwrap_saved = True  # imports the loop IR (fxwrap.ir.loops, sympy), no dynamo
