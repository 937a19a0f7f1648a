"""In-place indexed writes through the Metal target (``mps_shim``: the Metal source
compiled against the C++ shim): the cases of ``tests/indexed_write_cases.py``.  Metal
renders plain indexed writes; accumulating ones (``index_put(accumulate=True)``,
``scatter_add``) stay the ATen op there, on a copy, with eager's numbers."""
from __future__ import annotations

import shutil

import pytest
import torch

import indexed_write_cases as cases

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the Metal shim needs g++")
TARGET = "mps_shim"


def test_kv_cache_write_touches_only_the_new_row(tmp_path):
    cases.kv_cache_steps(TARGET, "cpu", tmp_path=tmp_path)


def test_kv_cache_write_dynamic():
    cases.kv_cache_steps(TARGET, "cpu", dynamic=True)


def test_slice_of_a_mutated_input_is_written_in_place(tmp_path):
    cases.run_slice_write(TARGET, "cpu", tmp_path)


def test_writes_through_views_of_a_mutated_input():
    cases.run_view_writes(TARGET, "cpu")


def test_old_value_read_after_the_write_keeps_a_copy():
    cases.run_read_after_write(TARGET, "cpu")


def test_value_read_before_the_write_keeps_the_old_values():
    cases.run_earlier_reader(TARGET, "cpu")


def test_scatter_plain_write_is_a_kernel_accumulating_ones_stay_externs():
    def fn(x, index, src, y):
        x.scatter_(1, index, src)
        y.scatter_add_(1, index, src)
        return x.sum(0), y.sum(0)
    x, y = torch.randn(6, 9), torch.randn(6, 9)
    index = torch.stack([torch.randperm(9)[:4] for _ in range(6)])
    index[:, 0] = index[:, 1]
    src = torch.randn(6, 4)
    src[:, 0] = src[:, 1]
    ex, ey = x.clone(), y.clone()
    f, programs = cases.compiled(fn, TARGET)
    for g, e in zip(f(x, index, src, y), fn(ex, index, src, ey)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x, ex, rtol=0, atol=0)
    torch.testing.assert_close(y, ey, rtol=1e-6, atol=1e-6)
    externs = cases.write_externs(programs)
    assert not [e for e in externs if "scatter.src" in e or "scatter_.src" in e], externs
    assert any("scatter_add" in e for e in externs), externs
