"""FX structure of lowered and hand-made programs: meta, frees, comments, kernels."""
from __future__ import annotations

import copy
import operator
from dataclasses import dataclass

import pytest
import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor

import fxwrap
from fxwrap.wrapper_ir.fx import UnknownLine, to_graph_module
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, CallKernel, Comment, GetItem, Line, Return, Reuse, SizeInput,
    View,
)
from fxwrap.wrapper_ir.printer import line_source, program_source

import null_helpers as H

aten = torch.ops.aten


def _gen(seed):
    return torch.Generator().manual_seed(seed)


PROGRAMS = {
    "mlp": (H.mlp, lambda g: H.mlp_inputs(g)),
    "views": (H.views, lambda g: (torch.randn(6, 8, generator=g),)),
    "topk": (H.topk, lambda g: (torch.randn(5, 10, generator=g),)),
    "split": (H.split, lambda g: (torch.randn(6, 5, generator=g),)),
}


CASES = [(name, mode) for mode in H.MODES for name in PROGRAMS]
IDS = [f"{name}-{mode}" for name, mode in CASES]


@pytest.fixture(scope="module")
def programs():
    return {(name, mode): H.lower(fn, *make(_gen(1)), mode=mode)
            for (name, mode) in CASES for fn, make in [PROGRAMS[name]]}


def _reuse_in_place(line):
    o, n = line.old, line.new
    return (o.size, o.stride, o.offset, o.dtype) == (n.size, n.stride, n.offset, n.dtype)


def _buffer_nodes_expected(program):
    """Names of buffers that must have a node of their own (all but same-layout reuse)."""
    names = [i.name for i in program.inputs if isinstance(i, Buffer)]
    for line in program.lines:
        if isinstance(line, Reuse) and _reuse_in_place(line):
            continue
        if isinstance(line, (Allocate, Reuse, View)):
            names.append((line.buf if not isinstance(line, Reuse) else line.new).name)
        elif isinstance(line, CallExtern) and isinstance(line.out, Buffer):
            names.append(line.out.name)
        elif isinstance(line, GetItem) and isinstance(line.buf, Buffer):
            names.append(line.buf.name)
    return names


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_every_buffer_node_has_matching_fake_val(programs, name, mode):
    program = programs[name, mode]
    gm = program.graph_module
    buffers = H.buffers_by_name(program.inputs, program.lines)
    nodes = {n.name: n for n in gm.graph.nodes}
    expected = _buffer_nodes_expected(program)
    assert len(expected) >= 3
    for buf_name in expected:
        node = nodes[buf_name]
        val = node.meta.get("val")
        assert isinstance(val, FakeTensor), (buf_name, val)
        assert H.fake_layout(val) == H.layout_at(buffers[buf_name], program.hints), buf_name
    # and conversely: every node that makes a tensor buffer carries a FakeTensor
    makers = {torch.empty_strided, torch.as_strided}
    for node in gm.graph.nodes:
        is_tensor_getitem = node.target is operator.getitem and isinstance(
            buffers.get(node.name), Buffer)
        if node.op == "placeholder" or node.target in makers or is_tensor_getitem:
            assert isinstance(node.meta.get("val"), FakeTensor), node.format_node()


def test_getitem_and_functional_extern_nodes():
    """A multi-output op without an ``out=`` form (CPU attention: output and log-sum-exp):
    one call, a ``getitem`` per result."""
    def attention(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) * 2

    q, k, v = (torch.randn(1, 2, 3, 8, generator=_gen(i)) for i in range(3))
    gm = H.lower(attention, q, k, v).graph_module
    getitems = [n for n in gm.graph.nodes if n.target is operator.getitem]
    assert len(getitems) == 2
    assert [tuple(n.meta["val"].shape) for n in getitems] == [(1, 2, 3, 8), (1, 2, 3)]
    tuple_node = getitems[0].args[0]
    assert tuple_node.target is aten._scaled_dot_product_flash_attention_for_cpu.default
    H.assert_close_all(gm(q, k, v), (attention(q, k, v),))


