"""Differential tests of the indexing lowerings (cat, constant_pad_nd, gather,
embedding, index, index_select, iota, copy_) against eager, on the ``cpu`` and
``reference`` targets, with a check that each op ran as a generated kernel.

Data movement is exact, so these compare bit for bit; every run draws fresh
random inputs (and fresh random indices).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import Allocate

import test_lowerings as harness
from test_lowerings import make

aten = torch.ops.aten
TARGETS = ["cpu", "reference"]
EXACT = dict(rtol=0, atol=0)
# (dtype, layout): every layout in float32, one layout per other dtype
CASES = [(torch.float32, lay) for lay in harness.LAYOUTS] + [
    (torch.float64, "transposed"), (torch.bfloat16, "sliced"), (torch.int64, "broadcast"),
    (torch.int32, "contiguous")]


@pytest.fixture(params=TARGETS)
def target(request, monkeypatch):
    monkeypatch.setattr(harness, "TARGET", request.param)
    return request.param


def rand_like_dtype(shape, dtype):
    t = torch.randn(shape) * 4
    return t.to(dtype) if dtype.is_floating_point else t.round().to(dtype)


def source(layout, dtype):
    x = make(layout, torch.float32, scale=4.0)
    return x.to(dtype) if dtype.is_floating_point else x.round().to(dtype)


def extern_ops(programs) -> set:
    return {n.target for p in programs for n in p.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


def run(fn, args, dynamic, lowered, tol=EXACT):
    """Compare with eager; assert no op of ``lowered`` is left as an extern call."""
    programs = harness.check(fn, args, dynamic, tol)
    left = {op for op in extern_ops(programs) if op.overloadpacket in lowered}
    assert not left, f"ran as externs, not kernels: {left}"
    return programs


def cat_pad(x, y, z):
    lazy = x * 2 if x.dtype != torch.bool else x
    return (torch.cat([x, y], 0), torch.cat([z, lazy, z], 1) + 1, torch.cat([y, x, y], 0)[3:40],
            F.pad(x, (1, 2, 3, 0)), F.pad(lazy, (-2, 3), value=5), F.pad(x, (0, 0, 2, -4)) * 3,
            torch.cat([x[:, :4], x[:, -4:]], 1))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype, layout", CASES)
def test_cat_and_pad(target, dtype, layout, dynamic):
    x = source(layout, dtype)  # (37, 65)
    y, z = rand_like_dtype((5, 65), dtype), rand_like_dtype((37, 3), dtype)
    run(cat_pad, (x, y, z), dynamic, {aten.cat, aten.constant_pad_nd})


def gathers(x, g1, g0, rows, cols, signed):
    n, m = x.shape
    return (torch.gather(x, 1, g1), torch.gather(x, 0, g0) + 1, torch.gather(x * 2, 1, g1 % m),
            F.embedding(rows, x), F.embedding(rows.view(2, 3), x) * 2, x[signed],
            x[signed.view(2, 2)] + 1, x[:, cols], torch.index_select(x, 0, rows),
            torch.index_select(x, 1, cols), torch.index_select(x, 1, cols[0]),
            # lazy sources: read at the indices without being stored (read_lazy), or stored
            # first where a reshape splits the indexed dimension (not affine in the index)
            (x + 1).t()[signed % m], torch.index_select((x * 2).reshape(-1, 5), 0, rows),
            torch.gather((x - 1).t(), 0, g0.t()[:, :n]))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype, layout", CASES)
def test_gather_embedding_index(target, dtype, layout, dynamic):
    x = source(layout, dtype)
    n, m = x.shape
    g1, g0 = torch.randint(0, m, (n, 20)), torch.randint(0, n, (10, m))
    rows, cols = torch.randint(0, n, (6,)), torch.randint(0, m, (9,), dtype=torch.int32)
    signed = torch.randint(-n, n, (4,))
    run(gathers, (x, g1, g0, rows, cols, signed), dynamic,
        {aten.gather, aten.embedding, aten.index, aten.index_select})


@pytest.mark.parametrize("dynamic", [False, True])
def test_cross_entropy_reads_log_probabilities_at_the_targets_only(target, dynamic):
    """``log_softmax`` feeding the target gather is computed for the one element per row
    that is read (from the row's max and log-sum-exp), not stored for every element."""
    logits, targets = torch.randn(64, 1000) * 3, torch.randint(0, 1000, (64,))
    targets[::7] = -100  # ignored rows
    programs = harness.check(lambda x, t: (F.cross_entropy(x, t),), (logits, targets), dynamic,
                             dict(rtol=1e-5, atol=1e-5))
    sizes = [tuple(int(n) if n.is_number else n for n in line.buf.size)
             for p in programs for line in p.lines if isinstance(line, Allocate)]
    assert sizes and all(len(size) < 2 or size[1] != 1000 for size in sizes), sizes


def test_out_of_range_index_raises(target):
    x = torch.randn(6, 5)
    cases = [(lambda x, i: torch.gather(x, 1, i), torch.tensor([[0], [5]])),
             (lambda x, i: F.embedding(i, x), torch.tensor([-1, 2])),
             (lambda x, i: x[i], torch.tensor([-7])),
             (lambda x, i: torch.index_select(x, 0, i), torch.tensor([6])),
             (lambda x, i: x.scatter(1, i, 1.0), torch.tensor([[0], [1], [2], [5], [4], [3]]))]
    for fn, bad in cases:
        torch._dynamo.reset()
        f, programs = harness.compiled(fn, False)
        ok = bad.clamp(0, 4)
        torch.testing.assert_close(f(x, ok), fn(x, ok), **EXACT)  # compiles; in range works
        with pytest.raises(IndexError, match="out of bounds"):
            f(x, bad)
        with pytest.raises((IndexError, RuntimeError)):
            fn(x, bad)  # eager raises too


def scatters(x, src_cols, src_rows, row, one_hot):
    lazy = x * 2 if x.dtype != torch.bool else x
    return (torch.slice_scatter(x, src_cols, 1, 1, None, 2),           # strided, to the end
            torch.slice_scatter(lazy, src_rows, 0, -5) + 1,             # negative start, lazy base
            torch.slice_scatter(torch.zeros_like(x), src_cols[:, :20], 1, 3, 23),
            torch.select_scatter(x, row, 0, -1), torch.select_scatter(lazy, row[:37], 1, 4),
            x.scatter(1, one_hot, 7))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype, layout", CASES)
def test_slice_select_and_one_hot_scatter(target, dtype, layout, dynamic):
    """The slice's and select's backward (a gradient scattered into zeros) and the one-hot
    scatter of cross-entropy's gradient run as kernels, one pass over the result."""
    x = source(layout, dtype)  # (37, 65)
    src_cols, src_rows = rand_like_dtype((37, 32), dtype), rand_like_dtype((5, 65), dtype)
    row = rand_like_dtype((65,), dtype)
    one_hot = torch.randint(0, 65, (37, 1))
    run(scatters, (x, src_cols, src_rows, row, one_hot), dynamic,
        {aten.slice_scatter, aten.select_scatter, aten.scatter})


def test_scatter_of_several_positions_per_row_is_a_kernel(target):
    """A scatter with positions that repeat is a kernel over the index's elements, written
    into a copy of ``x`` (``x`` is read afterwards); no ATen op is left."""
    x, index = torch.randn(6, 11), torch.randint(0, 11, (6, 3))
    programs = harness.check(lambda x, i: (x.scatter(1, i, 2.0) + 1, x * 2), (x, index), False, EXACT)
    assert not {aten.scatter, aten.scatter_} & harness.extern_ops(programs)


@pytest.mark.parametrize("dynamic", [False, True])
def test_indexed_writes_run_in_place_on_a_buffer_of_the_program(target, dynamic):
    """Functional indexed writes (``index_put``, ``scatter_add``, ``index_add``, ...) are
    kernels storing into a buffer of the program that holds ``self``: a lazy ``self``
    (an embedding backward's zeros) is computed straight into it, so the program allocates
    one buffer of ``self``'s size, not two, and runs no ATen op for the write."""
    def fn(x, ids, grad, src, idx):
        table = torch.zeros(50, 8, dtype=grad.dtype).index_put((ids,), grad, accumulate=True)
        return (table, (x * 2).scatter_add(1, idx, src), (x + 1).index_add(0, ids[:4] % 6, x[:4] * 0.5,
                                                                             alpha=2),
                x.index_put((ids[:3] % 6,), torch.ones(7)), x * 3)
    x, ids, grad = torch.randn(6, 7), torch.randint(0, 50, (20,)), torch.randn(20, 8)
    src, idx = torch.randn(6, 4), torch.randint(0, 7, (6, 4))
    programs = harness.check(fn, (x, ids, grad, src, idx), dynamic, dict(rtol=1e-5, atol=1e-5))
    (program,) = programs
    tables = [ln for ln in program.lines if isinstance(ln, Allocate) and tuple(ln.buf.size) == (50, 8)]
    assert len(tables) == 1, [str(t) for t in tables]
    assert not {aten.index_put, aten.scatter_add, aten.index_add, aten.index_put_, aten.scatter_add_,
                aten.index_add_} & harness.extern_ops(programs)


def ranges(x, n: int):
    return (torch.arange(x.shape[0]) * 2 + 1, torch.arange(3, 3 + 4 * x.shape[1], 4, dtype=torch.float32),
            torch.ops.prims.iota(n, start=5, step=-2, dtype=torch.int64, device=x.device,
                                 requires_grad=False) + x[:n, 0].long())


@pytest.mark.parametrize("dynamic", [False, True])
def test_arange_iota(target, dynamic):
    x = torch.randn(11, 7) * 10
    programs = run(ranges, (x, 5), dynamic, {aten.arange, torch.ops.prims.iota})
    assert harness.kernel_count(programs) >= 1


def mutate_ordered(x, y):
    before = x.sum()       # reads x before the write
    flipped = x.t() + y    # reads x transposed: must not share a kernel with the write
    x.mul_(y)              # -> copy_(x, x * y) at the end of the graph
    return before, flipped, x * 3


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype, layout", [(torch.float32, "contiguous"), (torch.float32, "transposed"),
                                           (torch.bfloat16, "contiguous"), (torch.int64, "transposed")])
def test_copy_input_mutation(target, dtype, layout, dynamic):
    x = source(layout, dtype)[:, :37]  # square: x.t() + y
    y = rand_like_dtype((37, 37), dtype)
    x_eager = x.clone()
    torch._dynamo.reset()
    f, programs = harness.compiled(mutate_ordered, dynamic)
    got, want = f(x, y), mutate_ordered(x_eager, y)
    tol = dict(rtol=2e-2, atol=2e-1) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x, x_eager, **EXACT)  # the input was written, exactly
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)
    assert not extern_ops(programs) & {aten.copy_.default}, "copy_ ran as an extern"
    # Wrapper IR order: every kernel touching x reads it, then the last one writes it
    graph = programs[0].graph_module.graph
    x_name = next(n.name for n in graph.nodes if n.op == "placeholder"
                  and isinstance(n.meta.get("val"), torch.Tensor))
    roles = [{a.name: a.role for a in n.target.signature}.get(x_name)
             for n in graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    roles = [r for r in roles if r is not None]
    assert len(roles) >= 2 and roles[-1] == "output" and set(roles[:-1]) == {"input"}, roles
