"""In-place indexed writes as kernels on the ``cpu`` and ``reference`` targets: a KV-cache
write (``index_copy_`` on module buffers), ``index_put_`` with and without ``accumulate``
and repeated positions, ``scatter_`` / ``scatter_add_`` / ``scatter_reduce_``, ``dynamic=True``,
a backward, the copying path where the old value is read after the write, and indices out
of range.  The cases: ``tests/indexed_write_cases.py``."""
from __future__ import annotations

import pytest
import torch

import indexed_write_cases as cases

TARGETS = ["cpu", "reference"]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("target", TARGETS)
def test_kv_cache_write_touches_only_the_new_row(target, tmp_path):
    cases.kv_cache_steps(target, "cpu", tmp_path=tmp_path)


@pytest.mark.parametrize("target", TARGETS)
def test_kv_cache_write_dynamic(target):
    cases.kv_cache_steps(target, "cpu", dynamic=True)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_index_put_accumulate_and_repeated_positions(target, dynamic):
    cases.run_index_put(target, "cpu", dynamic)


@pytest.mark.parametrize("target", TARGETS)
def test_scatters_into_inputs(target):
    cases.run_scatter(target, "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_old_value_read_after_the_write_keeps_a_copy(target):
    cases.run_read_after_write(target, "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_value_read_before_the_write_keeps_the_old_values(target):
    cases.run_earlier_reader(target, "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_backward(target):
    cases.run_backward(target, "cpu")


@pytest.mark.parametrize("target", TARGETS)
def test_slice_of_a_mutated_input_is_written_in_place(target, tmp_path):
    cases.run_slice_write(target, "cpu", tmp_path)


@pytest.mark.parametrize("target", TARGETS)
def test_writes_through_views_of_a_mutated_input(target):
    cases.run_view_writes(target, "cpu")


def test_bf16_accumulate_matches_eager_bit_for_bit():
    """The C++ accumulating kernel is serial and rounds each addition to bf16, as eager's CPU kernel."""
    def fn(x, idx, v):
        x.index_put_((idx,), v, accumulate=True)
        return x + 0
    x = torch.randn(10, 6).bfloat16()
    idx = torch.randint(0, 10, (40,))
    v = torch.randn(40, 6).bfloat16()
    ex = x.clone()
    f, programs = cases.compiled(fn, "cpu")
    torch.testing.assert_close(f(x, idx, v), fn(ex, idx, v), rtol=0, atol=0)
    assert not cases.write_externs(programs)


def test_out_of_range_position_raises_and_writes_nothing():
    cache = torch.randn(2, 6, 4)
    v = torch.randn(2, 1, 4)

    def fn(cache, pos, v):
        cache.index_copy_(1, pos, v)
        return cache.sum()
    f, _ = cases.compiled(fn, "cpu")
    f(cache, torch.tensor([2]), v)
    before = cache.clone()
    with pytest.raises(IndexError, match="out of bounds"):
        f(cache, torch.tensor([6]), v)
    torch.testing.assert_close(cache, before, rtol=0, atol=0)
