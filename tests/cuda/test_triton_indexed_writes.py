"""In-place indexed writes through the Triton emitter (``tl.store`` at computed offsets,
``tl.atomic_add`` where they accumulate): the cases of ``tests/indexed_write_cases.py`` on
``triton-interpret`` (CPU tensors) or, with a GPU, ``cuda``.  On a GPU a decode step with a
KV cache is profiled too: no kernel touches the whole cache.

GPU: ``python -m pytest -q tests/cuda/test_triton_indexed_writes.py``.
"""
from __future__ import annotations

import pytest
import torch

import indexed_write_cases as cases

CUDA = torch.cuda.is_available()
TARGET = "cuda" if CUDA else "triton-interpret"
DEVICE = "cuda" if CUDA else "cpu"


def test_kv_cache_write_touches_only_the_new_row(tmp_path):
    cases.kv_cache_steps(TARGET, DEVICE, tmp_path=tmp_path)


def test_kv_cache_write_dynamic():
    cases.kv_cache_steps(TARGET, DEVICE, dynamic=True)


@pytest.mark.parametrize("dynamic", [False, True])
def test_index_put_accumulate_and_repeated_positions(dynamic):
    cases.run_index_put(TARGET, DEVICE, dynamic)


def test_scatters_into_inputs():
    cases.run_scatter(TARGET, DEVICE)


def test_slice_of_a_mutated_input_is_written_in_place(tmp_path):
    cases.run_slice_write(TARGET, DEVICE, tmp_path)


def test_writes_through_views_of_a_mutated_input():
    cases.run_view_writes(TARGET, DEVICE)


def test_old_value_read_after_the_write_keeps_a_copy():
    cases.run_read_after_write(TARGET, DEVICE)


def test_value_read_before_the_write_keeps_the_old_values():
    cases.run_earlier_reader(TARGET, DEVICE)


def test_backward():
    cases.run_backward(TARGET, DEVICE)


@pytest.mark.skipif(not CUDA, reason="profiles CUDA kernels: needs a GPU")
def test_decode_step_profile_has_no_kernel_over_the_whole_cache():
    """A decode step (bf16, a KV cache of 8 x 8192 x 64 per layer, 2 layers) under
    ``torch.compile(backend="fxwrap")``: every write is a kernel over the new token's row,
    so no kernel's time grows with the cache: the longest kernel that writes a cache takes
    a small fraction of one pass over it, and no ``index_put`` / ``copy_`` runs on the device."""
    torch.manual_seed(0)
    layers, heads, length, dim = 2, 8, 8192, 64

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(layers):
                self.register_buffer(f"k{i}", torch.zeros(1, heads, length, dim, device="cuda", dtype=torch.bfloat16))
                self.register_buffer(f"v{i}", torch.zeros(1, heads, length, dim, device="cuda", dtype=torch.bfloat16))

        def forward(self, pos, x):
            for i in range(layers):
                k_cache, v_cache = getattr(self, f"k{i}"), getattr(self, f"v{i}")
                k_cache.index_copy_(2, pos, x * (i + 1))
                v_cache.index_copy_(2, pos, x - i)
                x = torch.nn.functional.scaled_dot_product_attention(x, k_cache, v_cache)
            return x

    model, eager = Decoder(), Decoder()
    f, programs = cases.compiled(model, "cuda")
    x = torch.randn(1, heads, 1, dim, device="cuda", dtype=torch.bfloat16)
    for p in range(3):
        pos = torch.tensor([p], device="cuda")
        torch.testing.assert_close(f(pos, x), eager(pos, x), rtol=2e-2, atol=2e-2)
    for i in range(layers):
        torch.testing.assert_close(getattr(model, f"k{i}"), getattr(eager, f"k{i}"), rtol=0, atol=0)
    assert not cases.write_externs(programs), cases.write_externs(programs)
    cache_bytes = heads * length * dim * 2
    assert not cases.allocations_of(programs, (1, heads, length, dim))
    pos = torch.tensor([7], device="cuda")
    f(pos, x)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        f(pos, x)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = [e.name for e in events]
    assert not any("index_put" in n or "indexing_backward" in n or "index_copy" in n for n in names), names
    writes = [e for e in events if "fxwrap_pointwise" in e.name]
    assert writes, names
    # one pass over an 8 MiB cache at ~3 TB/s is ~5 us read + write; the row write moves 1 KiB
    longest = max(e.device_time_total for e in writes)
    copy = torch.empty(cache_bytes // 2, device="cuda", dtype=torch.bfloat16)
    src = torch.randn_like(copy)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as ref:
        for _ in range(5):
            copy.copy_(src)
        torch.cuda.synchronize()
    full = min(e.device_time_total for e in ref.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"longest fxwrap_pointwise kernel {longest:.2f} us; a copy of one cache {full:.2f} us")
    assert longest < full, (longest, full)
