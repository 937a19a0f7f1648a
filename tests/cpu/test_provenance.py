"""Provenance to the source line (issue 15): every kernel and extern call names the ATen
nodes it computes, the user's file:line and module path; printed on the right line; kernel
headers list them; the binary cache ignores them; output is deterministic.

Runs on the cpu, reference and triton-interpret targets."""
from __future__ import annotations

import os

import pytest
import torch

import fxwrap
import fxwrap.api
from fxwrap.ir.loops import ScheduledKernel
from fxwrap.runtime.kernel import Kernel
from fxwrap.testing.suite import fresh_state as _fresh_state
from fxwrap.wrapper_ir.fx import annotated_code
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.runtime.provenance import Origin, describe, module_path, origin_of, user_frame

fresh_state = pytest.fixture(autouse=True)(_fresh_state)

HERE = os.path.basename(__file__)
TARGETS = ["cpu", "reference", "triton-interpret"]

exp_mm_relu = lambda x, w: (torch.exp(x) @ w).relu() * 2  # noqa: E731
EXP_MM_RELU_LINE = exp_mm_relu.__code__.co_firstlineno


class LinearGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x)) * 2


LINEAR_GELU_LINE = LinearGelu.forward.__code__.co_firstlineno + 1  # the return line


def _skip_without(target):
    if target == "triton-interpret":
        pytest.importorskip("triton")
        pytest.importorskip("numpy")


def _lower_recording(monkeypatch, fn, *inputs, **kwargs):
    """``fxwrap.lower`` that also returns the ATen graph of each program, by kind."""
    graphs = {}
    compile_graph = fxwrap.api.compile_aten_graph

    def recording(gm, target, kind="inference", options=None, **kwargs):
        graphs[kind] = [(n.name, n.target) for n in gm.graph.nodes if n.op == "call_function"]
        return compile_graph(gm, target, kind, options, **kwargs)

    monkeypatch.setattr(fxwrap.api, "compile_aten_graph", recording)
    return fxwrap.lower(fn, *inputs, **kwargs), graphs


def _calls(program):
    return [line for line in program.lines if isinstance(line, (CallKernel, CallExtern))]


def _check_structure(program, aten_nodes):
    """Every computing ATen node is named by exactly the calls that compute it; memory lines
    carry nothing; the FX nodes carry their line's origins; code() prints them above the call."""
    named = {o.node for line in _calls(program) for o in line.origins}
    computing = {name for name, target in aten_nodes if isinstance(target, torch._ops.OpOverload)}
    # every origin is a node of the ATen graph; every ATen op that is not a pure view is named
    assert named <= computing, named - computing
    views = {name for name, target in aten_nodes if "view" in str(target) or "permute" in str(target)
             or "expand" in str(target) or str(target).startswith("aten.t.")}
    assert computing - views <= named, computing - views - named
    for line in program.lines:
        if not isinstance(line, (CallKernel, CallExtern)):
            assert not line.origins, line
    by_line = {}
    for node in program.graph_module.graph.nodes:
        if node.meta.get("fxwrap_origins"):
            by_line.setdefault(node.meta["fxwrap_origins"], []).append(node)
            assert isinstance(node.target, (Kernel, torch._ops.OpOverload)), node.format_node()
        if node.target in (torch.empty_strided, torch.as_strided, fxwrap.runtime.free):
            assert "fxwrap_origins" not in node.meta and "stack_trace" not in node.meta, node.format_node()
    for line in _calls(program):
        if line.origins:
            assert by_line.get(line.origins), line
    code = program.code().split("\n")
    for i, text in enumerate(code):
        if text.strip().startswith("# ") and "(" in text and HERE in text:
            call = code[i + 1].strip()
            assert not call.startswith(("buf", "free(", "#")) or "aten." in call, (text, call)
            assert "empty_strided" not in call and "as_strided" not in call, (text, call)


