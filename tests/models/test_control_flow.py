"""Control flow: torch.cond and while_loop compiled into nested Wrapper IR programs.

Each branch / loop body is a program of its own (kernels, memory plan), printed nested under
its line, and in FX a GraphModule of fxwrap's (Kernel launches) that the parent passes to the
higher-order op.  Every test checks eager's numbers and that the kernels are in the subgraphs,
on cpu, reference, triton-interpret and mps_shim.
"""
import importlib.util
import pickle

import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop

import fxwrap
from fxwrap.runtime.kernel import Kernel
from fxwrap.ir.lines import SizeInput
from models_helpers import DYNAMIC, compile_fxwrap


def _triton_missing():
    for module in ("triton", "numpy"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed; pip install -e '.[triton]'"
    return None


TARGETS = [
    pytest.param({"target": "cpu"}, id="cpu"),
    pytest.param({"target": "reference"}, id="reference"),
    pytest.param({"target": "mps", "execute": "shim"}, id="mps_shim"),
    pytest.param({"target": "triton-interpret"}, id="triton-interpret",
                 marks=pytest.mark.skipif(_triton_missing() is not None or torch.cuda.is_available(),
                                          reason=str(_triton_missing() or "a GPU is here: tests/cuda"))),
]


def nested_kernels(program) -> dict[str, list]:
    """Submodule path -> the Kernels its graph launches, for every nested GraphModule."""
    return {name: [n.target for n in module.graph.nodes if isinstance(n.target, Kernel)]
            for name, module in program.graph_module.named_modules()
            if name and isinstance(module, torch.fx.GraphModule)}


def assert_subgraphs_have_kernels(program, names):
    found = nested_kernels(program)
    for name in names:
        assert name in found, f"no subgraph {name} in {sorted(found)}"
        assert found[name], f"subgraph {name} launches no kernel:\n{program.code()}"
        target = program.target.name
        assert all(k.target == target for k in found[name])
        module = program.graph_module.get_submodule(name)
        assert not any(isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "aten"
                       and n.target not in _METADATA for n in module.graph.nodes), module.code


_METADATA = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
             torch.ops.aten.sym_storage_offset.default}


def branchy(x, y):
    z = torch.cond(x.sum() > 0, lambda a, b: a.sin() * b, lambda a, b: a.cos() + b, (x, y))
    return z * 2 + y


@pytest.mark.parametrize("options", TARGETS)
@pytest.mark.parametrize("dynamic", DYNAMIC)
def test_cond_forward_backward(options, dynamic):
    compiled = compile_fxwrap(branchy, "torch.compile", dynamic, **options)
    shapes = ((4, 3), (5, 2)) if dynamic else ((4, 3),)
    for shape in shapes:
        for sign in (1.0, -1.0):  # both branches
            x = (torch.rand(shape) + 0.1) * sign
            y = torch.randn(shape)
            xa, ya, xb, yb = (t.clone().requires_grad_() for t in (x, y, x, y))
            out, expected = compiled(xa, ya), branchy(xb, yb)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            grad = torch.randn_like(expected)
            out.backward(grad)
            expected.backward(grad)
            torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ya.grad, yb.grad, rtol=1e-5, atol=1e-5)
    forward = next(p for p in compiled.programs if p.kind == "forward")
    backward = next(p for p in compiled.programs if p.kind == "backward")
    assert_subgraphs_have_kernels(forward, ["true_graph_0", "false_graph_0"])
    assert_subgraphs_have_kernels(backward, ["true_graph_1", "false_graph_1"])
    assert "def true_graph_0(" in forward.code() and "def false_graph_1(" in backward.code()


def counter_loop(x):
    def cond_fn(i, t):
        return i < 4

    def body_fn(i, t):
        return i + 1, (t * 0.5 + 1).sin() / (t.abs().sum() + 1)
    return while_loop(cond_fn, body_fn, (torch.tensor(0), x))


def tensor_loop(x, w):
    def cond_fn(t, n):
        return t.abs().max() > 0.05

    def body_fn(t, n):
        scaled = t * 0.6 - w.tanh() * 0.01
        return scaled / (1 + scaled.square().mean()), n + 1
    return while_loop(cond_fn, body_fn, (x, torch.zeros((), dtype=torch.int64)))


