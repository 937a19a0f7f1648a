"""A new kind of Wrapper IR line is one class: printing, memory planning, FX conversion
(and the other passes) ask the line, so the two lines below work without any change to
fxwrap.

Program (``arg0`` a 6x5 float input)::

    buf0 = empty_strided((6, 5), (5, 1), dtype=torch.float32, device='cpu')
    aten.sin.out(arg0, out=buf0)
    buf1 = empty_strided((6, 5), (5, 1), dtype=torch.float32, device='cpu')
    aten.cos.out(arg0, out=buf1)
    # axpy: 2 * sin(x) + cos(x)
    buf2 = axpy(2.0, buf0, buf1)          <- Axpy: reads buf0, buf1; defines buf2
    free(buf0)                            <- planned from Axpy.reads()
    free(buf1)
    scale_(buf2, 3.0)                     <- ScaleInPlace: reads and writes buf2
    return (buf2,)

Were ``Axpy.reads()`` to miss ``buf0``, the planner would see ``buf0`` dead after the
``sin`` and hand its storage to ``buf1``: the ``cos`` would overwrite it and the numbers
would be wrong, which ``test_a_new_line_plans_prints_and_runs`` checks against eager.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch

from fxwrap.core.memory import plan_memory
from fxwrap.wrapper_ir.partitions import partition_for_capture
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.ir.lines import Allocate, Buffer, CallExtern, Comment, Free, Line, Return, Reuse
from fxwrap.wrapper_ir.printer import program_source

aten = torch.ops.aten
F32 = torch.float32


@dataclass(frozen=True)
class Axpy(Line):
    """``out = axpy(a, x, y)``: ``a * x + y`` into new storage of its own."""

    out: Buffer
    a: float
    x: Buffer
    y: Buffer

    def reads(self):
        return [self.x, self.y]

    def defines(self):
        return [self.out]

    def writes(self):
        return [self.out]

    def to_source(self, printer):
        return f"{self.out.name} = axpy({printer.call((self.a, self.x, self.y))})"

    def to_fx(self, converter):
        node = converter.add(torch.add, (converter.node(self.y), converter.node(self.x)),
                             {"alpha": self.a}, name=self.out.name, buf=self.out)
        converter.bind(self.out, node)


@dataclass(frozen=True)
class ScaleInPlace(Line):
    """``scale_(buf, factor)``: multiplies ``buf`` in place."""

    buf: Buffer
    factor: float

    def reads(self):
        return [self.buf]

    def writes(self):
        return [self.buf]

    def to_source(self, printer):
        return f"scale_({printer.call((self.buf, self.factor))})"

    def to_fx(self, converter):
        converter.add(aten.mul_.Scalar, (converter.node(self.buf), self.factor))


def _program(device=torch.device("cpu")):
    buf = lambda name: Buffer(name, (6, 5), (5, 1), F32, device)  # noqa: E731
    arg0, buf0, buf1, buf2 = buf("arg0"), buf("buf0"), buf("buf1"), buf("buf2")
    lines = [
        Allocate(buf0), CallExtern(aten.sin.out, (arg0,), (("out", buf0),)),
        Allocate(buf1), CallExtern(aten.cos.out, (arg0,), (("out", buf1),)),
        Comment("axpy: 2 * sin(x) + cos(x)"),
        Axpy(buf2, 2.0, buf0, buf1),
        ScaleInPlace(buf2, 3.0),
        Return((buf2,)),
    ]
    return [arg0], lines


def test_a_new_line_plans_prints_and_runs():
    inputs, lines = _program()
    plan = plan_memory(lines)
    assert not any(isinstance(line, Reuse) for line in plan.lines), plan.lines  # buf0 is read by the Axpy
    assert program_source(inputs, plan.lines) == """\
def forward(arg0):
    buf0 = empty_strided((6, 5), (5, 1), dtype=torch.float32, device='cpu')
    aten.sin.out(arg0, out=buf0)
    buf1 = empty_strided((6, 5), (5, 1), dtype=torch.float32, device='cpu')
    aten.cos.out(arg0, out=buf1)
    # axpy: 2 * sin(x) + cos(x)
    buf2 = axpy(2.0, buf0, buf1)
    free(buf0)
    free(buf1)
    scale_(buf2, 3.0)
    return (buf2,)
