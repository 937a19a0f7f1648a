"""The CPU runner's arena (``fxwrap/runtime/arena.py``): a program's fixed-size temporaries
take ranges of one storage kept across calls, so a call faults no page in; what the program
returns, or may return through an alias, is never in it; calls that overlap take arenas of
their own.  Exact plans of hand-made graphs, the runner's structure, numbers against eager
across calls, threads and outputs kept alive, and the page faults a call."""
from __future__ import annotations

import resource
import threading

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.runtime import arena as arena_module
from fxwrap.runtime.arena import (ALIGN, IDLE_STORAGES, KEEP, ArenaPool, IdleStorages, _pack, _place_in_order, arena_graph_module, arena_range,
                                  plan_arena)
from fxwrap.runtime.direct import empty_strided_cpu, storage_offset, view_of
from fxwrap.runtime.graph_replay import replay_runners

pytestmark = pytest.mark.skipif(empty_strided_cpu is None, reason="this torch has no _empty_strided_cpu")

F32 = torch.float32
_aten = torch.ops.aten


def _lower(fn, *args, **options):
    return fxwrap.lower(fn, *args, target="cpu", options={"cache": False, "templates": "off", **options})


def _graph(build) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _alloc(graph, n, name):
    return graph.create_node("call_function", empty_strided_cpu, ((n,), (1,), F32), name=name)


def test_plan_places_dead_ranges_again_and_keeps_live_ones_apart():
    """buf0 dies at buf1's kernel, so buf2 takes its range; buf1 is live with buf2: apart."""
    def build(graph, x):
        buf0 = _alloc(graph, 100, "buf0")
        graph.call_function(_aten.add.out, (x, x), {"out": buf0})
        buf1 = _alloc(graph, 40, "buf1")
        graph.call_function(_aten.mul.out, (buf0, buf0), {"out": buf1})
        buf2 = _alloc(graph, 100, "buf2")
        graph.call_function(_aten.add.out, (buf1, buf1), {"out": buf2})
        return (graph.call_function(_aten.sum.default, (buf2,)),)

    gm = _graph(build)
    offsets, size, _ = plan_arena(gm)
    by_name = {node.name: offset for node, offset in offsets.items()}
    assert by_name == {"buf0": 0, "buf1": 448, "buf2": 0}  # 400 bytes -> 448 (ALIGN 64)
    assert size == 448 + 192 and ALIGN == 64


def test_packing_reaches_the_most_bytes_live_where_program_order_leaves_a_hole():
    """a (1 unit, positions 0-2), b (1, 1-5), c (2, 3-5): in program order c finds only a's
    1-unit hole below b and goes above it (4 units); the most live at once is 3 (b + c),
    which placing c first reaches.  The same blocks always give the same offsets."""
    unit = ALIGN
    blocks = [("a", 0, 2, unit), ("b", 1, 5, unit), ("c", 3, 5, 2 * unit)]
    assert _place_in_order(blocks)[1] == 4 * unit
    offsets, size = _pack(blocks)
    assert size == 3 * unit
    spans = {name: (offsets[name], offsets[name] + n, first, last) for name, first, last, n in blocks}
    for x, y in [("a", "b"), ("b", "c")]:  # alive together: their ranges are apart
        assert spans[x][1] <= spans[y][0] or spans[y][1] <= spans[x][0], spans
    assert _pack(list(blocks)) == (offsets, size)


def test_packing_of_many_blocks_is_deterministic_and_never_worse_than_program_order():
    rng = torch.Generator().manual_seed(0)
    blocks = []
    for i in range(300):
        first = 2 * i
        last = first + int(torch.randint(1, 80, (), generator=rng))
        blocks.append((f"buf{i}", first, last, ALIGN * int(torch.randint(1, 64, (), generator=rng))))
    offsets, size = _pack(blocks)
    assert size <= _place_in_order(blocks)[1]
    assert (offsets, size) == _pack(blocks)
    live = sorted(blocks, key=lambda b: offsets[b[0]])
    for i, (x, xf, xl, xn) in enumerate(live):  # blocks alive together never share a byte
        for y, yf, yl, yn in live[i + 1:]:
            if offsets[y] >= offsets[x] + xn:
                break
            assert not (xf <= yl and yf <= xl), (x, y)