@pytest.mark.parametrize("target", TARGETS)
def test_fused_program_names_its_aten_nodes_and_this_line(monkeypatch, target):
    _skip_without(target)
    x, w = torch.randn(4, 8), torch.randn(8, 4)
    program, graphs = _lower_recording(monkeypatch, exp_mm_relu, x, w, target=target)
    torch.testing.assert_close(program.run(x, w), exp_mm_relu(x, w))
    _check_structure(program, graphs["inference"])
    kernels = [line for line in program.lines if isinstance(line, CallKernel)]
    by_first = {line.origins[0].node: line for line in kernels}
    assert [o.node for o in by_first["exp"].origins] == ["exp"]
    assert [(o.node, o.target) for o in by_first["relu"].origins] == [("relu", "aten.relu.default"),
                                                                       ("mul", "aten.mul.Tensor")]
    (mm,) = [line for line in program.lines if isinstance(line, CallExtern) and line.origins]
    assert [(o.node, o.target) for o in mm.origins] == [("mm", "aten.mm.default")]
    for line in _calls(program):
        for o in line.origins:
            assert (o.location, o.function, o.module_path) == (f"{HERE}:{EXP_MM_RELU_LINE}", "<lambda>", None)
            assert o.file == __file__
    # the kernel's source opens with the same list
    comment = "//" if target == "cpu" else "#"
    source = by_first["relu"].kernel.source
    header = source[:source.index("ranges")]
    assert f"{comment} from: relu, mul (aten.relu.default, aten.mul.Tensor)\n" in header
    assert f"{comment}   {HERE}:{EXP_MM_RELU_LINE} in <lambda>\n" in header
    # program.code() and the FX code print the origins right above their call
    code = program.code()
    assert f"# relu, mul ({HERE}:{EXP_MM_RELU_LINE} in <lambda>)\n    {by_first['relu'].kernel.name}(" in code
    assert f"# mm ({HERE}:{EXP_MM_RELU_LINE} in <lambda>)\n    aten.mm" in code
    fx_code = annotated_code(program.graph_module)
    assert f"# exp ({HERE}:{EXP_MM_RELU_LINE} in <lambda>)\n    {by_first['exp'].kernel.name} = " in fx_code


@pytest.mark.parametrize("target", TARGETS)
def test_module_paths_and_lines_of_a_linear_gelu_module(monkeypatch, target):
    _skip_without(target)
    model = LinearGelu()
    x = torch.randn(4, 8)
    program, graphs = _lower_recording(monkeypatch, model, x, target=target)
    with torch.no_grad():
        torch.testing.assert_close(program.run(x), model(x))
    _check_structure(program, graphs["inference"])
    origins = [o for line in _calls(program) for o in line.origins]
    assert {o.location for o in origins} == {f"{HERE}:{LINEAR_GELU_LINE}"}
    assert {o.function for o in origins} == {"forward"}
    paths = {o.node: o.module_path for o in origins}
    assert paths["addmm"] == "fc"
    gelu_nodes = [name for name, target_ in graphs["inference"]
                  if name.startswith(("gelu", "mul")) and name != "addmm"]
    assert {paths[n] for n in gelu_nodes if n in paths} == {"act", None}  # the GELU; the final * 2 in none
    (gelu_kernel,) = [line for line in program.lines if isinstance(line, CallKernel)]
    assert [o.node for o in gelu_kernel.origins] == [n for n, _ in graphs["inference"]
                                                     if n in {o.node for o in gelu_kernel.origins}]  # program order
    assert [o.node for o in gelu_kernel.origins] == ["gelu", "mul"]  # GELU lowered whole, then the * 2