@pytest.mark.parametrize("options", TARGETS)
def test_while_loop(options):
    for fn, make in ((counter_loop, lambda: (torch.randn(5, 3),)),
                     (tensor_loop, lambda: (torch.randn(6), torch.randn(6)))):
        compiled = compile_fxwrap(fn, "torch.compile", False, **options)
        for _ in range(2):
            args = make()
            out, expected = compiled(*args), fn(*args)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        program = compiled.programs[0]
        assert_subgraphs_have_kernels(program, ["while_loop_cond_graph_0", "while_loop_body_graph_0"])
        assert "while_loop(" in program.code() and "def while_loop_body_graph_0(" in program.code()
    assert expected[1] > 1  # the loop ran more than once


def nested(x, y):
    def inner(a, b):
        return torch.cond(b.max() > 0, lambda p, q: p.exp() - q, lambda p, q: (p * q).softmax(-1), (a, b))
    return torch.cond(x.mean() > 0, inner, lambda a, b: a.tanh() + b.sum(0), (x, y)) * 3


@pytest.mark.parametrize("options", TARGETS)
def test_nested_cond_and_branches_of_different_kernel_counts(options):
    compiled = compile_fxwrap(nested, "torch.compile", False, **options)
    for sx, sy in ((1, 1), (1, -1), (-1, 1)):  # every branch of both conds
        x = (torch.rand(4, 6) + 0.1) * sx
        y = (torch.rand(4, 6) + 0.1) * sy
        torch.testing.assert_close(compiled(x, y), nested(x, y), rtol=1e-5, atol=1e-6)
    program = compiled.programs[0]
    assert_subgraphs_have_kernels(program, ["true_graph_0", "false_graph_0", "true_graph_0.true_graph_0",
                                            "true_graph_0.false_graph_0"])
    found = nested_kernels(program)
    assert len(found["false_graph_0"]) == 2 and len(found["true_graph_0.true_graph_0"]) == 1
    code = program.code()
    assert "\n                def true_graph_0(" in code  # the inner cond: a block in a block


def test_cond_program_pickles():
    program = fxwrap.lower(branchy, torch.randn(4, 3), torch.randn(4, 3))
    gm = pickle.loads(pickle.dumps(program.graph_module))
    assert any(isinstance(n.target, Kernel) for n in gm.get_submodule("true_graph_0").graph.nodes)
    for sign in (1.0, -1.0):
        x, y = (torch.rand(4, 3) + 0.1) * sign, torch.randn(4, 3)
        torch.testing.assert_close(gm(x, y)[0], branchy(x, y), rtol=1e-5, atol=1e-5)


def test_cond_extern_only_target_lowers_branches_to_extern_lines():
    """``kernels=False``: the branches are nested programs of out= extern calls."""
    program = fxwrap.lower(branchy, torch.randn(4, 3), torch.randn(4, 3), options={"kernels": False})
    true_gm = program.graph_module.get_submodule("true_graph_0")
    assert torch.ops.aten.sin.out in [n.target for n in true_gm.graph.nodes]
    x, y = torch.rand(4, 3) - 2, torch.randn(4, 3)
    torch.testing.assert_close(program.run(x, y), branchy(x, y), rtol=1e-5, atol=1e-5)


