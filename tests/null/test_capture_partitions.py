"""Graph capture without a device: the partition pass over hand-built Wrapper IR (exact
lines), the partition line's FX form, and the shared runner's rules through a toy capture.

Replays on a device: tests/cpu/test_graph_capture.py (the CPU launch list) and
tests/cuda/test_graph_capture_cuda.py (CUDA graphs).
"""
import pytest
import sympy
import torch

import fxwrap
from fxwrap.ir.lines import Allocate, Buffer, CallExtern, Comment, DefineSymbol, Free, Return, View
from fxwrap.ir.partitions import PartitionBoundary
from fxwrap.runtime.graph_replay import GraphCapture, GraphReplayRunner, capture_runner, partition
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.wrapper_ir.partitions import partition_for_capture
from fxwrap.wrapper_ir.printer import program_source

aten = torch.ops.aten
CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def _buf(name, device=CUDA, size=(8,)):
    return Buffer(name, size, (1,) * len(size), torch.float32, device)


def _source(inputs, lines, device="cuda"):
    return program_source(inputs, partition_for_capture(device)(lines))


def _item_program():
    """sin -> sum -> .item() -> a kernel taking the scalar."""
    x, buf0, buf1, buf2 = _buf("arg0"), _buf("buf0", size=()), _buf("buf1"), _buf("buf2")
    lines = [Allocate(buf1), CallExtern(aten.sin.out, (x,), (("out", buf1),)),
             Allocate(buf0), CallExtern(aten.sum.IntList_out, (buf1, [0]), (("out", buf0),)),
             Comment("the scalar"),
             CallExtern(aten._local_scalar_dense.default, (buf0,), (), "u0"),
             Free(buf0),
             Allocate(buf2), CallExtern(aten.mul.Scalar_out, (buf1, "u0"), (("out", buf2),)),
             Free(buf1), Return((buf2,))]
    return [x], lines


def test_a_readback_in_the_middle_splits_three_partitions():
    inputs, lines = _item_program()
    assert _source(inputs, lines) == """\
def forward(arg0):
    partition(0, capture=True)
    buf1 = empty_strided((8,), (1,), dtype=torch.float32, device='cuda:0')
    aten.sin.out(arg0, out=buf1)
    buf0 = empty_strided((), (), dtype=torch.float32, device='cuda:0')
    aten.sum.IntList_out(buf1, [0], out=buf0)
    partition(1, capture=False)  # aten._local_scalar_dense.default has a data-dependent output (it reads a value back to the host)
    # the scalar
    u0 = aten._local_scalar_dense.default(buf0)
    free(buf0)
    partition(2, capture=True)
    buf2 = empty_strided((8,), (1,), dtype=torch.float32, device='cuda:0')
    aten.mul.Scalar_out(buf1, u0, out=buf2)
    free(buf1)
    return (buf2,)
"""


def test_a_program_without_readback_is_one_recorded_partition():
    x, out = _buf("arg0"), _buf("buf0")
    lines = [CallExtern(aten.sym_storage_offset.default, (x,), (), "arg0_offset"),
             View(_buf("buf1"), x), Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),)),
             CallExtern(aten.add_.Tensor, (x, out), (), None),  # a write into an input: captured too
             DefineSymbol(sympy.Symbol("d0", integer=True), sympy.Integer(3)),  # host arithmetic: keyed
             Return((out,))]
    out_lines = partition_for_capture("cuda")(lines)
    assert out_lines[0] == PartitionBoundary(0, True, "") and out_lines[1:] == lines


