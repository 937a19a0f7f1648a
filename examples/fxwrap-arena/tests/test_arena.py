"""The ``arena`` target against eager, and its arena plan against fxwrap's memory plan.

Every test draws fresh random inputs and checks numbers; plan checks assert the
layout (no two storages alive at once share a byte) and the peak accounting.
"""
import copy
import itertools
import random

import pytest
import sympy
import torch

import fxwrap
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, CallKernel, DefineKernel, Free, Return, Reuse, SizeInput, View,
)
from fxwrap_arena.wrapper import ArenaProgram, ArenaWrapper, first_fit

aten = torch.ops.aten


class Block(torch.nn.Module):
    """Pre-norm transformer block: attention (written out) and an MLP."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))


def compiled(model, programs, dynamic=None, target="arena"):
    torch._dynamo.reset()
    if isinstance(target, fxwrap.Target):
        return torch.compile(model, backend=fxwrap.Backend(target, {"on_program": programs.append}), dynamic=dynamic)
    return torch.compile(model, backend="fxwrap", dynamic=dynamic,
                         options={"target": target, "on_program": programs.append})


def check_layout(plan, align=64):
    """No two storages alive at the same node share a byte; all inside the arena, aligned."""
    for (name, (off, nbytes, first, last)) in plan.offsets.items():
        assert off % align == 0 and off + nbytes <= plan.arena_bytes, name
    for (a, (oa, na, fa, la)), (b, (ob, nb, fb, lb)) in itertools.combinations(plan.offsets.items(), 2):
        if fa <= lb and fb <= la and na and nb:
            assert oa + na <= ob or ob + nb <= oa, f"{a} and {b} overlap in the arena while both alive"
    assert plan.arena_peak <= plan.arena_bytes


def check_training(model, shapes, dynamic=None, target="arena"):
    ref = copy.deepcopy(model)
    programs = []
    fn = compiled(model, programs, dynamic, target)
    for i, shape in enumerate(shapes):
        x = torch.randn(*shape)
        out = fn(x)
        grad = torch.randn_like(out)
        out.backward(grad)
        if i == 0:  # sizes == the programs' hints: the plan's peak is the memory plan's
            for p in programs:
                assert isinstance(p.runner, ArenaProgram)
                check_layout(p.runner.last)
                assert p.runner.last.peak_bytes == p.peak_bytes, p.kind
        want = ref(x)
        want.backward(grad)
        torch.testing.assert_close(out, want)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
            p.grad = q.grad = None
    assert sorted(p.kind for p in programs) == ["backward", "forward"]  # one compile for all shapes
    return programs


def test_registered_through_entry_point():
    manager = fxwrap.get_plugin_manager()
    target = manager.target("arena")
    assert target.wrapper is ArenaWrapper and target.device_type == "cpu"
    assert "fxwrap_arena.plugin" in manager.owner["arena"]
    assert manager.target_for_device("cpu").name == "cpu"  # lower priority: only by name


def test_mlp_forward_backward():
    torch.manual_seed(0)
    programs = check_training(mlp(), [(16, 32), (16, 32)])
    # Only out= externs: every storage is an empty_strided node (in the arena, or an output).
    assert all(n.target is torch.empty_strided for p in programs for n in p.runner.life)
    backward = next(p for p in programs if p.kind == "backward").runner
    assert backward.last.arena_bytes > 0 and len(backward.plans) == 1  # same arena both calls


def test_transformer_block():
    torch.manual_seed(1)
    programs = check_training(Block(), [(2, 8, 32), (2, 8, 32)])
    assert all(p.runner.last.offsets for p in programs)
    # The arena runs both kinds of launch: generated kernels and ATen externs (the matmuls).
    for p in programs:
        assert any(isinstance(line, CallKernel) for line in p.lines), p.code()
        assert any(isinstance(line, CallExtern) and "mm" in str(line.op) for line in p.lines), p.code()


def test_dynamic_mlp_training():
    torch.manual_seed(2)
    programs = check_training(mlp(), [(8, 32), (13, 32), (5, 32)], dynamic=True)
    assert all(any(isinstance(i, SizeInput) for i in p.inputs) for p in programs)


def test_dynamic_transformer_inference():
    torch.manual_seed(3)
    model, programs = Block(), []
    fn = compiled(model, programs, dynamic=True)
    with torch.no_grad():
        for t in (8, 12, 5, 12):
            x = torch.randn(3, t, 32)
            torch.testing.assert_close(fn(x), model(x))
            check_layout(programs[0].runner.last)
    assert [p.kind for p in programs] == ["inference"]
    assert len(programs[0].runner.plans) == 2  # t=12 grew the arena; t=5 fits in it; t=12 is cached


def _double(kernel):
    return lambda x, y, n: y.copy_(2 * x)


def test_kernels_views_and_reuse_in_arena():
    """A hand-built program: kernel launches, an offset view, a reuse with a new layout."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    cpu, f32 = torch.device("cpu"), torch.float32
    kernel = fxwrap.Kernel("double", "y[i] = 2 * x[i]", "cpu", loader=_double, signature=(
        fxwrap.KernelArg("x", "input"), fxwrap.KernelArg("y", "output"), fxwrap.KernelArg("n", "size")))
    arg0 = Buffer("arg0", (s0, 16), (16, 1), f32, cpu)
    buf0 = Buffer("buf0", (s0, 16), (16, 1), f32, cpu)
    buf1 = Buffer("buf1", (s0, 16), (16, 1), f32, cpu)
    buf2 = Buffer("buf2", (s0, 8), (8, 1), f32, cpu)
    buf3 = Buffer("buf3", (s0, 8), (16, 1), f32, cpu, sympy.Integer(8))
    buf4 = Buffer("buf4", (s0, 8), (8, 1), f32, cpu)
    lines = [
        DefineKernel(kernel),
        Allocate(buf0), CallKernel(kernel, (arg0, buf0, 16 * s0)),
        Allocate(buf1), CallExtern(aten.sin.out, (buf0,), (("out", buf1),)),
        Reuse(buf0, buf2), View(buf3, buf1), CallExtern(aten.cos.out, (buf3,), (("out", buf2),)),
        Free(buf1),
        Allocate(buf4), CallKernel(kernel, (buf2, buf4, 8 * s0)), Free(buf2),
        Return((buf4,)),
    ]
    gm = to_graph_module([arg0, SizeInput(s0, 4)], lines)
    assert any(isinstance(n.target, fxwrap.Kernel) for n in gm.graph.nodes)
    run = ArenaWrapper(fxwrap.get_plugin_manager().target("arena")).compile_graph(gm)
    gm.forward = None  # the arena program never calls it
    for rows in (4, 7, 3):
        x = torch.randn(rows, 16)
        (out,) = run(x, rows)
        torch.testing.assert_close(out, 2 * torch.cos(torch.sin(2 * x)[:, 8:]))
        plan = run.last
        check_layout(plan)
        assert sorted(plan.offsets) == ["buf0", "buf1"]  # buf4 is the output: not in the arena
        # buf0 (then buf2 in its storage) and buf1 overlap in time; the output comes after buf1 dies
        assert plan.arena_bytes == plan.arena_peak == plan.peak_bytes == 2 * rows * 16 * 4
    assert len(run.plans) == 2  # rows=7 grew the arena (dropping the rows=4 plan); rows=3 fits in it