def test_branch_returning_its_input_gets_a_copy():
    """A nested program never returns an input's storage (the op requires fresh results):
    a branch returning its operand as it is gets a copy kernel."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxwrap.plugins.manager import get_plugin_manager
    from fxwrap.wrapper_ir.build_control_flow import nested_program
    from fxwrap.wrapper_ir.build import kernel_lowerer
    from fxwrap.wrapper_ir.fx import to_graph_module
    from fxwrap.ir.lines import Buffer, CallKernel, Return

    gm = make_fx(lambda a, b: (a, b.sin()), tracing_mode="fake")(torch.randn(4, 3), torch.randn(4, 3))
    manager = get_plugin_manager()
    parent = kernel_lowerer(gm, manager.session(manager.target("cpu")))
    parent.lower()
    layouts = [Buffer.from_fake("r", n.meta["val"]) for n in gm.graph.nodes if n.op == "placeholder"]
    program = nested_program(parent, gm, "branch", layouts)
    returned = program.lines[-1]
    assert isinstance(returned, Return)
    assert not {b.name for b in returned.values} & {i.name for i in program.inputs}
    calls = [line for line in program.lines if isinstance(line, CallKernel)]
    assert calls and any(returned.values[0] in line.writes() for line in calls)
    a, b = torch.randn(4, 3), torch.randn(4, 3)  # its FX form: the copy holds the input's values
    got = to_graph_module(program.inputs, list(program.lines), program.constants, program.fake_values)(a, b)
    assert got[0].data_ptr() != a.data_ptr()
    torch.testing.assert_close(got[0], a)
    torch.testing.assert_close(got[1], b.sin())


def test_cond_is_no_cuda_graph():
    """The op reads its predicate on the host: a program with it is never captured
    (graph capture's partition pass asks each line; the predicate read is the line's answer)."""
    from fxwrap.ir.control_flow import Conditional
    program = fxwrap.lower(branchy, torch.randn(4, 3), torch.randn(4, 3))
    line = next(line for line in program.lines if isinstance(line, Conditional))
    assert "predicate" in line.host_readback()
    assert line.reads()[0] is line.predicate and len(line.programs) == 2
    # the predicate and operands stay live across the whole line: freed after it, never before
    from fxwrap.ir.lines import Free
    at = program.lines.index(line)
    frees = {ln.buf.name: i for i, ln in enumerate(program.lines) if isinstance(ln, Free)}
    assert frees[line.predicate.name] > at
    assert all(frees.get(b.name, len(program.lines)) > at for b in line.reads())


def transposed_loop(x):
    def cond_fn(t, n):
        return n < 3

    def body_fn(t, n):
        return (t * 2).cos() + t.sum(1, keepdim=True), n + 1
    return while_loop(cond_fn, body_fn, (x.t() * 1.0, torch.zeros((), dtype=torch.int64)))


@pytest.mark.parametrize("options", TARGETS)
def test_while_loop_carries_values_in_their_own_layout(options):
    """A carried value laid out column-major stays so: the body writes each result straight
    into the layout it takes it in (one kernel, no copy), so iterations chain as they are."""
    from fxwrap.ir.control_flow import WhileLoop
    from fxwrap.ir.lines import Return
    compiled = compile_fxwrap(transposed_loop, "torch.compile", False, **options)
    x = torch.randn(4, 6)
    torch.testing.assert_close(compiled(x), transposed_loop(x), rtol=1e-5, atol=1e-6)
    line = next(line for line in compiled.programs[0].lines if isinstance(line, WhileLoop))
    body = line.body_program
    returned = next(line for line in body.lines if isinstance(line, Return)).values
    assert [tuple(b.stride) for b in returned] == [tuple(i.stride) for i in body.inputs[:2]]
    assert tuple(body.inputs[0].stride) == (1, 6)
    assert len(nested_kernels(compiled.programs[0])["while_loop_body_graph_0"]) == 2


def scaled_loop(x, w):
    def cond_fn(t, n):
        return n < 4

    def body_fn(t, n):
        return (t * w).sin() + t.mean(), n + 1
    return while_loop(cond_fn, body_fn, (x.clone(), torch.zeros((), dtype=torch.int64)))


def body_inputs(program):
    from fxwrap.ir.control_flow import WhileLoop
    return next(line for line in program.lines if isinstance(line, WhileLoop)).body_program.inputs


@pytest.mark.parametrize("options", TARGETS)
def test_while_loop_dynamic(options):
    """dynamic=True: the sizes are operands of the nested programs like the tensors."""
    compiled = compile_fxwrap(scaled_loop, "torch.compile", True, **options)
    for n in (5, 7):
        x, w = torch.randn(n, 3), torch.randn(3)
        (got, count), (want, want_count) = compiled(x, w), scaled_loop(x, w)
        assert torch.equal(count, want_count)
        # four rounds of sin(t * w) + mean(t) amplify float32 rounding (a seed gave 3.6e-6 off
        # eager at 0.1): as close to the float64 loop as eager, within a factor
        exact = scaled_loop(x.double(), w.double())[0]
        ours, eagers = (got.double() - exact).abs().max().item(), (want.double() - exact).abs().max().item()
        assert ours <= 2 * eagers + 4 * torch.finfo(torch.float32).eps * exact.abs().max().item(), (ours, eagers)
    program = compiled.programs[0]
    assert any(isinstance(i, SizeInput) for i in body_inputs(program))
    assert_subgraphs_have_kernels(program, ["while_loop_cond_graph_0", "while_loop_body_graph_0"])