@pytest.mark.parametrize("mode", H.MODES)
def test_split_pieces_are_view_nodes(programs, mode):
    """``split``'s results are views of its input: one ``as_strided`` node each (the second at
    its offset), no ATen call of the split and no ``getitem``; the numbers are eager's."""
    gm = programs["split", mode].graph_module
    assert not [n for n in gm.graph.nodes if n.target is operator.getitem
                or n.target in (aten.split_with_sizes.default, aten.split.Tensor)], gm.code
    views = [n for n in gm.graph.nodes if n.target is torch.as_strided]
    assert [tuple(n.meta["val"].shape) for n in views] == [(3, 5), (3, 5)], gm.code
    assert [n.meta["val"].storage_offset() for n in views] == [0, 15], gm.code
    fn, make = PROGRAMS["split"]
    args = make(_gen(3))
    H.assert_close_all(gm(*args), fn(*args))


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_free_nodes_survive_dead_code_elimination(programs, name, mode):
    program = programs[name, mode]
    gm = copy.deepcopy(program.graph_module)
    n_free_lines = sum(type(line).__name__ == "Free" for line in program.lines)
    frees = [n for n in gm.graph.nodes if n.target is fxwrap.runtime.free]
    assert len(frees) == n_free_lines
    externs = [n for n in gm.graph.nodes if isinstance(n.target, (torch._ops.OpOverload, fxwrap.Kernel))]
    dead = gm.graph.call_function(torch.sin, (next(iter(gm.graph.nodes)),))  # unused: DCE drops it
    before = len(gm.graph.nodes)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert dead not in gm.graph.nodes and len(gm.graph.nodes) < before
    assert [n for n in gm.graph.nodes if n.target is fxwrap.runtime.free] == frees
    assert [n for n in gm.graph.nodes
            if isinstance(n.target, (torch._ops.OpOverload, fxwrap.Kernel))] == externs
    fn, make = PROGRAMS[name]
    args = make(_gen(7))
    H.assert_close_all(gm(*args), fn(*args))