@pytest.mark.parametrize("case, reason", [
    ("cpu_input", "aten.relu.out uses arg0 on cpu, not on the cuda device"),
    ("nonzero", "aten.nonzero.default has a data-dependent output"),
    ("python_call", "<built-in function print> is not an ATen op (it may read a value back to the CPU)"),
])
def test_what_cannot_be_recorded_runs_plainly_with_its_reason(case, reason):
    x, out = _buf("arg0"), _buf("buf0")
    first = [Allocate(_buf("buf9")), CallExtern(aten.cos.out, (_buf("arg1"),), (("out", _buf("buf9")),))]
    if case == "cpu_input":
        x = _buf("arg0", CPU)
        odd = [Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),))]
    elif case == "nonzero":
        odd = [CallExtern(aten.nonzero.default, (x,), (), out)]
    else:
        odd = [CallExtern(print, (x,), (), None), Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),))]
    lines = partition_for_capture("cuda")(first + odd + [Return((out,))])
    boundaries = [line for line in lines if isinstance(line, PartitionBoundary)]
    want = [(0, True), (1, False)] + ([(2, True)] if case == "python_call" else [])
    assert [(b.index, b.capture) for b in boundaries] == want
    assert boundaries[1].reason.startswith(reason), boundaries[1].reason
    after = lines[lines.index(boundaries[1]) + 1]  # the boundary opens right at the refused line
    assert after.capture_refusal("cuda") == boundaries[1].reason


def test_index_checks_stay_recorded():
    from fxwrap.runtime.checks import check_index_bounds

    x, idx, out = _buf("arg0"), _buf("arg1"), _buf("buf0")
    lines = [CallExtern(check_index_bounds, (idx, 8, 0, False), (), None),
             Allocate(out), CallExtern(aten.relu.out, (x,), (("out", out),)), Return((out,))]
    assert [line for line in partition_for_capture("cuda")(lines) if isinstance(line, PartitionBoundary)] == \
        [PartitionBoundary(0, True, "")]


def test_a_partition_that_computes_nothing_joins_the_plain_one():
    x, out = _buf("arg0"), _buf("buf1")
    lines = [Allocate(out), CallExtern(aten._local_scalar_dense.default, (x,), (), "u0"),
             CallExtern(aten.fill_.Scalar, (out, "u0"), (), None), Return((out,))]
    got = [(b.index, b.capture, b.reason) for b in partition_for_capture("cuda")(lines)
           if isinstance(b, PartitionBoundary)]
    assert got == [(0, False, "aten._local_scalar_dense.default has a data-dependent output (it reads a "
                              "value back to the host)"), (1, True, "")]


def test_partition_lines_become_fx_calls_and_split_the_program():
    inputs, lines = _item_program()
    gm = to_graph_module([_buf("arg0", CPU)], partition_for_capture("cpu")(
        [_retype(line) for line in lines]), guard=False)
    marks = [n.args for n in gm.graph.nodes if n.target is partition]
    assert [m[:2] for m in marks] == [(0, True), (1, False), (2, True)]
    x = torch.randn(8)
    want = x.sin() * x.sin().sum().item()
    runner = capture_runner(gm, gm, _ToyCapture())
    for _ in range(4):
        torch.testing.assert_close(runner(x)[0], want)
    recorded = [n.target for n in runner.graph.nodes if isinstance(n.target, GraphReplayRunner)]
    assert len(recorded) == 2 and [r.count for r in recorded] == [1, 1]


def _retype(line):
    """The same line on the CPU (the toy capture records CPU runs)."""
    import dataclasses

    def cpu(v):
        if isinstance(v, Buffer):
            return dataclasses.replace(v, device=CPU)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(i) for i in v)
        return v
    return type(line)(**{f.name: cpu(getattr(line, f.name)) for f in dataclasses.fields(line)})


class _ToyCapture(GraphCapture):
    """Records by remembering the callable, its inputs and outputs; a replay calls it again
    and writes the results into the recorded outputs (as a device's replay does)."""

    device_type = "cpu"

    def __init__(self):
        self.records = self.replays = 0

    def record(self, run, inputs):
        self.records += 1
        outputs = run(*inputs)
        return (run, inputs, outputs), outputs

    def replay(self, recording):
        self.replays += 1
        run, inputs, outputs = recording
        fresh = run(*inputs)
        for kept, new in zip(*((o if isinstance(o, (tuple, list)) else (o,)) for o in (outputs, fresh))):
            kept.copy_(new)


