"""Shared pieces of the null tier: programs, a hand-made kernel, a storage meter.

Importable by name (``import null_helpers``) from the tests and from the fresh
subprocesses they start (with this folder on ``PYTHONPATH``), so that pickles
referring to ``null_helpers.exec_loader`` load there too.

Every program here uses its parameters in order: the GraphModule's inputs come
in the order dynamo first reads them, so this keeps ``gm(*inputs)`` aligned with
``fn(*inputs)``.
"""
from __future__ import annotations

import torch
import torch._dynamo
import torch.fx

import fxwrap
from fxwrap.ir.symbolic import evaluate
from fxwrap.ir.lines import (
    Allocate, Buffer, CallKernel, Comment, DefineKernel, Free, Return, SizeInput, View,
    buffers_defined,
)

F32 = torch.float32
CPU = torch.device("cpu")

# The null tier runs no device compiler: programs are lowered extern-only
# (``kernels=False``) or for the ``reference`` target, whose kernels are
# evaluated with torch ops.
MODES = {"extern": {"options": {"kernels": False}}, "reference": {"target": "reference"}}


def lower(fn, *inputs, mode="extern", options=None, **kwargs):
    """``fxwrap.lower`` without a device compiler (see ``MODES``).

    Resets dynamo first: every ``lower`` call makes a new backend, and dynamo keeps
    one cache entry per backend on the function's code object, so the ninth
    lowering of one function in a process would hit dynamo's recompile limit
    (``test_null_determinism`` checks ``fxwrap.lower`` itself for that).
    """
    torch._dynamo.reset()
    settings = {k: (dict(v) if isinstance(v, dict) else v) for k, v in MODES[mode].items()}
    settings.setdefault("options", {}).update(options or {})
    return fxwrap.lower(fn, *inputs, **settings, **kwargs)

# -- programs ---------------------------------------------------------------------


def mlp(x, w1, b1, w2):
    h = torch.relu(x @ w1 + b1)
    return (h @ w2).softmax(-1)


def mlp_inputs(gen: torch.Generator, batch=8, d_in=16, d_hidden=32, d_out=4):
    return (torch.randn(batch, d_in, generator=gen), torch.randn(d_in, d_hidden, generator=gen),
            torch.randn(d_hidden, generator=gen), torch.randn(d_hidden, d_out, generator=gen))


def views(x):
    t = x.t()
    part = t[1:5, ::2]
    flat = part.reshape(-1)
    return flat * 2, x.transpose(0, 1).contiguous() + 1, t[2], x[:, 3:].sin()


def topk(x):
    values, indices = torch.topk(x, 3)
    return values * 2, indices


def split(x):
    a, b = torch.split(x, 3)
    return a * 2, b.cos()


def mixed_chain(x, w, b):
    """21 ops on 256x256: pointwise, two matmuls, two reductions."""
    y = x.sin()
    y = y @ w
    y = y.exp()
    y = y * 0.5
    y = y + b
    y = y.relu()
    y = y.tanh()
    y = y.cos()
    y = y * y
    y = y.sigmoid()
    s = y.sum(1, keepdim=True)
    y = y / s
    y = y.abs()
    y = y.sqrt()
    y = y - 0.25
    y = y.neg()
    y = y.exp()
    z = y @ w.t()
    z = z.relu()
    z = z + y
    return z.amax(0) * 2


def pointwise_chain(x, b):
    """20 pointwise ops on 256x256: every intermediate dies at the op that reads it.

    Every op here has an out= kernel of its own (``clamp_min``, not ``relu``, whose
    out= overload only copies the functional result: fxwrap calls ``relu`` itself)."""
    y = x.sin()
    y = y.exp()
    y = y * 0.5
    y = y + b
    y = y.clamp_min(0.0)
    y = y.tanh()
    y = y.cos()
    y = y * y
    y = y.sigmoid()
    y = y + 1.0
    y = y.log()
    y = y.abs()
    y = y.sqrt()
    y = y - 0.25
    y = y.neg()
    y = y.exp()
    y = y * 3.0
    y = y.clamp_min(0.0)
    y = y + b
    return y.sigmoid()


# -- a hand-made kernel ------------------------------------------------------------

DOUBLE_PLUS_ONE = "def launch(x, out):\n    out.copy_(x * 2 + 1)\n"


def exec_loader(kernel):
    """Kernel loader: runs the kernel's Python source, returns its ``launch``."""
    namespace: dict = {}
    exec(compile(kernel.source, f"<fxwrap kernel {kernel.name}>", "exec"), namespace)
    return namespace["launch"]


def double_plus_one_kernel() -> fxwrap.Kernel:
    return fxwrap.Kernel(
        "double_plus_one", DOUBLE_PLUS_ONE, target="cpu",
        signature=(fxwrap.KernelArg("x", "input"), fxwrap.KernelArg("out", "output")),
        launch={"extra": {"threads": 1}}, loader=exec_loader)