def test_backward_kernels_name_the_forward_line_and_module(monkeypatch):
    model = LinearGelu()
    x = torch.randn(4, 8, requires_grad=True)
    programs, graphs = _lower_recording(monkeypatch, model, x, training=True, target="cpu")
    backward = programs.backward
    _check_structure(backward, graphs["backward"])
    origins = [o for line in _calls(backward) for o in line.origins]
    assert origins and {o.location for o in origins} == {f"{HERE}:{LINEAR_GELU_LINE}"}
    assert {o.module_path for o in origins} >= {"fc", "act"}  # from fwd_nn_module_stack


def test_same_program_compiles_to_the_same_bytes():
    x, w = torch.randn(4, 8), torch.randn(8, 4)
    first = fxwrap.lower(exp_mm_relu, x, w, target="cpu")
    torch._dynamo.reset()
    second = fxwrap.lower(exp_mm_relu, x, w, target="cpu")
    assert first.code() == second.code()
    assert annotated_code(first.graph_module) == annotated_code(second.graph_module)
    sources = lambda p: [line.kernel.source for line in p.lines if isinstance(line, CallKernel)]  # noqa: E731
    assert sources(first) == sources(second) and sources(first)


def test_the_binary_cache_ignores_the_source_line():
    from fxwrap.targets.host.compiler import default_compiler

    one = lambda x: torch.sigmoid(x) * 3  # noqa: E731
    two = lambda x: torch.sigmoid(x) * 3  # noqa: E731  (the same kernel, from the next line)
    x = torch.randn(16)
    a = fxwrap.lower(one, x, target="cpu")
    b = fxwrap.lower(two, x, target="cpu")
    (ka,), (kb,) = ([line.kernel for line in p.lines if isinstance(line, CallKernel)] for p in (a, b))
    assert ka.source != kb.source  # the headers name their own lines
    assert f"{HERE}:{one.__code__.co_firstlineno}" in ka.source
    assert f"{HERE}:{two.__code__.co_firstlineno}" in kb.source
    compiler = default_compiler()
    assert compiler.key(ka.source) == compiler.key(kb.source)
    assert compiler.key(ka.source) != compiler.key(ka.source.replace("* 3", "* 4").replace("3.0f", "4.0f"))
    torch.testing.assert_close(b.run(x), one(x))


def test_origin_of_reads_stack_trace_and_module_stack():
    trace = ('  File "/home/me/model.py", line 41, in forward\n    return self.fc(x)\n'
             '           ^^^^^^^^^^\n')
    assert user_frame(trace) == ("/home/me/model.py", 41, "forward")
    assert user_frame(None) is None
    assert module_path({"a": ("L['self'].layers[0]._modules['mlp'].fc1", object)}) == "layers.0.mlp.fc1"
    assert module_path({"a": ("L['self'].layers.0", object), "b": ("L['self'].layers.0.mlp", object)}) == \
        "layers.0.mlp"
    assert module_path(None) is None

    class FakeNode:
        name = "mul_3"
        target = torch.ops.aten.mul.Tensor
        meta = {"stack_trace": trace, "fwd_nn_module_stack": {"x": ("L['self'].blocks['a']", object)}}

    o = origin_of(FakeNode())
    assert o == Origin("mul_3", "aten.mul.Tensor", "model.py:41", "forward", "blocks.a", "/home/me/model.py")
    assert describe((o, Origin("add_2", "aten.add.Tensor", "model.py:41", "forward", "blocks.a"))) == \
        "mul_3, add_2 (model.py:41 in forward, blocks.a)"
    assert describe(()) == "(no ATen origin recorded)"


def test_scheduled_kernel_origins_are_origins():
    x = torch.randn(4, 8)
    seen: list[ScheduledKernel] = []
    program = fxwrap.lower(lambda t: torch.softmax(t, -1) + 1, x, target="cpu")
    for line in program.lines:
        if isinstance(line, CallKernel):
            seen.append(line)
            assert all(isinstance(o, Origin) for o in line.origins)
    assert seen and {"amax", "sub", "exp", "sum_1", "div", "add"} <= {o.node for line in seen for o in line.origins}
