"""Cases of in-place indexed writes (``core/rules/indexed_writes.py``, ``core/reinplace.py``)
shared by every target's tests: ``tests/cpu/test_indexed_writes.py`` (cpu, reference),
``tests/mps/test_mps_indexed_writes.py`` (mps_shim), ``tests/cuda/test_triton_indexed_writes.py``
(triton-interpret, or cuda on a GPU).

Each case compiles with ``torch.compile(backend=fxwrap.Backend(target, ...))``, compares
with eager on fresh random inputs, and checks the structure: no extern for the write, no
allocation of the written tensor's size, and a kernel whose loop ranges are the source's
(the debug dump's loop IR: ``ranges=(...)`` of the kernel storing ``arg0[%n] = ...``), so
the kernel visits only the elements it writes; the sentinel check then proves every other
byte of the tensor unchanged.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

import fxwrap
import shared_helpers
from fxwrap.ir.lines import Allocate, CallExtern

aten = torch.ops.aten
WRITE_OPS = {aten.index_put, aten.index_put_, aten.index_copy, aten.index_copy_, aten.scatter, aten.scatter_,
             aten.scatter_add, aten.scatter_add_, aten.scatter_reduce, aten.scatter_reduce_, aten.index_add,
             aten.index_add_, aten.copy_}


class KVCache(torch.nn.Module):
    """A decode step with a static KV cache in module buffers, written with ``index_copy_``."""

    def __init__(self, batch=2, heads=3, length=16, dim=8, device="cpu"):
        super().__init__()
        self.register_buffer("k_cache", torch.randn(batch, heads, length, dim, device=device))
        self.register_buffer("v_cache", torch.randn(batch, heads, length, dim, device=device))

    def forward(self, pos, q, k, v):
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        scores = (q * self.k_cache).sum(-1)          # (B, H, S)
        weights = torch.softmax(scores, -1)
        return (weights.unsqueeze(-1) * self.v_cache).sum(2)


def compiled(fn, target, dynamic=False, debug_dir=None):
    programs = []
    options = {"on_program": programs.append}
    if debug_dir is not None:
        options["debug_dir"] = str(debug_dir)
    return torch.compile(fn, backend=fxwrap.Backend(target, options), dynamic=dynamic), programs


def write_externs(programs) -> list:
    """The extern calls of an indexed write or a copy (what the kernels replace)."""
    return [str(ln.op) for p in programs for ln in p.lines
            if isinstance(ln, CallExtern) and getattr(ln.op, "overloadpacket", None) in WRITE_OPS]


def allocations_of(programs, size) -> list:
    return [str(ln.buf.name) for p in programs for ln in p.lines
            if isinstance(ln, Allocate) and tuple(int(n) if n.is_number else n for n in ln.buf.size) == tuple(size)]


def indexed_kernel_ranges(debug_dir) -> list[tuple]:
    """The loop ranges of every kernel of the dumped programs that makes an indexed store
    (``buf[%n] = ...``), from their ``loop_ir.txt``."""
    found = []
    for path in sorted(Path(debug_dir).rglob("loop_ir.txt")):
        for block in path.read_text().split("\n\n"):
            head = block.splitlines()[0] if block.strip() else ""
            if re.search(r"^\s+\w+\[%\d+\] \+?= %\d+$", block, re.M):
                ranges = re.search(r"ranges=\(([^)]*)\)", head).group(1)
                found.append(tuple(int(n) for n in ranges.replace(" ", "").split(",") if n))
    return found


def check_untouched(before: torch.Tensor, after: torch.Tensor, touched: torch.Tensor) -> None:
    """Every element outside ``touched`` (a bool mask) is bit for bit what it was."""
    as_int = {2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()]
    same = before.view(as_int) == after.view(as_int)
    assert bool(same[~touched].all()), "an element the write does not touch changed"


def kv_cache_steps(target, device, dynamic=False, tmp_path=None, steps=(0, 5, 15, 3)):
    """Several decode steps against eager: outputs, both caches bit for bit, untouched
    rows unchanged; the structure of the compiled program."""
    torch.manual_seed(0)
    model = KVCache(device=device)
    eager = KVCache(device=device)
    eager.load_state_dict(model.state_dict())
    f, programs = compiled(model, target, dynamic, tmp_path)
    for p in steps:
        pos = torch.tensor([p], device=device)
        q, k, v = (torch.randn(2, 3, 1, 8, device=device) for _ in range(3))
        before = model.k_cache.clone()
        got, want = f(pos, q, k, v), eager(pos, q, k, v)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.k_cache, eager.k_cache, rtol=0, atol=0)
        torch.testing.assert_close(model.v_cache, eager.v_cache, rtol=0, atol=0)
        touched = torch.zeros(model.k_cache.shape, dtype=torch.bool, device=device)
        touched[:, :, p] = True
        check_untouched(before, model.k_cache, touched)
    assert not write_externs(programs), write_externs(programs)
    assert not allocations_of(programs, model.k_cache.shape), "a buffer of the cache's size was allocated"
    assert len(shared_helpers.kernels(programs)) >= 2
    if tmp_path is not None and not dynamic:
        ranges = indexed_kernel_ranges(tmp_path)
        # each write's kernel iterates over the new row only: 2*3*1*8 = 48 elements, not the cache's 768
        assert ranges and all(math.prod(r) == 48 for r in ranges), ranges
    return programs


def index_put_cases(x, idx, v, dup_idx, rows, cols, w):
    """Writes into mutated inputs: accumulate with duplicate positions, a plain write whose
    duplicates carry equal values (eager keeps one of them), two index tensors, negative ones."""
    x.index_put_((dup_idx,), v, accumulate=True)
    rows_v = w[rows % w.shape[0]]                        # equal values at equal (wrapped) rows
    w.index_put_((rows,), rows_v * 2)
    x.index_put_((rows % x.shape[0], cols), torch.ones(rows.shape[0], device=x.device) * 3)
    return x.sum(0), w.sum(1)  # results of other sizes: an allocation of x's size would be a copy


def make_index_put_inputs(device, n=12, m=5):
    x = torch.randn(n, m, device=device)
    dup_idx = torch.tensor([1, 1, 4, 7, 1, 4], device=device)
    v = torch.randn(6, m, device=device)
    rows = torch.tensor([-1, 3, 3, 0, -12], device=device)
    cols = torch.tensor([0, 4, 4, 2, 1], device=device)
    w = torch.randn(n, m, device=device)
    return x, None, v, dup_idx, rows, cols, w


def run_index_put(target, device, dynamic=False):
    x, idx, v, dup_idx, rows, cols, w = make_index_put_inputs(device)
    ex, ew = x.clone(), w.clone()
    f, programs = compiled(index_put_cases, target, dynamic)
    got = f(x, idx, v, dup_idx, rows, cols, w)
    want = index_put_cases(ex, idx, v, dup_idx, rows, cols, ew)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x, ex, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w, ew, rtol=0, atol=0)
    assert not write_externs(programs), write_externs(programs)
    assert not allocations_of(programs, x.shape), "a copy of a written input was allocated"
    return programs


def scatter_cases(x, index, src, y, z):
    x.scatter_(1, index, src)             # repeated positions: each row's index has distinct values
    y.scatter_add_(1, index, src)
    z.scatter_reduce_(0, index[:3] % 6, src[:3], "sum")
    return x.sum(0), y.sum(0), z.sum(0)


def run_scatter(target, device, dynamic=False):
    x, y, z = (torch.randn(6, 9, device=device) for _ in range(3))
    index = torch.stack([torch.randperm(9, device=device)[:4] for _ in range(6)])
    index[:3, 0] = index[:3, 1]  # repeated positions (for the adds), with equal src below
    src = torch.randn(6, 4, device=device)
    src[:3, 0] = src[:3, 1]
    args = (x, index, src, y, z)
    eager_args = (x.clone(), index, src, y.clone(), z.clone())
    f, programs = compiled(scatter_cases, target, dynamic)
    got, want = f(*args), scatter_cases(*eager_args)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    for g, e in zip(args, eager_args):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert not write_externs(programs), write_externs(programs)
    assert not allocations_of(programs, x.shape), "a copy of a written input was allocated"
    return programs


def read_after_write(cache, idx, v):
    """``cache`` is an input the program does not write: the index_put result must live in a
    copy (the old value is returned too); ``view`` reads the old values after the write."""
    view = cache[:, :2] * 3
    new = cache.index_put((idx,), v)
    return new.sum(0), view, cache + 1


def run_read_after_write(target, device):
    cache = torch.randn(7, 4, device=device)
    idx = torch.tensor([2, 5], device=device)
    v = torch.randn(2, 4, device=device)
    before = cache.clone()
    f, programs = compiled(read_after_write, target)
    got, want = f(cache, idx, v), read_after_write(before.clone(), idx, v)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cache, before, rtol=0, atol=0)  # the input is not written
    assert allocations_of(programs, cache.shape), "the copying path allocates the result"
    assert not write_externs(programs)
    return programs


def earlier_reader_then_write(cache, pos, v):
    """A lazy value of the cache made before the write and returned after it keeps the
    old values (realized before the in-place write)."""
    old = cache[:, :3] * 2
    cache.index_copy_(1, pos, v)
    return old, cache.sum(1)


def run_earlier_reader(target, device):
    cache = torch.randn(2, 6, 4, device=device)
    pos = torch.tensor([1], device=device)
    v = torch.randn(2, 1, 4, device=device)
    eager = cache.clone()
    f, programs = compiled(earlier_reader_then_write, target)
    got, want = f(cache, pos, v), earlier_reader_then_write(eager, pos, v)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cache, eager, rtol=0, atol=0)
    assert not allocations_of(programs, cache.shape)
    return programs


def with_grad(x, w, idx):
    y = x * 2
    y = y.index_put((idx,), w * 3, accumulate=True)
    return (y.sin() * torch.nn.functional.embedding(idx, x)[:1]).sum()


def run_backward(target, device):
    """Training: an accumulating write in the forward, and the backward's gathers and writes."""
    x = torch.randn(9, 5, device=device, requires_grad=True)
    w = torch.randn(4, 5, device=device, requires_grad=True)
    idx = torch.tensor([3, 3, 0, 8], device=device)
    ex, ew = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    f, programs = compiled(with_grad, target)
    got = f(x, w, idx)
    got.backward()
    want = with_grad(ex, ew, idx)
    want.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, ex.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad, ew.grad, rtol=1e-5, atol=1e-5)
    assert not write_externs(programs), write_externs(programs)
    return programs