def test_runner_rules_through_a_toy_capture():
    """Static input used in place (never copied), its write visible; another input's write
    copied back; a new recording when the static input's storage changes."""
    seen = []

    def step(cache, x):  # cache: static (a buffer); x: written, not static
        seen.append((cache.data_ptr(), x.data_ptr()))
        cache.add_(x)
        x.mul_(2)
        return cache.sum()

    capture = _ToyCapture()
    runner = GraphReplayRunner(step, capture, static=(0,), written=(0, 1))
    cache, ref = torch.zeros(4), torch.zeros(4)
    for i in range(4):
        x = torch.randn(4)
        x_ref = x.clone()
        got = runner(cache, x)
        ref.add_(x_ref)
        torch.testing.assert_close(got, ref.sum())
        torch.testing.assert_close(cache, ref)
        torch.testing.assert_close(x, x_ref * 2)  # copied back from the recording's copy
        assert seen[-1][0] == cache.data_ptr()  # the static input itself, never a copy
        assert i < 2 or seen[-1][1] != x.data_ptr()  # recorded runs read their own copy of x
        del got
    assert (capture.records, capture.replays, runner.count) == (1, 2, 1)
    moved = cache.clone()
    torch.testing.assert_close(runner(moved, torch.ones(4)), (ref + 1).sum())
    assert runner.count == 2 and seen[-1][0] == moved.data_ptr()


def test_runner_records_once_per_size_up_to_the_limit():
    capture = _ToyCapture()
    runner = GraphReplayRunner(lambda x, n: x * n, capture)
    runner.max_recordings = 2
    for n in (2, 3, 4):
        for _ in range(3):
            x = torch.randn(n)
            torch.testing.assert_close(runner(x, n), x * n)
    assert runner.count == 2 and len(runner.refused) == 1


def test_an_unsafe_runner_just_runs_the_program():
    calls = []
    runner = GraphReplayRunner(lambda *a: calls.append(a) or a[0] * 2, _ToyCapture(), reason="why not")
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(runner(x), x * 2)
    assert len(calls) == 3 and runner.recordings == {}


def test_inputs_of_another_device_fall_back():
    runner = GraphReplayRunner(lambda x: x + 1, GraphCapture())  # device_type "": no tensor fits
    x = torch.randn(5)
    torch.testing.assert_close(runner(x), x + 1)
    assert runner.fallback_reason == "an input is not a  tensor" and runner.recordings == {}


def test_cudagraphs_mode_needs_a_device_that_captures(monkeypatch):
    """Mode "cudagraphs" asks the device whether it records programs, not its type string:
    the CPU (launch lists) records; a device without graph capture is refused by name."""
    x = torch.randn(4, 6)
    torch._dynamo.reset()
    fn = fxwrap.compile(lambda t: t.relu() * 2, target="cpu", options={"mode": "cudagraphs"})
    for _ in range(3):
        torch.testing.assert_close(fn(x), x.relu() * 2)
    monkeypatch.setattr(fxwrap.CpuDevice, "graph_capture", lambda self: None)
    torch._dynamo.reset()
    fn = fxwrap.compile(lambda t: t.relu() * 2, target="cpu", options={"mode": "cudagraphs"})
    with pytest.raises(Exception, match=r"mode 'cudagraphs' needs a target whose device records and replays "
                                        r"programs \(DeviceInterface.graph_capture\(\)\); target 'cpu'"):
        fn(x)


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="no mode 'turbo'"):
        fxwrap.Backend("cpu", {"mode": "turbo"})


def test_an_unhashable_input_falls_back():
    runner = GraphReplayRunner(lambda x, sizes: x * len(sizes), _ToyCapture())
    x = torch.randn(3)
    for _ in range(3):
        torch.testing.assert_close(runner(x, [1, 2]), x * 2)
    assert runner.fallback_reason == "an input is neither a tensor nor a hashable value" and runner.count == 0
