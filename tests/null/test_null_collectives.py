"""Collective lines without a process group: hand-built lines through the overlap pass, the
memory planner, the printer, the FX converter and CUDA-graph safety (the programs that
run are in tests/distributed)."""
from __future__ import annotations

import pytest
import torch

from fxwrap.core.memory import plan_memory
from fxwrap.core.overlap import overlap_collectives
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.ir.lines import Allocate, Buffer, CallExtern, Free, Return, Reuse
from fxwrap.wrapper_ir.printer import program_source

c10d = getattr(torch.ops, "_c10d_functional", None)
if c10d is None or not hasattr(c10d, "all_gather_into_tensor_out"):
    pytest.skip("this torch build has no _c10d_functional ops", allow_module_level=True)

from fxwrap.ir.collectives import CallCollective, WaitCollective  # noqa: E402

aten = torch.ops.aten


def buf(name, *size):
    stride, acc = [], 1
    for n in reversed(size):
        stride.insert(0, acc)
        acc *= n
    return Buffer(name, tuple(size), tuple(stride), torch.float32, torch.device("cpu"))


def program():
    """``x = relu(a); y = wait(all_gather(x)); z = mm(b, b); return y + 1, z``, in traced order."""
    a, b = buf("arg0", 4, 4), buf("arg1", 4, 4)
    x, gathered, ready, z, out = buf("buf0", 4, 4), buf("buf1", 8, 4), buf("buf2", 8, 4), \
        buf("buf3", 4, 4), buf("buf4", 8, 4)
    lines = [
        Allocate(x), CallExtern(aten.relu.out, (a,), (("out", x),)),
        Allocate(gathered),
        CallCollective(c10d.all_gather_into_tensor_out.default, (x, 2, "0"), (("out", gathered),)),
        WaitCollective(ready, gathered, (x,)),
        Allocate(out), CallExtern(aten.add.out, (ready, 1), (("out", out),)),
        Allocate(z), CallExtern(aten.mm.out, (b, b), (("out", z),)),
        Return((out, z)),
    ]
    return [a, b], lines


def test_overlap_moves_independent_work_between_the_collective_and_its_wait():
    _, lines = program()
    moved = overlap_collectives(lines)
    kinds = [type(line).__name__ for line in moved]
    issued, waited = kinds.index("CallCollective"), kinds.index("WaitCollective")
    between = [line for line in moved[issued + 1:waited] if isinstance(line, CallExtern)]
    assert [str(line.op) for line in between] == ["aten.mm.out"]
    # the reader of the ready value stays after the wait, and the pass is deterministic
    add = next(i for i, line in enumerate(moved) if getattr(line, "op", None) is aten.add.out)
    assert add > waited
    assert overlap_collectives(program()[1]) == moved
    plain = lines[:2]
    assert overlap_collectives(plain) is plain  # no collective: the lines as they are


def test_what_is_in_flight_is_freed_and_reused_only_after_the_wait():
    _, lines = program()
    planned = plan_memory(overlap_collectives(lines)).lines
    waited = next(i for i, line in enumerate(planned) if isinstance(line, WaitCollective))
    for line in planned[:waited]:
        if isinstance(line, (Free, Reuse)):
            assert {b.name for b in line.reads()}.isdisjoint({"buf0", "buf1"}), program_source([], planned)
    # the ready value is the gathered storage: one storage, freed once after the last read
    frees = [line.buf.name for line in planned if isinstance(line, Free)]
    assert "buf2" not in frees and frees.count("buf1") == 1


def test_collective_lines_print_and_convert_to_fx():
    inputs, lines = program()
    text = program_source(inputs, overlap_collectives(lines))
    assert "_c10d_functional.all_gather_into_tensor_out.default(buf0, 2, '0', out=buf1)  # collective" in text
    assert "buf2 = _c10d_functional.wait_tensor.default(buf1)  # wait for buf1 (in flight: buf0)" in text
    gm = to_graph_module(inputs, plan_memory(overlap_collectives(lines)).lines, guard=False)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert c10d.all_gather_into_tensor_out.default in targets and c10d.wait_tensor.default in targets
    wait = next(n for n in gm.graph.nodes if n.target is c10d.wait_tensor.default)
    add = next(n for n in gm.graph.nodes if n.target is aten.add.out)
    assert add.args[0] is wait  # readers read the wait's node
    assert wait.is_impure()  # dead-code elimination keeps a wait even when nothing reads it


def test_a_program_with_a_collective_is_not_captured_into_a_cuda_graph():
    _, lines = program()
    collective = next(line for line in lines if isinstance(line, CallCollective))
    assert "communicates" in collective.host_readback()
    assert collective.fusion_barrier and not collective.metadata_only
    wait = next(line for line in lines if isinstance(line, WaitCollective))
    assert not wait.metadata_only and wait.writes() == [wait.tensor] and wait.defines() == [wait.buf]
