"""The checks of ``fxwrap.testing.checks``, each shown failing on a program broken the way
it guards against (and passing on the unbroken program)."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

import fxwrap
from fxwrap.testing import check_memory_plan, check_ran_in_kernels, check_same_output
from fxwrap.testing.ops import OP_CASES_BY_ID
from fxwrap.ir.lines import Allocate, Comment, Free, buffers_read

aten = torch.ops.aten


def chain(x):
    y = torch.softmax(x * 2, -1)
    return (y.exp() + x).sum(0).sin(), y.amax(1)


@pytest.fixture
def program():
    torch._dynamo.reset()
    p = fxwrap.lower(chain, torch.randn(12, 20), target="cpu")
    check_memory_plan(p)  # the unbroken program passes
    assert any(isinstance(line, Free) for line in p.lines)
    return p


def with_lines(program, lines):
    return dataclasses.replace(program, lines=lines)


def test_a_missing_free_is_a_leak(program):
    first_free = next(i for i, line in enumerate(program.lines) if isinstance(line, Free))
    broken = with_lines(program, program.lines[:first_free] + program.lines[first_free + 1:])
    with pytest.raises(AssertionError, match=r"memory plan of the x on target 'cpu':\n  storages \['buf\d+'\] are "
                                             r"neither freed nor returned"):
        check_memory_plan(broken, "x")


def test_a_free_before_the_last_use_is_a_use_after_free(program):
    lines = list(program.lines)
    i = next(i for i, line in enumerate(lines) if isinstance(line, Free))
    freed = lines[i].buf.name
    first_use = next(j for j, line in enumerate(lines) if j < i and freed in {b.name for b in buffers_read(line)}
                     and not isinstance(line, Allocate))
    lines.insert(first_use, lines.pop(i))
    with pytest.raises(AssertionError, match=f"uses {freed} after its storage {freed} was freed"):
        check_memory_plan(with_lines(program, lines))


def test_a_second_free_is_reported(program):
    lines = list(program.lines)
    i = next(i for i, line in enumerate(lines) if isinstance(line, Free))
    lines.insert(i + 1, lines[i])
    with pytest.raises(AssertionError, match="a second time"):
        check_memory_plan(with_lines(program, lines))


def test_freeing_an_input_is_reported(program):
    arg = program.inputs[0]
    lines = list(program.lines)
    lines.insert(len(lines) - 1, Free(arg))
    with pytest.raises(AssertionError, match=r"\['arg0'\] are freed but the program did not create them"):
        check_memory_plan(with_lines(program, lines))


@pytest.mark.parametrize("peak,message", [(10 ** 9, "above the sum of all storages"),
                                          (1, "below the largest storage")])
def test_a_peak_out_of_bounds_is_reported(program, peak, message):
    memory = dataclasses.replace(program.memory, peak_bytes=peak, peak_bytes_frees_only=10 ** 9)
    with pytest.raises(AssertionError, match=message):
        check_memory_plan(dataclasses.replace(program, memory=memory))


def test_a_peak_above_the_plan_without_reuse_is_reported(program):
    memory = dataclasses.replace(program.memory, peak_bytes_frees_only=program.peak_bytes - 1)
    with pytest.raises(AssertionError, match="reuse must never raise the peak"):
        check_memory_plan(dataclasses.replace(program, memory=memory))


def test_ran_in_kernels_counts_kernels_and_names_externs():
    torch._dynamo.reset()
    x = torch.randn(8, 24)
    sin = OP_CASES_BY_ID["sin[float32]"]
    check_ran_in_kernels(fxwrap.lower(sin.fn, x, target="cpu"), sin.ops, 1, "sin")
    # the op and one more kernel: a wrong count, though no extern
    two_kernels = fxwrap.lower(lambda t: (t.sin(), t.sum(0)), x, target="cpu")
    with pytest.raises(AssertionError, match=r"sin on target 'cpu': 2 generated kernel launches .*, the op needs 1"):
        check_ran_in_kernels(two_kernels, sin.ops, 1, "sin")
    # every op an extern (kernels=False): the op itself is named, with its out= overload
    externs = fxwrap.lower(sin.fn, x, target="cpu", options={"kernels": False})
    with pytest.raises(AssertionError, match=r"the op ran as an ATen extern call \(aten\.sin\.out\)"):
        check_ran_in_kernels(externs, sin.ops, 1, "sin")
    # another op an extern, the op in a kernel: still not "the op needs nothing but kernels"
    mixed = fxwrap.lower(lambda t: t.sin() @ t.t(), x, target="cpu")
    with pytest.raises(AssertionError, match=r"calls ATen ops as externs \(aten\.mm\.out\)"):
        check_ran_in_kernels(mixed, sin.ops, 1, "sin")


def test_same_output_names_the_first_differing_line(program):
    check_same_output([program], [program], "chain")
    other = with_lines(program, [Comment("a counter: 2"), *program.lines])
    with pytest.raises(AssertionError, match=r"chain on target 'cpu': program.code\(\) differs .*\n  line 2: "):
        check_same_output([program], [other], "chain")


def test_import_fxwrap_imports_neither_the_kit_nor_pytest():
    code = ("import sys, fxwrap; bad = [m for m in ('fxwrap.testing', 'pytest', '_pytest') if m in sys.modules]; "
            "assert not bad, bad")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("check, message", [
    ("static_not_copied", "static inputs are not the module's parameter|the buffer write is not in the module"),
    ("static_write_visible", "the buffer write is not in the module's buffer"),
])
def test_graph_capture_checks_catch_a_device_that_copies_static_inputs(monkeypatch, check, message):
    """A device whose recordings run on copies of every input (the stale-copy bug issue 27
    removed) fails the kit's static-input checks; the real CPU launch list passes them."""
    from fxwrap.runtime.launch_list import LaunchListCapture
    from fxwrap.targets.host.device import CpuDevice
    from fxwrap.testing.capture import CAPTURE_CHECKS

    torch._dynamo.reset()
    CAPTURE_CHECKS[check]("cpu", torch.device("cpu"))  # the unbroken device passes

    class Copying(LaunchListCapture):
        def record(self, run, inputs):
            return super().record(run, [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs])

    monkeypatch.setattr(CpuDevice, "graph_capture", lambda self: Copying("cpu"))
    torch._dynamo.reset()
    with pytest.raises(AssertionError, match=message):
        CAPTURE_CHECKS[check]("cpu", torch.device("cpu"))