def test_arena_kernels_have_their_own_flavour():
    """ArenaEmitter (a CppEmitter subclass) renders every kernel: its prologue comment and
    its ``arena_tanh`` appear in the sources, and launches read and write arena views."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(approximate="tanh"),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 16))
    programs = check_training(model, [(8, 32), (13, 32)], dynamic=True)
    kernels = [n.target for p in programs for n in p.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert kernels and all("// arena kernel (alignment 64)" in k.source for k in kernels)
    assert any("arena_tanh(" in k.source for k in kernels)
    # the forward's intermediates all fuse away (what it stores is saved for the backward)
    assert any(p.runner.last.offsets for p in programs)


def test_first_fit_random_blocks():
    rng = random.Random(4)
    for _ in range(50):
        blocks = []
        for key in range(rng.randrange(1, 12)):
            first = rng.randrange(0, 20)
            blocks.append((key, rng.randrange(0, 300), first, first + rng.randrange(0, 8)))
        offsets, total = first_fit(blocks, 16)
        live = max(sum(-(-n // 16) * 16 for _, n, f, l in blocks if f <= t <= l) for t in range(30))
        assert live <= total <= sum(-(-n // 16) * 16 for _, n, _, _ in blocks)
        for (a, na, fa, la), (b, nb, fb, lb) in itertools.combinations(blocks, 2):
            if fa <= lb and fb <= la and na and nb:
                assert offsets[a] + na <= offsets[b] or offsets[b] + nb <= offsets[a]


def _add_rows_mean(x, y):
    return torch.add(y, x, alpha=2).mean(1, keepdim=True)


def test_wrong_inputs_are_named_before_the_arena_is_planned():
    """The arena runner plans its arena from the size inputs before it runs the program; a
    Python scalar (or None, or a tensor of lower rank) where the program reads a tensor's
    sizes, given to ``run`` or the runner itself, is an ``InputMismatchError`` naming the
    input, not a TypeError from the plan (fuzz seeds 940670, 940700, 940750, 940830)."""
    gen = torch.Generator().manual_seed(940670)
    x = torch.randn(4, 8, generator=gen).to(torch.bfloat16)
    y = torch.randn(40, generator=gen).to(torch.bfloat16)[3:35].view(4, 8)
    program = fxwrap.lower(_add_rows_mean, x, y, target="arena", dynamic=True)
    assert isinstance(program.runner, ArenaProgram)
    x2 = torch.randn(6, 8, generator=gen).to(torch.bfloat16)
    y2 = torch.randn(60, generator=gen).to(torch.bfloat16)[5:53].view(6, 8)
    torch.testing.assert_close(program.run(x2, y2), _add_rows_mean(x2, y2))
    for bad, shown in ((1.5, "float 1.5"), (2, "int 2")):
        reads = rf"y \(argument 1\) must be a tensor \(the program reads its size symbol s\d+ = y\.\S+\)"
        with pytest.raises(fxwrap.InputMismatchError, match=rf"{reads}, got {shown}"):
            program.run(x2, bad)
    with pytest.raises(fxwrap.InputMismatchError, match=r"y \(argument 1\) has 1 dimensions"):
        program.run(x2, y2[0])
    graph_inputs = program.arguments((x2, y2))
    sizes = [i for i, value in enumerate(graph_inputs) if not isinstance(value, torch.Tensor)]
    for i in sizes:  # the graph's own inputs, a size wrong: the guard names it before the plan reads it
        bad = list(graph_inputs)
        bad[i] = None
        with pytest.raises(fxwrap.InputMismatchError, match="must be an int, got None"):
            program(*bad)
    torch.testing.assert_close(program(*graph_inputs)[0], _add_rows_mean(x2, y2))