def test_returned_storage_and_possible_aliases_stay_out():
    """A view of buf0 is returned (buf0 out); a Python call's result may alias buf1 and is
    returned (buf1 out); convolution's result never aliases its input (buf2 in)."""
    def build(graph, x):
        buf0 = _alloc(graph, 16, "buf0")
        graph.call_function(_aten.add.out, (x, x), {"out": buf0})
        view = graph.call_function(view_of, (buf0, (4, 4), (4, 1), 0))
        buf1 = _alloc(graph, 16, "buf1")
        graph.call_function(_aten.add.out, (x, x), {"out": buf1})
        alias = graph.call_function(torch.Tensor.view, (buf1, 4, 4))
        buf2 = graph.create_node("call_function", empty_strided_cpu, ((1, 1, 4, 4), (16, 16, 4, 1), F32),
                                 name="buf2")
        graph.call_function(_aten.add.out, (x, x), {"out": buf2})
        conv = graph.call_function(_aten.convolution.default,
                                   (buf2, buf2, None, (1, 1), (0, 0), (1, 1), False, (0, 0), 1))
        buf3 = _alloc(graph, 16, "buf3")  # _unsafe_view's schema marks no alias: out all the same
        graph.call_function(_aten.add.out, (x, x), {"out": buf3})
        unsafe = graph.call_function(_aten._unsafe_view.default, (buf3, (4, 4)))
        buf4 = _alloc(graph, 16, "buf4")  # type_as (composite) returns self where the dtypes agree
        graph.call_function(_aten.add.out, (x, x), {"out": buf4})
        same = graph.call_function(_aten.type_as.default, (buf4, x))
        return (view, alias, conv, unsafe, same)

    offsets, _, _ = plan_arena(_graph(build))
    assert [node.name for node in offsets] == ["buf2"]


def test_views_at_given_offsets_count_from_the_arena_range():
    """A view's offset counts from its buffer's start (Wrapper IR): in the arena it moves by
    the buffer's range (buf1: 64 bytes in, so ``view_of(buf1, ..., 8)`` reads from element
    24); a buffer whose storage offset is read stays out (buf2)."""
    def build(graph, x):
        buf0 = _alloc(graph, 16, "buf0")
        graph.call_function(_aten.add.out, (x, x), {"out": buf0})
        buf1 = _alloc(graph, 16, "buf1")
        graph.call_function(_aten.mul.out, (buf0, x), {"out": buf1})
        half = graph.call_function(view_of, (buf1, (8,), (1,), 8))
        buf2 = _alloc(graph, 16, "buf2")
        graph.call_function(_aten.sub.out, (buf1, x), {"out": buf2})
        where = graph.call_function(storage_offset, (buf2,))
        return (graph.call_function(_aten.mul.Tensor, (half, 3)), graph.call_function(_aten.mul.Tensor, (buf2, where)))

    gm = _graph(build)
    offsets, _, shifts = plan_arena(gm)
    assert {node.name: offset for node, offset in offsets.items()} == {"buf0": 0, "buf1": 64}
    assert {node.args[0].name: shift for node, shift in shifts.items()} == {"buf1": 16}
    arena_gm = arena_graph_module(gm)
    for seed in (0, 1):
        x = torch.randn(16, generator=torch.Generator().manual_seed(seed))
        for got, want in zip(arena_gm(x), gm(x)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _ptr(arena):
    return arena[0].untyped_storage().data_ptr()


def test_pool_gives_overlapping_calls_their_own_arena():
    storages = IdleStorages()
    pool = ArenaPool(256, (F32, torch.int64), storages)
    first, second = pool.take(), pool.take()
    assert _ptr(first) != _ptr(second)
    assert _ptr(first) == first[1].untyped_storage().data_ptr()
    assert (first[0].numel(), first[1].numel(), pool.made) == (64, 32, 2)
    pool.give_back(first)
    again, other = pool.take(), pool.take()  # an idle storage goes to one call only
    assert _ptr(again) == _ptr(first) and _ptr(other) not in (_ptr(first), _ptr(second)) and pool.made == 3
    for arena in (again, second, other):
        pool.give_back(arena)
    assert len(storages._idle) == KEEP


def test_programs_run_one_after_another_share_one_storage_of_the_largest_arena():
    """A forward's and a backward's arenas (or two graphs' of one model): one storage, the
    larger one's size, stays allocated between calls; a smaller idle one is let go when a
    larger arena is needed, and the larger serves the smaller after it."""
    storages = IdleStorages()
    small, large = ArenaPool(256, (F32,), storages), ArenaPool(1024, (F32,), storages)
    arena = small.take()
    small.give_back(arena)
    assert storages.nbytes == 256
    big = large.take()
    large.give_back(big)
    assert storages.nbytes == 1024 and len(storages._idle) == 1  # the small one let go
    again = small.take()
    assert _ptr(again) == _ptr(big) and again[0].numel() == 256 and small.made == 1 and large.made == 1
    small.give_back(again)
    assert storages.nbytes == 1024


def test_a_training_step_holds_one_arena_between_calls(monkeypatch):
    storages = IdleStorages()
    monkeypatch.setattr(arena_module, "IDLE_STORAGES", storages)

    def step(x, w1, w2):
        h = torch.relu(x @ w1) @ w2
        return (h.softmax(-1) * h.sum(1, keepdim=True).sigmoid()).sum() + (x @ w1).logsumexp(1).sum()
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 32, generator=gen)
    w1, w2 = (torch.randn(32, 48, generator=gen, requires_grad=True),
              torch.randn(48, 40, generator=gen, requires_grad=True))
    programs = []
    compiled = torch.compile(step, backend=fxwrap.Backend("cpu", {"cache": False, "templates": "off",
                                                                 "on_program": programs.append}))
    for _ in range(2):
        w1.grad = w2.grad = None
        compiled(x, w1, w2).backward()
    for got, want in zip((w1.grad, w2.grad), torch.autograd.grad(step(x, w1, w2), (w1, w2))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    pools = [p.runner.arena_pool for p in programs if hasattr(p.runner, "arena_pool")]
    assert [p.kind for p in programs] == ["forward", "backward"] and len(pools) == 2
    # one storage, the larger arena's, between steps (each program kept its own before)
    assert storages.nbytes == max(p.nbytes for p in pools) < sum(p.nbytes for p in pools)


def _block(x, w1, w2):
    """Two temporaries the size of the input, an extern between them, a view returned."""
    h = F.conv2d(torch.relu(x * 2), w1, padding=1)
    return (torch.sigmoid(h) * x).sum(1), F.conv2d(h.relu(), w2).transpose(2, 3)


def _block_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 8, 16, 16, generator=g), torch.randn(8, 8, 3, 3, generator=g) / 8,
            torch.randn(4, 8, 1, 1, generator=g) / 3)