def kernel_program(kernel=None):
    """``inputs, lines`` of a hand-made program computing ``((2x+1).t()*2+1)[1:3]``.

    ``x`` is 4x6: the kernel writes buf0 = 2x+1, buf1 views buf0 transposed, the
    kernel writes buf2 = 2*buf1+1 (6x4), buf3 views rows 1..2 of buf2 (offset 4).
    """
    kernel = kernel or double_plus_one_kernel()
    x = Buffer("arg0", (4, 6), (6, 1), F32, CPU)
    buf0 = Buffer("buf0", (4, 6), (6, 1), F32, CPU)
    buf1 = Buffer("buf1", (6, 4), (1, 6), F32, CPU)
    buf2 = Buffer("buf2", (6, 4), (4, 1), F32, CPU)
    buf3 = Buffer("buf3", (2, 4), (4, 1), F32, CPU, offset=4)
    lines = [
        DefineKernel(kernel),
        Comment("first: double_plus_one(arg0)"),
        Allocate(buf0),
        CallKernel(kernel, (x, buf0), grid=(24,)),
        Comment("t: transpose"),
        View(buf1, buf0),
        Allocate(buf2),
        CallKernel(kernel, (buf1, buf2), grid=(24,)),
        Free(buf0),
        Comment("rows: slice 1..3"),
        View(buf3, buf2),
        Return((buf3,)),
    ]
    return [x], lines


def kernel_program_eager(x):
    return (((x * 2 + 1).t() * 2 + 1)[1:3],)


# -- inputs for a GraphModule --------------------------------------------------------


def graph_args(program_inputs, tensors):
    """Arguments for a GraphModule whose inputs are ``program_inputs``.

    ``tensors`` are the tensor inputs in order; each size input takes its value
    from the first tensor dimension whose size is exactly that symbol.
    """
    tensor_inputs = [i for i in program_inputs if isinstance(i, Buffer)]
    assert len(tensor_inputs) == len(tensors)
    values = {}
    for buf, t in zip(tensor_inputs, tensors):
        for expr, n in zip(buf.size, t.shape):
            values.setdefault(expr, n)
    it = iter(tensors)
    return [values[i.symbol] if isinstance(i, SizeInput) else next(it) for i in program_inputs]


def buffers_by_name(program_inputs, lines) -> dict[str, Buffer]:
    found = {i.name: i for i in program_inputs if isinstance(i, Buffer)}
    for line in lines:
        for buf in buffers_defined(line):
            found[buf.name] = buf
    return found


def layout_at(buf: Buffer, hints) -> tuple:
    return (tuple(evaluate(n, hints) for n in buf.size), tuple(evaluate(s, hints) for s in buf.stride),
            evaluate(buf.offset, hints), buf.dtype, buf.device)


def fake_layout(fake) -> tuple:
    return (tuple(int(n) for n in fake.shape), tuple(int(s) for s in fake.stride()),
            int(fake.storage_offset()), fake.dtype, fake.device)


# -- measuring live storage -------------------------------------------------------------


class StoragePeak(torch.fx.Interpreter):
    """Runs a GraphModule and records the peak bytes of live storages it owns.

    After each node (and after the Interpreter drops the values whose last use
    was that node, as the generated code does) it sums ``untyped_storage().nbytes()``
    over the distinct storages of the values still held, leaving out storages of
    graph inputs and constants.  A value no node reads is dropped right after it
    is made, as the generated code does (``mm_out = None``).
    """

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.peak = 0
        self.profile: list[tuple[str, int]] = []
        self.external: set[int] = set()

    def run(self, *args, **kwargs):
        owned_elsewhere = [a for a in args if isinstance(a, torch.Tensor)]
        owned_elsewhere += list(self.module.buffers()) + list(self.module.parameters())
        self.external = {t.untyped_storage().data_ptr() for t in owned_elsewhere}
        self.peak = 0
        self.profile = []
        return super().run(*args, **kwargs)

    def run_node(self, n):
        result = super().run_node(n)
        dying = set(self.user_to_last_uses.get(n, ()))
        held = [v for node, v in self.env.items() if node not in dying and node.users]
        held.append(result)
        storages: dict[int, int] = {}

        def visit(v):
            if isinstance(v, torch.Tensor):
                storage = v.untyped_storage()
                if storage.data_ptr() not in self.external:
                    storages[storage.data_ptr()] = storage.nbytes()
            elif isinstance(v, (list, tuple)):
                for item in v:
                    visit(item)

        for v in held:
            visit(v)
        total = sum(storages.values())
        self.profile.append((n.name, total))
        self.peak = max(self.peak, total)
        return result


def assert_close_all(got, expected, **tol):
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, **tol)