def slice_write(cache, w):
    cache[:, 5:7] = w            # slice_scatter of a mutated input
    return cache.sum(1)


def run_slice_write(target, device, tmp_path):
    """A slice of a mutated input overwritten: a kernel over the slice's elements only."""
    cache = torch.randn(2, 16, 8, device=device)
    w = torch.randn(2, 2, 8, device=device)
    eager = cache.clone()
    before = cache.clone()
    f, programs = compiled(slice_write, target, debug_dir=tmp_path)
    torch.testing.assert_close(f(cache, w), slice_write(eager, w), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(cache, eager, rtol=0, atol=0)
    touched = torch.zeros(cache.shape, dtype=torch.bool, device=device)
    touched[:, 5:7] = True
    check_untouched(before, cache, touched)
    assert not write_externs(programs), write_externs(programs)
    assert not allocations_of(programs, cache.shape)
    ranges = indexed_kernel_ranges(tmp_path)
    assert ranges and all(math.prod(r) == w.numel() for r in ranges), ranges
    return programs


def view_writes(cache, pos, v, w):
    """Writes through views of a mutated input: ``index_copy_`` into ``cache[1]`` (the view
    is written through a copy, then put back by a slice write in place) and an accumulating
    ``index_put_`` into ``cache[:, 2:4]``."""
    cache[1].index_copy_(1, pos, v)
    cache[:, 2:4].index_put_((torch.tensor([0, 2, 0], device=cache.device),), w, accumulate=True)
    return cache.sum(0)


def run_view_writes(target, device):
    cache = torch.randn(3, 4, 6, 3, device=device)
    pos = torch.tensor([2, 5], device=device)
    v, w = torch.randn(4, 2, 3, device=device), torch.randn(3, 2, 6, 3, device=device)
    eager = cache.clone()
    f, programs = compiled(view_writes, target)
    torch.testing.assert_close(f(cache, pos, v, w), view_writes(eager, pos, v, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache, eager, rtol=1e-6, atol=1e-6)
    return programs