def test_programs_have_frees_and_reference_programs_have_kernels(programs):
    for name, mode in (("mlp", "extern"), ("views", "extern"), ("mlp", "reference"),
                       ("topk", "reference")):  # split's pieces are views of the input: nothing to free
        nodes = programs[name, mode].graph_module.graph.nodes
        assert sum(n.target is fxwrap.runtime.free for n in nodes) >= 1, (name, mode)
    for name in PROGRAMS:
        extern = programs[name, "extern"]
        assert not any(isinstance(n.target, fxwrap.Kernel) for n in extern.graph_module.graph.nodes)
    for name in PROGRAMS:
        program = programs[name, "reference"]
        calls = [line for line in program.lines if isinstance(line, CallKernel)]
        launches = [n for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
        assert len(calls) >= 1 and [n.target for n in launches] == [c.kernel for c in calls]
        for n, call in zip(launches, calls):
            k = n.target
            assert k.target == "reference" and k.source and len(k.signature) == len(call.args)
            roles = [a.role for a in k.signature]
            assert "output" in roles or "inout" in roles


def test_print_readable_shows_allocations_calls_views_and_frees(programs):
    text = programs["mlp", "extern"].graph_module.print_readable(print_output=False)
    for needle in ("torch.empty_strided(", "torch.ops.aten.mm.out(", "torch.ops.aten.relu.default(",
                   "torch.ops.aten._softmax.out(", "fxwrap_runtime_memory_free("):
        assert needle in text, needle
    text = programs["views", "extern"].graph_module.print_readable(print_output=False)
    # a view at its input's own offset: as_strided keeps the input's offset; one past it
    # reads the offset
    for needle in ("torch.as_strided(arg0, [8, 6], [1, 8])", "= 1 + arg0_offset", "torch.ops.aten.clone.default(",
                   "torch.ops.aten.mul.out(", "fxwrap_runtime_memory_free("):
        assert needle in text, needle


def _produces_node(line: Line, gm=None) -> bool:
    if isinstance(line, CallExtern) and line.op is aten.sym_storage_offset.default and gm is not None:
        # an offset nothing reads is no node (its comment goes to the next one)
        return any(n.name == line.out for n in gm.graph.nodes)
    return not isinstance(line, Comment) and not (isinstance(line, Reuse) and _reuse_in_place(line)) \
        and type(line).__name__ != "DefineKernel"


def _main_node(gm, lines, j):
    """The node line ``j`` produces last (where its comment must land)."""
    line = lines[j]
    nodes = list(gm.graph.nodes)
    if isinstance(line, (Allocate, View)):
        return next(n for n in nodes if n.name == line.buf.name)
    if isinstance(line, Reuse):
        return next(n for n in nodes if n.name == line.new.name)
    if isinstance(line, CallExtern) and line.out is not None:
        name = line.out.name if isinstance(line.out, Buffer) else line.out
        return next(n for n in nodes if n.name == name)
    if isinstance(line, CallExtern):
        k = sum(isinstance(x, CallExtern) and x.op is line.op for x in lines[:j])
        return [n for n in nodes if n.target is line.op][k]
    if isinstance(line, CallKernel):
        k = sum(isinstance(x, CallKernel) and x.kernel is line.kernel for x in lines[:j])
        return [n for n in nodes if n.target is line.kernel][k]
    raise AssertionError(f"no rule for {line!r}")


def _check_comments(gm, lines):
    comments = [(i, line.text) for i, line in enumerate(lines) if isinstance(line, Comment)]
    assert comments
    for i, text in comments:
        j = next(k for k in range(i + 1, len(lines)) if _produces_node(lines[k], gm))
        node = _main_node(gm, lines, j)
        assert text in node.meta.get("comment", "").split("\n"), (text, node.format_node(), node.meta.get("comment"))
    carried = [c for n in gm.graph.nodes if "comment" in n.meta for c in n.meta["comment"].split("\n")]
    assert carried == [text for _, text in comments]


def _check_origins(gm, lines):
    """Every call line's origins sit on the node it produces, and on no other node."""
    labelled = {}
    for j, line in enumerate(lines):
        if isinstance(line, (CallKernel, CallExtern)) and line.origins:
            node = _main_node(gm, lines, j)
            assert node.meta.get("fxwrap_origins") == line.origins, (node.format_node(), line)
            labelled[node] = line
    assert labelled
    for node in gm.graph.nodes:
        if node not in labelled:
            assert "fxwrap_origins" not in node.meta, node.format_node()


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_origins_land_on_the_calls_node(programs, name, mode):
    _check_origins(programs[name, mode].graph_module, programs[name, mode].lines)


def test_consecutive_and_trailing_comments_are_kept():
    x = Buffer("arg0", (3,), (1,), H.F32, H.CPU)
    buf0 = Buffer("buf0", (3,), (1,), H.F32, H.CPU)
    lines = [Comment("first"), Comment("second"), Allocate(buf0),
             CallExtern(aten.sin.out, (x,), (("out", buf0),)), Comment("result"),
             Return((buf0,)), Comment("trailing")]
    gm = to_graph_module([x], lines)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert nodes["buf0"].meta["comment"] == "first\nsecond"
    assert nodes["output"].meta["comment"] == "result\ntrailing"
    arg = torch.randn(3, generator=_gen(3))
    torch.testing.assert_close(gm(arg)[0], arg.sin())


@pytest.mark.parametrize("name,mode", CASES, ids=IDS)
def test_graph_module_runs_and_matches_eager(programs, name, mode):
    fn, make = PROGRAMS[name]
    gm = programs[name, mode].graph_module
    for seed in (11, 12):
        args = make(_gen(seed))
        before = [a.clone() for a in args]
        H.assert_close_all(gm(*args), fn(*args))
        for a, b in zip(args, before):
            assert torch.equal(a, b)  # inputs are never written


def test_graph_module_outputs_are_fresh_each_call(programs):
    gm = programs["mlp", "extern"].graph_module
    first_args, second_args = H.mlp_inputs(_gen(21)), H.mlp_inputs(_gen(22))
    first = gm(*first_args)[0]
    kept = first.clone()
    second = gm(*second_args)[0]
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)
    torch.testing.assert_close(second, H.mlp(*second_args))


# -- a hand-made kernel -----------------------------------------------------------------