def _storages(values):
    return {v.untyped_storage().data_ptr() for v in values}


def test_runner_takes_temporaries_from_the_arena_and_returns_fresh_outputs():
    program = _lower(_block, *_block_inputs(0))
    runner = program.runner
    ranges = [n for n in runner.graph.nodes if n.op == "call_function" and n.target is arena_range]
    assert ranges, runner.code  # x * 2's relu at least
    pool = runner.arena_pool
    kept = []
    for seed in (1, 2, 3):
        inputs = _block_inputs(seed)
        got = program.run(*inputs)
        for g, w in zip(got, _block(*inputs)):
            assert g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        kept.append((got, _block(*inputs)))
    arena = pool.take()
    pool.give_back(arena)
    assert pool.made <= 1, "sequential calls share one storage"
    assert arena[0].untyped_storage().data_ptr() not in _storages(v for got, _ in kept for v in got)
    for got, want in kept:  # outputs kept alive are not written by later calls
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_threads_calling_at_once_get_eager_numbers():
    program = _lower(_block, *_block_inputs(0))
    errors, barrier = [], threading.Barrier(2)

    def work(seed):
        barrier.wait()
        for i in range(15):
            inputs = _block_inputs(seed * 100 + i)
            for g, w in zip(program.run(*inputs), _block(*inputs)):
                if not torch.allclose(g, w, rtol=1e-4, atol=1e-4):
                    errors.append(seed)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _big(x, w):
    """A 40 MB temporary (``x.sin()``) read by a matrix product: above glibc's largest mmap
    threshold, so a fresh allocation is mapped, faulted in and unmapped on every call."""
    return torch.mm(x.sin().view(-1, 16), w)


def test_a_call_faults_in_no_temporary():
    x, w = torch.randn(10_000_000), torch.randn(16, 1)
    program = _lower(_big, x, w)
    with torch.no_grad():
        program.run(x, w)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            got = program.run(x, w)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    torch.testing.assert_close(got, _big(x, w), rtol=1e-4, atol=1e-3)
    assert faults < 2_000, f"{faults:.0f} minor faults a call (the temporary alone is 9,766 pages)"
    assert any(n.target is arena_range for n in program.runner.graph.nodes), program.runner.code


def test_graph_capture_runs_without_the_arena():
    """A recording keeps its buffers for good: the launch list records the runner without an arena."""
    w1, w2 = torch.randn(16, 16), torch.randn(16, 16)
    program = fxwrap.lower(lambda x: torch.relu(x @ w1) @ w2, torch.randn(4, 16), target="cpu",
                           options={"cache": False, "mode": "reduce-overhead"})
    (replay,) = replay_runners(program.runner)
    assert not any(n.target is arena_range for n in replay.run.graph.nodes), replay.run.code
    for _ in range(3):
        x = torch.randn(4, 16)
        torch.testing.assert_close(program.run(x), torch.relu(x @ w1) @ w2, rtol=1e-4, atol=1e-4)


def test_option_arena_false_allocates_per_call():
    program = _lower(_block, *_block_inputs(0), arena=False)
    assert not any(n.target is arena_range for n in program.runner.graph.nodes), program.runner.code
    inputs = _block_inputs(1)
    for g, w in zip(program.run(*inputs), _block(*inputs)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_no_temporary_no_arena():
    gm = _graph(lambda graph, x: (graph.call_function(_aten.sin.default, (x,)),))
    assert arena_graph_module(gm) is gm
