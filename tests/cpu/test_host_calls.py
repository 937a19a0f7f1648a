"""The host work of a CPU program's call (``targets/cpu_cpp/wrapper.CpuWrapper``,
``runtime/direct.direct_graph_module(pointer_kernel=...)``): views only C++ kernels read are
not made (the kernel gets the base: same data pointer), ``free`` markers are left out,
allocations call ``_empty_strided_cpu``.  Structure of the runner's graph, and numbers against
eager with inputs at storage offsets, views returned, dynamic sizes and the launch list."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.runtime.arena import arena_range
from fxwrap.runtime.checks import check_index_bounds
from fxwrap.runtime.direct import empty_strided_cpu, view_of
from fxwrap.runtime.launch_list import record_launches
from fxwrap.runtime.memory import free
from fxwrap.targets.cpu_cpp.wrapper import CpuWrapper, reads_data_pointers


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def _decoder_like(x, w1, w2, w3):
    h = F.linear(x, w1)                       # views of the weights (transposes) read by GEMM kernels
    h = F.silu(h) * F.linear(x, w3)
    y = F.linear(h, w2) + x
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)


def _weights(dim=32, hidden=48):
    return torch.randn(hidden, dim), torch.randn(dim, hidden), torch.randn(hidden, dim)


def _lower(fn, *args, **kw):
    # templates always: the matrix products are C++ kernels (an mm extern reads its views itself)
    return fxwrap.lower(fn, *args, target="cpu", options={"cache": False, "templates": "always"}, **kw)


def test_views_only_kernels_read_are_not_made():
    w1, w2, w3 = _weights()
    x = torch.randn(1, 32)
    program = _lower(_decoder_like, x, w1, w2, w3)
    contract, runner = program.graph_module, program.runner
    assert _calls(contract, torch.as_strided), contract.code  # the weights' transposes: View lines
    assert not _calls(runner, torch.as_strided) and not _calls(runner, view_of), runner.code
    for _ in range(2):
        x = torch.randn(1, 32)
        torch.testing.assert_close(program.run(x, w1, w2, w3), _decoder_like(x, w1, w2, w3), rtol=1e-4, atol=1e-4)


def test_views_kept_where_something_else_reads_them():
    """A view an extern reads (SDPA), and a view returned, are made; the numbers are eager's."""
    def f(q, k, v):
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return a.transpose(1, 2) * 2, (q * 3).transpose(0, 2)

    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    program = _lower(f, q, k, v)
    runner = program.runner
    for node in _calls(runner, view_of):  # each view left has a reader that needs the tensor itself
        assert any(not (u.op == "call_function" and isinstance(u.target, fxwrap.Kernel)
                        and reads_data_pointers(u.target)) for u in node.users), runner.code
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    got, want = program.run(q, k, v), f(q, k, v)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride()
        torch.testing.assert_close(g, w)


def test_inputs_at_storage_offsets_and_offset_views():
    """Views of inputs at offsets (slices): where the view's first element is not its base's
    the view is made (or the kernel indexes from the base); numbers equal eager's."""
    def f(x, w):
        return torch.exp(x[1:, 2:]) @ w.t() + x[:-1, :-2].sum()

    x, w = torch.randn(9, 12), torch.randn(6, 10)
    program = _lower(f, x[1:], w)
    y = torch.randn(10, 12)
    torch.testing.assert_close(program.run(y[2:], w), f(y[2:], w), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(program.run(y[:8], w), f(y[:8], w), rtol=1e-4, atol=1e-4)


def test_no_free_markers_and_unchecked_allocations():
    w1, w2, w3 = _weights()
    program = _lower(_decoder_like, torch.randn(1, 32), w1, w2, w3)
    contract, runner = program.graph_module, program.runner
    assert _calls(contract, free) and _calls(contract, torch.empty_strided)
    assert not _calls(runner, free) and not _calls(runner, torch.empty_strided), runner.code
    # each allocation: unchecked, or a range of the arena (tests/cpu/test_runner_arena.py)
    assert len(_calls(runner, empty_strided_cpu)) + len(_calls(runner, arena_range)) == len(
        _calls(contract, torch.empty_strided))


def test_dynamic_sizes():
    w1, w2, w3 = _weights()
    program = _lower(_decoder_like, torch.randn(3, 32), w1, w2, w3, dynamic=True)
    assert not _calls(program.runner, torch.as_strided) and not _calls(program.runner, view_of)
    for rows in (3, 5, 2, 17):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(program.run(x, w1, w2, w3), _decoder_like(x, w1, w2, w3), rtol=1e-4, atol=1e-4)


def test_launch_list_of_the_runner_allocates_nothing_per_replay():
    w1, w2, w3 = _weights()
    x = torch.randn(1, 32)
    program = _lower(_decoder_like, x, w1, w2, w3)
    runner = CpuWrapper(program.target).compile_graph_per_call(program.graph_module)  # what capture records
    kernels = [n for n in runner.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    launches, outputs = record_launches(runner, program.arguments([x, w1, w2, w3]))
    assert len(launches.calls) == len(kernels)  # launches only: no allocation, view or check replayed
    x.copy_(torch.randn(1, 32))
    launches.replay()
    torch.testing.assert_close(outputs[0], _decoder_like(x, w1, w2, w3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("negative_ok", [False, True])
def test_one_element_index_check_reads_the_value(monkeypatch, negative_ok):
    """A one-element index (a decode step's position) is checked by reading its value, no
    reduction; out-of-range values still raise, as eager does."""
    def no_reduction(*args, **kwargs):
        raise AssertionError("aminmax called for a one-element index")

    monkeypatch.setattr(torch, "aminmax", no_reduction)
    for value in (0, 5, 7) + ((-8, -1) if negative_ok else ()):
        check_index_bounds(torch.tensor([value]), 8, 0, negative_ok)
    for value in (8, 100) + ((-9,) if negative_ok else (-1,)):
        with pytest.raises(IndexError, match=f"index {value} is out of bounds for dimension 0 with size 8"):
            check_index_bounds(torch.tensor([[value]]), 8, 0, negative_ok)
    monkeypatch.undo()
    with pytest.raises(IndexError):
        check_index_bounds(torch.tensor([1, 9, 2]), 8, 0, negative_ok)


def test_wrapper_names_the_emitters_language():
    from fxwrap.targets.cpu_cpp.emitter import CppEmitter
    from fxwrap.targets.cpu_cpp.wrapper import CPP
    assert CPP == CppEmitter.language