"""
    # peak: buf0, buf1 and the Axpy's own buf2 are live together at the Axpy
    assert plan.peak_bytes == 3 * 6 * 5 * 4

    gm = to_graph_module(inputs, plan.lines)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["buf2"].target is torch.add and nodes["buf2"].kwargs == {"alpha": 2.0}
    assert nodes["buf2"].meta["comment"] == "axpy: 2 * sin(x) + cos(x)"
    assert tuple(nodes["buf2"].meta["val"].shape) == (6, 5)
    assert [n.args[0].name for n in gm.graph.nodes if n.name.startswith("free")] == ["buf0", "buf1"]

    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(16))
    want = (2 * torch.sin(x) + torch.cos(x)) * 3
    (got,) = gm(x)
    torch.testing.assert_close(got, want)
    (again,) = pickle.loads(pickle.dumps(gm))(x)  # a plain FX graph: pickles like any other
    torch.testing.assert_close(again, want)


def test_new_lines_are_frozen_hashable_and_picklable():
    _, lines = _program()
    axpy, scale = lines[5], lines[6]
    assert pickle.loads(pickle.dumps(axpy)) == axpy and hash(axpy) == hash(Axpy(*vars(axpy).values()))
    assert len({axpy, scale, axpy}) == 2
    try:
        scale.factor = 1.0
    except AttributeError:
        pass
    else:
        raise AssertionError("a line must stay frozen")


def test_a_new_line_on_another_device_gets_a_plain_partition():
    """Graph capture's partition pass asks any line (``Line.capture_refusal``: its ``reads()``
    and ``defines()`` on the device), not only kernel launches and externs; a write into an
    input is captured like any other."""
    cuda = torch.device("cuda", 0)
    inputs, lines = _program(cuda)
    lines.insert(-1, ScaleInPlace(inputs[0], 0.5))
    boundaries = [line for line in partition_for_capture("cuda")(lines) if type(line).__name__ == "PartitionBoundary"]
    assert [(b.index, b.capture) for b in boundaries] == [(0, True)]
    cpu_buf = Buffer("arg9", (6, 5), (5, 1), F32, torch.device("cpu"))
    lines.insert(-1, ScaleInPlace(cpu_buf, 2.0))
    boundaries = [line for line in partition_for_capture("cuda")(lines) if type(line).__name__ == "PartitionBoundary"]
    assert [(b.index, b.capture, b.reason) for b in boundaries] == [
        (0, True, ""), (1, False, "ScaleInPlace uses arg9 on cpu, not on the cuda device")]


def test_default_line_touches_nothing():
    @dataclass(frozen=True)
    class Note(Line):
        text: str

    line = Note("x")
    assert (line.reads(), line.writes(), line.defines(), line.size_exprs()) == ([], [], [], [])
    assert line.fusion_barrier and not line.allocates and line.view_base is None
    plan = plan_memory([Note("x"), Return(())])
    assert plan.lines == [Note("x"), Return(())] and not any(isinstance(li, Free) for li in plan.lines)


def test_zero_fill_of_a_reused_workspace_zeroes_it():
    """``ZeroFill`` (a workspace its kernel needs zeroed) survives the planner's reuse of a
    dead buffer's storage: the reused storage holds the sin values until the fill."""
    from fxwrap.ir.lines import ZeroFill
    cpu = torch.device("cpu")
    arg0, buf0, ws1, buf2 = (Buffer(n, (6, 5), (5, 1), F32, cpu) for n in ("arg0", "buf0", "ws1", "buf2"))
    lines = [Allocate(buf0), CallExtern(aten.sin.out, (arg0,), (("out", buf0),)),
             Allocate(buf2), CallExtern(aten.cos.out, (arg0,), (("out", buf2),)),
             CallExtern(aten.add_.Tensor, (buf2, buf0)),
             Allocate(ws1), ZeroFill(ws1), CallExtern(aten.add_.Tensor, (buf2, ws1)),
             Return((buf2,))]
    plan = plan_memory(lines)
    text = program_source([arg0], plan.lines)
    assert "ws1 = buf0  # reuse" in text and "zero_(ws1)" in text, text
    gm = to_graph_module([arg0], plan.lines)
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(18))
    (got,) = gm(x)
    torch.testing.assert_close(got, torch.cos(x) + torch.sin(x))  # plus the zeros
    assert any(n.target is aten.zero_.default for n in gm.graph.nodes)


# getattr reads of a line member that are not reads of a line (a Kernel's, a target's, a guard's)
# (``getattr(self.<attr>, ...)`` is never a line's member read by a pass: not listed)
_NOT_LINE_READS = {
    ("fxwrap/plugins/debug_modes.py", "getattr(launch, 'target', None)"),  # an FX node's target
    ("fxwrap/wrapper_ir/guards.py", "getattr(guard, 'expr', guard)"),
    ("fxwrap/wrapper_ir/guards.py", "getattr(inp, 'name', str(inp))"),
    ("fxwrap/programs/artifacts.py", "getattr(program, 'capture', None)"),  # a LoadedProgram's recording facts
    ("fxwrap/profiling.py", "getattr(backend, 'kwargs', None)"),  # dynamo's backend wrapper
    ("fxwrap/programs/cache_key.py", "getattr(getattr(options, f.name), 'name', getattr(options, f.name))"),  # options
}


def _line_classes():
    import fxwrap.ir.collectives  # noqa: F401  (every line module, so every subclass is seen)
    import fxwrap.ir.control_flow  # noqa: F401
    import fxwrap.ir.user_kernels  # noqa: F401
    import fxwrap.wrapper_ir.debug_lines  # noqa: F401
    found, todo = [], [Line]
    while todo:
        cls = todo.pop()
        found += cls.__subclasses__()
        todo += cls.__subclasses__()
    return found


def test_every_line_member_read_with_getattr_is_declared_on_the_base():
    """A pass that asks ``getattr(line, "kernel", None)`` relies on a member only some lines
    have: each such member (``kernel``, ``programs``, ``src``, ``op``, ``scratch``,
    ``issues_collective``, ``waits_collective``) is declared on ``Line`` with its neutral value,
    so the passes read it plainly and a new line type sees what it may override."""
    import ast
    import dataclasses
    from pathlib import Path

    import fxwrap
    for name in ("kernel", "programs", "src", "op", "scratch", "issues_collective", "waits_collective"):
        assert hasattr(Line, name), name
    members = set()
    for cls in _line_classes():
        members |= {f.name for f in dataclasses.fields(cls)} | {k for k in vars(cls) if not k.startswith("_")}
    undeclared = members - set(dir(Line))
    root = Path(fxwrap.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = str(Path("fxwrap") / path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and node.args[1].value in undeclared
                    and not ast.unparse(node.args[0]).startswith("self.")
                    and (rel, ast.unparse(node)) not in _NOT_LINE_READS):
                bad.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "line members read with getattr, undeclared on Line:\n  " + "\n  ".join(bad)
    # the neutral values
    assert Line().kernel is None and Line().programs == () and Line().scratch() == []
    assert not Line().issues_collective and not Line().waits_collective and Line().op is None