def test_hand_made_kernel_program_converts_and_runs():
    kernel = H.double_plus_one_kernel()
    inputs, lines = H.kernel_program(kernel)
    gm = to_graph_module(inputs, lines)
    launches = [n for n in gm.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert len(launches) == 2 and all(n.target is kernel for n in launches)
    assert [n.args[1].name for n in launches] == ["buf0", "buf2"]
    assert launches[1].args[0].name == "buf1"
    assert kernel.signature == (fxwrap.KernelArg("x", "input"), fxwrap.KernelArg("out", "output"))
    assert gm._fxwrap_kernels == (kernel,)
    for seed in (1, 2):
        x = torch.randn(4, 6, generator=_gen(seed))
        out = gm(x)
        H.assert_close_all(out, H.kernel_program_eager(x))
        assert out[0].storage_offset() == 4 and out[0].stride() == (4, 1)
    _check_comments(gm, lines)
    vals = {n.name: n.meta.get("val") for n in gm.graph.nodes}
    assert H.fake_layout(vals["buf1"]) == ((6, 4), (1, 6), 0, H.F32, H.CPU)
    assert H.fake_layout(vals["buf3"]) == ((2, 4), (4, 1), 4, H.F32, H.CPU)
    frees = [n for n in gm.graph.nodes if n.target is fxwrap.runtime.free]
    assert [n.args[0].name for n in frees] == ["buf0"]


def test_kernel_launch_is_prebound_and_loader_runs_once():
    calls = []

    def counting_loader(kernel):
        calls.append(kernel.name)
        return H.exec_loader(kernel)

    kernel = fxwrap.Kernel("count", H.DOUBLE_PLUS_ONE, "cpu",
                           (fxwrap.KernelArg("x", "input"), fxwrap.KernelArg("out", "output")),
                           loader=counting_loader)
    x, out = torch.randn(5, generator=_gen(4)), torch.empty(5)
    for _ in range(3):
        kernel(x, out)
    assert calls == ["count"]
    torch.testing.assert_close(out, x * 2 + 1)
    bound = fxwrap.Kernel("bound", "", "cpu", (), loader=None)
    bound.bind(lambda a: a.mul_(3))
    y = torch.randn(4, generator=_gen(5))
    expected = y * 3
    bound(y)
    torch.testing.assert_close(y, expected)
    with pytest.raises(RuntimeError, match="no loader"):
        fxwrap.Kernel("unbound", "", "cpu", ())(y)


def test_kernels_survive_deepcopy_as_the_same_object():
    kernel = H.double_plus_one_kernel()
    inputs, lines = H.kernel_program(kernel)
    gm = to_graph_module(inputs, lines)
    clone = copy.deepcopy(gm)
    assert [n.target for n in clone.graph.nodes if isinstance(n.target, fxwrap.Kernel)] == [kernel, kernel]
    assert clone._fxwrap_kernels == (kernel,)
    x = torch.randn(4, 6, generator=_gen(6))
    H.assert_close_all(clone(x), H.kernel_program_eager(x))


def test_printer_shows_every_line_of_the_hand_made_program():
    inputs, lines = H.kernel_program()
    text = program_source(inputs, lines)
    body = text.splitlines()
    assert body[0] == "def forward(arg0):"
    assert body[1:] == ["    " + line_source(line) for line in lines]
    for needle in ("# kernel double_plus_one (cpu): x:input, out:output",
                   "# first: double_plus_one(arg0)",
                   "buf0 = empty_strided((4, 6), (6, 1), dtype=torch.float32, device='cpu')",
                   "double_plus_one(arg0, buf0)  # grid=(24,)",
                   "buf1 = as_strided(buf0, (6, 4), (1, 6), 0)  # view",
                   "double_plus_one(buf1, buf2)  # grid=(24,)",
                   "free(buf0)",
                   "buf3 = as_strided(buf2, (2, 4), (4, 1), 4)  # view",
                   "return (buf3,)"):
        assert sum(needle in b for b in body) == 1, needle


def test_printer_reuse_forms_match_fx():
    old = Buffer("buf0", (4, 4), (4, 1), H.F32, H.CPU)
    same = Buffer("buf1", (4, 4), (4, 1), H.F32, H.CPU)
    shifted = Buffer("buf2", (4, 4), (4, 1), H.F32, H.CPU, offset=2)
    smaller = Buffer("buf3", (2, 4), (4, 1), H.F32, H.CPU, offset=8)
    assert line_source(Reuse(old, same)) == "buf1 = buf0  # reuse"
    assert line_source(Reuse(old, shifted)) == "buf2 = as_strided(buf0, (4, 4), (4, 1), 2)  # reuse"
    assert line_source(Reuse(old, smaller)) == "buf3 = as_strided(buf0, (2, 4), (4, 1), 8)  # reuse"
    x = Buffer("arg0", (4, 4), (4, 1), H.F32, H.CPU)
    lines = [Allocate(old), CallExtern(aten.exp.out, (x,), (("out", old),)), Reuse(old, smaller),
             CallExtern(aten.sin.out, (x,), (("out", smaller),)), Return((old,))]
    gm = to_graph_module([x], lines)
    arg = torch.randn(4, 4, generator=_gen(8))
    expected = arg.exp()
    expected.view(-1)[8:16] = arg.sin().view(-1)[:8]
    torch.testing.assert_close(gm(arg)[0], expected)


def test_printer_prints_named_scalars_bare_and_strings_quoted():
    x = Buffer("arg0", (6, 5), (5, 1), H.F32, H.CPU)
    a = Buffer("buf1", (3, 5), (5, 1), H.F32, H.CPU)
    out = Buffer("buf3", (6, 5), (5, 1), H.F32, H.CPU)
    lines = [CallExtern(aten.split_with_sizes.default, (x, (3, 3)), (), "tuple0"),
             GetItem(a, "tuple0", 0),
             Allocate(out),
             CallExtern(aten.div.out_mode, (x, 2.0), (("rounding_mode", "floor"), ("out", out))),
             Return((a, out))]
    text = program_source([x], lines)
    assert "tuple0 = aten.split_with_sizes.default(arg0, (3, 3))" in text
    assert "buf1 = tuple0[0]" in text
    assert "aten.div.out_mode(arg0, 2.0, rounding_mode='floor', out=buf3)" in text
    gm = to_graph_module([x], lines)
    arg = torch.randn(6, 5, generator=_gen(9)) * 10
    got = gm(arg)
    torch.testing.assert_close(got[0], arg[:3])
    torch.testing.assert_close(got[1], torch.div(arg, 2.0, rounding_mode="floor"))


@dataclass(frozen=True)
class Mystery(Line):
    note: str


def test_unknown_line_raises_and_names_the_line():
    x = Buffer("arg0", (2,), (1,), H.F32, H.CPU)
    line = Mystery("what is this")
    with pytest.raises(UnknownLine, match=r"Mystery\(note='what is this'\)"):
        to_graph_module([x], [line, Return((x,))])
    with pytest.raises(TypeError, match=r"Mystery\(note='what is this'\)"):
        line_source(line)


def test_reuse_across_dtypes_is_refused():
    x = Buffer("arg0", (4,), (1,), H.F32, H.CPU)
    old = Buffer("buf0", (4,), (1,), H.F32, H.CPU)
    new = Buffer("buf1", (4,), (1,), torch.int32, H.CPU)
    lines = [Allocate(old), CallExtern(aten.sin.out, (x,), (("out", old),)), Reuse(old, new),
             Return((new,))]
    with pytest.raises(NotImplementedError, match="buf1"):
        to_graph_module([x], lines)


def test_size_inputs_are_placeholders_with_symints():
    s0 = SizeInput(sympy.Symbol("s0", integer=True, positive=True), 5)
    x = Buffer("arg1", (s0.symbol,), (1,), H.F32, H.CPU)
    gm = to_graph_module([s0, x], [Return((x,))])
    ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in ph] == ["s0", "arg1"]
    assert isinstance(ph[0].meta["val"], torch.SymInt) and ph[0].meta["val"].node.hint == 5
    assert ph[1].meta["val"].shape[0].node.expr == ph[0].meta["val"].node.expr
