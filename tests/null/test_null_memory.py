"""Memory planning: frees, reuse, in-place reuse, and measured peak == planned peak."""
from __future__ import annotations

import random

import pytest
import torch

from fxwrap.core.memory import plan_memory
from fxwrap.ir.symbolic import evaluate
from fxwrap.wrapper_ir.fx import to_graph_module
from fxwrap.wrapper_ir.printer import program_source
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, CallKernel, Comment, Free, GetItem, Return, Reuse, View, buffers_in, buffers_read,
)

import null_helpers as H

aten = torch.ops.aten
KB256 = 256 * 256 * 4


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _chain_inputs(gen):
    return (torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen) / 16,
            torch.randn(256, generator=gen))


def _pointwise_inputs(gen):
    return torch.randn(256, 256, generator=gen), torch.randn(256, generator=gen)


def _n_ops(program):
    return sum(isinstance(line, CallExtern) for line in program.lines)


@pytest.fixture(scope="module")
def chain():
    return H.lower(H.mixed_chain, *_chain_inputs(_gen(1)))


@pytest.fixture(scope="module")
def pointwise():
    return H.lower(H.pointwise_chain, *_pointwise_inputs(_gen(2)))


def _measured_peak(program, args):
    meter = H.StoragePeak(program.graph_module)
    out = meter.run(*args)
    return meter.peak, out


def test_chain_plan_orders_peaks_and_beats_unplanned(chain):
    m = chain.memory
    assert _n_ops(chain) >= 20
    assert m.peak_bytes <= m.peak_bytes_frees_only <= m.peak_bytes_unplanned
    assert m.peak_bytes < m.peak_bytes_unplanned
    assert m.reused >= 1 and chain.peak_bytes == m.peak_bytes
    assert m.peak_bytes_unplanned >= 15 * KB256  # every intermediate kept: about one buffer per op


def test_chain_measured_peak_equals_planned(chain):
    for seed in (3, 4):
        args = _chain_inputs(_gen(seed))
        peak, out = _measured_peak(chain, args)
        assert peak == chain.peak_bytes
        H.assert_close_all(out, (H.mixed_chain(*args),), rtol=1e-4, atol=1e-5)


def test_chain_without_reuse_measures_frees_only_peak():
    program = H.lower(H.mixed_chain, *_chain_inputs(_gen(5)), options={"reuse": False})
    assert program.memory.reused == 0
    assert not any(isinstance(line, Reuse) for line in program.lines)
    args = _chain_inputs(_gen(6))
    peak, out = _measured_peak(program, args)
    assert peak == program.peak_bytes == program.memory.peak_bytes_frees_only
    H.assert_close_all(out, (H.mixed_chain(*args),), rtol=1e-4, atol=1e-5)


def test_pointwise_chain_runs_in_place(pointwise):
    m = pointwise.memory
    assert _n_ops(pointwise) >= 20
    assert m.peak_bytes <= m.peak_bytes_frees_only <= m.peak_bytes_unplanned
    assert m.peak_bytes < m.peak_bytes_unplanned
    # an op whose input dies at that op writes into the input's storage: one buffer, not two
    assert m.peak_bytes < m.peak_bytes_frees_only
    args = _pointwise_inputs(_gen(7))
    peak, out = _measured_peak(pointwise, args)
    assert peak == pointwise.peak_bytes
    H.assert_close_all(out, (H.pointwise_chain(*args),), rtol=1e-4, atol=1e-5)


def test_pointwise_chain_measured_peak_matches_plan_without_reuse():
    program = H.lower(H.pointwise_chain, *_pointwise_inputs(_gen(8)), options={"reuse": False})
    args = _pointwise_inputs(_gen(9))
    peak, out = _measured_peak(program, args)
    assert peak == program.peak_bytes == 2 * KB256
    H.assert_close_all(out, (H.pointwise_chain(*args),), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn,make", [(H.mixed_chain, _chain_inputs), (H.pointwise_chain, _pointwise_inputs),
                                     (H.mlp, H.mlp_inputs)], ids=["mixed_chain", "pointwise_chain", "mlp"])
def test_reference_target_measured_peak_equals_planned(fn, make):
    program = H.lower(fn, *make(_gen(15)), mode="reference")
    assert any(isinstance(line, CallKernel) for line in program.lines)
    m = program.memory
    assert m.peak_bytes <= m.peak_bytes_frees_only <= m.peak_bytes_unplanned
    args = make(_gen(16))
    peak, out = _measured_peak(program, args)
    assert peak == program.peak_bytes
    H.assert_close_all(out, (fn(*args),), rtol=1e-4, atol=1e-5)


def _sin_plus_transpose(x):
    y = x.sin()
    return y + y.t()


def _sin_times_shifted(x):
    y = x.sin()
    return y[1:] * y[:-1] + y[1:]


@pytest.mark.parametrize("fn", [_sin_plus_transpose, _sin_times_shifted])
def test_in_place_reuse_never_overlaps_a_view_of_the_input(fn):
    program = H.lower(fn, torch.randn(6, 6, generator=_gen(10)))
    x = torch.randn(6, 6, generator=_gen(11))
    H.assert_close_all(program.graph_module(x), (fn(x),))
    peak, _ = _measured_peak(program, (x,))
    assert peak == program.peak_bytes


def test_multi_output_views_measured_peak_equals_planned():
    """``split`` returns views of its input: they own no storage."""
    program = H.lower(H.split, torch.randn(6, 5, generator=_gen(12)))
    x = torch.randn(6, 5, generator=_gen(13))
    peak, out = _measured_peak(program, (x,))
    H.assert_close_all(out, H.split(x))
    assert peak == program.peak_bytes


# -- plan_memory on hand-made lines ---------------------------------------------------

F32, CPU = H.F32, H.CPU


def _buf(name, n, dtype=F32, stride=1, offset=0):
    return Buffer(name, (n,), (stride,), dtype, CPU, offset)


def _simulate(inputs, lines, hints=None, check=True):
    """Run planned lines on a model of storages; check every use and return the peak.

    Checks: nothing is read after its storage is freed; inputs and returned
    storages are never freed or handed on; a storage handed on by ``Reuse`` is
    not read under its old name once the new holder has written it, except by
    the writing pointwise extern itself when every such read has exactly the new
    buffer's layout (in place); a reused storage is big enough; a storage read
    by a functional extern is never handed on; no storage leaks (every storage
    still held at the end is an input or reachable from the return values).
    ``check=False`` only measures.
    """
    hints = hints or {}
    storage_of, generation_of = {}, {}   # buffer name -> storage, generation it was bound at
    size, generation = {}, {}
    live, freed, external, read_functionally = set(), set(), set(), set()
    pending_write = {}   # storage -> (generation, layout) of a Reuse whose writer has not run yet
    returned = set()
    for line in lines:
        if isinstance(line, Return):
            returned |= {b.name for b in buffers_read(line)}
    for inp in inputs:
        storage_of[inp.name], generation_of[inp.name] = inp.name, 0
        generation[inp.name] = 0
        external.add(inp.name)
    peak = 0

    def require(ok, message):
        if check and not ok:
            raise AssertionError(message)

    def layout(b):
        return (b.size, b.stride, b.offset, b.dtype, b.device)

    def new_storage(b):
        storage_of[b.name], generation_of[b.name] = b.name, 0
        size[b.name], generation[b.name] = evaluate(b.storage_bytes, hints), 0
        live.add(b.name)

    for i, line in enumerate(lines):
        if isinstance(line, Free):
            sid = storage_of[line.buf.name]
            require(sid not in external, f"line {i}: frees input {line.buf.name}")
            require(sid in live, f"line {i}: double free of {line.buf.name}")
            live.discard(sid)
            freed.add(sid)
            continue
        reads = [] if isinstance(line, Reuse) else buffers_read(line)
        writing = [b for b in reads if storage_of[b.name] in pending_write
                   and generation_of[b.name] == pending_write[storage_of[b.name]][0]]
        in_place = set()  # stale names this line may read: the in-place writer's own input
        for sid in sorted({storage_of[b.name] for b in writing}):
            gen, out_layout = pending_write.pop(sid)
            stale = [b for b in reads if storage_of[b.name] == sid and generation_of[b.name] < gen]
            if stale:
                pointwise = isinstance(line, CallExtern) and line.out is None and \
                    torch.Tag.pointwise in getattr(line.op, "tags", ())
                require(pointwise and all(layout(b) == out_layout for b in stale),
                        f"line {i}: {line} writes storage {sid} while reading it through {stale}")
                in_place |= {b.name for b in stale}
        for b in reads:
            sid = storage_of[b.name]
            require(sid not in freed, f"line {i}: {b.name} read after its storage was freed")
            if sid not in pending_write and generation_of[b.name] < generation[sid] \
                    and b.name not in in_place:
                require(False, f"line {i}: {b.name} read after its storage was handed on")
        if isinstance(line, CallExtern) and line.out is not None:
            read_functionally |= {storage_of[b.name] for b in reads}
        if isinstance(line, Allocate):
            new_storage(line.buf)
        elif isinstance(line, Reuse):
            sid = storage_of[line.old.name]
            require(sid not in external and sid not in freed, f"line {i}: reuses {line.old.name}")
            require(sid not in read_functionally, f"line {i}: reuses storage read by a functional extern")
            require(line.old.name not in returned, f"line {i}: hands on returned {line.old.name}")
            require(generation_of[line.old.name] == generation[sid], f"line {i}: {line.old.name} is stale")
            require(size[sid] >= evaluate(line.new.storage_bytes, hints), f"line {i}: too small")
            generation[sid] += 1
            storage_of[line.new.name], generation_of[line.new.name] = sid, generation[sid]
            pending_write[sid] = (generation[sid], layout(line.new))
        elif isinstance(line, View):
            storage_of[line.buf.name] = storage_of[line.base.name]
            generation_of[line.buf.name] = generation_of[line.base.name]
        elif isinstance(line, CallExtern) and isinstance(line.out, Buffer):
            if line.op._schema.returns[0].alias_info is not None:  # aten.alias: a view of its input
                src = buffers_in(line.args)[0]
                storage_of[line.out.name], generation_of[line.out.name] = storage_of[src.name], generation_of[src.name]
            else:
                new_storage(line.out)
        elif isinstance(line, GetItem) and isinstance(line.buf, Buffer):
            new_storage(line.buf)
        peak = max(peak, sum(size[s] for s in live))
    held = live - external
    reachable = {storage_of[name] for name in returned}
    require(held <= reachable, f"storages never freed: {sorted(held - reachable)}")
    for name in returned:
        require(storage_of[name] not in freed, f"returned {name} was freed")
    return peak


POINTWISE_OUT = (aten.add.out, aten.mul.out)
OTHER_OUT = (aten.mm.out, aten.cumsum.out)


def _random_program(rng: random.Random):
    """Inputs and lines of a random program over 1-D buffers (values never run)."""
    counter = iter(range(10_000))
    sizes = (64, 96, 128, 256)
    inputs = [_buf(f"arg{next(counter)}", rng.choice(sizes)) for _ in range(rng.randint(1, 3))]
    values = list(inputs)        # what later lines may read
    roots = {b.name: b for b in inputs}
    view_base = {}
    lines = []
    for _ in range(rng.randint(3, 30)):
        kind = rng.random()
        args = tuple(rng.sample(values, k=min(len(values), rng.randint(1, 2))))
        viewed = [v for v in values if v.name not in roots]
        if viewed and rng.random() < 0.25:   # a buffer together with a view of it
            view = rng.choice(viewed)
            args = (roots[view_base[view.name]], view)
        if kind < 0.5:   # out= extern, often with an operand's exact layout
            n = args[0].size[0] if rng.random() < 0.6 and args[0].stride == (1,) else rng.choice(sizes)
            dtype = F32 if rng.random() < 0.9 else torch.float16
            out = _buf(f"buf{next(counter)}", n, dtype)
            op = rng.choice(POINTWISE_OUT if rng.random() < 0.7 else OTHER_OUT)
            lines += [Comment(f"op {len(lines)}"), Allocate(out), CallExtern(op, args, (("out", out),))]
            values.append(out)
            roots[out.name] = out
        elif kind < 0.65:   # functional extern: owns a fresh result
            out = _buf(f"buf{next(counter)}", rng.choice(sizes))
            lines.append(CallExtern(aten.sin.default, args, (), out))
            values.append(out)
            roots[out.name] = out
        elif kind < 0.85:   # a view: a half, or every other element
            base = roots[rng.choice([v.name for v in values if v.name in roots])]
            n = base.size[0]
            if rng.random() < 0.5:
                view = _buf(f"buf{next(counter)}", n // 2, offset=rng.choice((0, n // 2)))
            else:
                view = _buf(f"buf{next(counter)}", n // 2, stride=2, offset=rng.choice((0, 1)))
            lines.append(View(view, base))
            values.append(view)
            view_base[view.name] = base.name
        else:   # a multi-output functional extern
            name = f"tuple{next(counter)}"
            a, b = _buf(f"buf{next(counter)}", rng.choice(sizes)), _buf(f"buf{next(counter)}", 64)
            lines += [CallExtern(aten.var_mean.correction, args, (), name), GetItem(a, name, 0),
                      GetItem(b, name, 1)]
            values += [a, b]
            roots[a.name], roots[b.name] = a, b
    made = [v for v in values if v not in inputs]
    outs = rng.sample(made, k=min(len(made), rng.randint(1, 2))) if made else []
    if rng.random() < 0.2:
        outs.append(inputs[0])
    lines.append(Return(tuple(outs)))
    return inputs, lines


N_RANDOM = 400


def _two_mlps(x, w, up, down2, up2, down):
    r = x @ w                       # A, returned
    h = (r @ w) @ w                 # the first product (A) dies at the second
    u = torch.tanh(h @ up)          # 4A, tanh in place over the product
    y = torch.relu(u @ down2)       # A/2 (relu: a functional extern)
    return torch.tanh(y @ up2) @ down, r


def _two_mlps_inputs(gen):
    return (torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen) / 8,
            torch.randn(64, 256, generator=gen) / 8, torch.randn(256, 32, generator=gen) / 16,
            torch.randn(32, 256, generator=gen) / 4, torch.randn(256, 64, generator=gen) / 16)


def test_reuse_is_bounded_by_the_peak_after_in_place():
    """The frees-only peak is each tanh beside its product (r + 4A + 4A = 9A); written
    in place, the peak is the first up-projection (r, h and its 4A product: 6A).  Reuse
    bounded by the frees-only peak let the returned result take the storage of
    ``(r @ w)``, dead before that projection, and held it across it: 7.5A planned and
    measured.  Bounded by the peak after in place, the plan stays at 6A."""
    a = 64 * 64 * 4
    args = _two_mlps_inputs(_gen(21))
    program = H.lower(_two_mlps, *args)
    assert program.memory.peak_bytes_frees_only == 9 * a, program.code()
    assert program.peak_bytes == 6 * a, program.code()
    for seed in (22, 23):
        args = _two_mlps_inputs(_gen(seed))
        peak, out = _measured_peak(program, args)
        assert peak == program.peak_bytes
        H.assert_close_all(out, _two_mlps(*args), rtol=1e-4, atol=1e-5)


def test_random_programs_reuse_never_raises_the_peak():
    rng = random.Random(1234)
    reused = 0
    for _ in range(N_RANDOM):
        inputs, lines = _random_program(rng)
        with_reuse = plan_memory(lines, reuse=True)
        frees_only = plan_memory(lines, reuse=False)
        assert with_reuse.peak_bytes <= frees_only.peak_bytes == with_reuse.peak_bytes_frees_only
        assert with_reuse.peak_bytes_frees_only <= with_reuse.peak_bytes_unplanned
        assert frees_only.reused == 0
        reused += with_reuse.reused
    assert reused > N_RANDOM  # the generator does exercise reuse


def test_random_programs_peak_accounting_matches_a_simulation():
    rng = random.Random(99)
    for _ in range(N_RANDOM):
        inputs, lines = _random_program(rng)
        frees_only = plan_memory(lines, reuse=False)
        assert _simulate(inputs, frees_only.lines, check=False) == frees_only.peak_bytes
        with_reuse = plan_memory(lines, reuse=True)
        assert _simulate(inputs, with_reuse.lines, check=False) == with_reuse.peak_bytes, \
            program_source(inputs, with_reuse.lines)


def test_random_programs_planned_lines_are_safe():
    """No read after free, no read of a storage a new holder has written, no leak."""
    rng = random.Random(7)
    failures = []
    for k in range(N_RANDOM):
        inputs, lines = _random_program(rng)
        plan = plan_memory(lines, reuse=True)
        try:
            _simulate(inputs, plan.lines)
        except AssertionError as e:
            failures.append((k, str(e)))
    assert not failures, f"{len(failures)} of {N_RANDOM} random plans unsafe; first: {failures[0]}"


def _plain_program():
    x = _buf("arg0", 128)
    a, b, c = _buf("buf0", 128), _buf("buf1", 128), _buf("buf2", 128)
    lines = [Allocate(a), CallExtern(aten.mm.out, (x,), (("out", a),)),
             Allocate(b), CallExtern(aten.mm.out, (a,), (("out", b),)),
             Allocate(c), CallExtern(aten.mm.out, (b,), (("out", c),))]
    return x, (a, b, c), lines


def test_returned_buffers_and_their_views_are_never_freed_or_reused():
    x, (a, b, c), lines = _plain_program()
    # control: returning only c, a and b are freed and a's storage goes to c
    control = plan_memory(lines + [Return((c,))])
    assert Free(b) in control.lines and Reuse(a, c) in control.lines
    view = _buf("buf3", 64, offset=64)
    for tail in ([Return((a, c))], [View(view, a), Return((view, c))]):
        plan = plan_memory(lines + tail)
        assert Free(a) not in plan.lines
        assert not any(isinstance(l, Reuse) and l.old == a for l in plan.lines)
        assert Free(b) in plan.lines
        _simulate([x], plan.lines)


def test_inputs_are_never_freed():
    x, (a, b, c), lines = _plain_program()
    view = _buf("buf3", 64, stride=2)
    plan = plan_memory([View(view, x)] + lines + [CallExtern(aten.cumsum.out, (view,), (("out", c),)),
                                                Return((c,))])
    assert not any(isinstance(l, Free) and l.buf.name in ("arg0", "buf3") for l in plan.lines)
    assert not any(isinstance(l, Reuse) and l.old.name in ("arg0", "buf3") for l in plan.lines)
    assert any(isinstance(l, Free) for l in plan.lines)


def test_storage_read_by_a_functional_extern_is_never_reused():
    x, (a, b, c), lines = _plain_program()
    # control: read by an out= extern only, a's storage is reused by c
    assert Reuse(a, c) in plan_memory(lines + [Return((c,))]).lines
    alias = _buf("buf9", 128)
    functional = [lines[0], lines[1], CallExtern(aten.alias.default, (a,), (), alias),
                  Allocate(b), CallExtern(aten.mm.out, (alias,), (("out", b),)), *lines[4:]]
    plan = plan_memory(functional + [Return((c,))])
    assert not any(isinstance(l, Reuse) and l.old == a for l in plan.lines)
    assert Free(a) in plan.lines
    _simulate([x], plan.lines)


def test_in_place_reuse_is_refused_when_a_view_of_the_input_is_read_too():
    x = _buf("arg0", 64)
    y = Buffer("buf0", (8, 8), (8, 1), F32, CPU)
    yt = Buffer("buf1", (8, 8), (1, 8), F32, CPU)
    z = Buffer("buf2", (8, 8), (8, 1), F32, CPU)
    lines = [Allocate(y), CallExtern(aten.sin.out, (x,), (("out", y),)), View(yt, y),
             Allocate(z), CallExtern(aten.add.out, (y, yt), (("out", z),)), Return((z,))]
    plan = plan_memory(lines)
    assert Reuse(y, z) not in plan.lines
    _simulate([x], plan.lines)
    # control: without the view, the add runs in place
    alone = [Allocate(y), CallExtern(aten.sin.out, (x,), (("out", y),)),
             Allocate(z), CallExtern(aten.add.out, (y, y), (("out", z),)), Return((z,))]
    assert Reuse(y, z) in plan_memory(alone).lines


def test_in_place_reuse_of_a_larger_storage_never_raises_the_peak():
    """bufB takes dead bufA's 1 KiB storage; an in-place bufC must not carry it past bufB."""
    x, a, t = _buf("arg0", 256), _buf("bufA", 256), _buf("bufT", 64)
    b, c, d = _buf("bufB", 64), _buf("bufC", 64), _buf("bufD", 256)
    lines = [Allocate(a), CallExtern(aten.mm.out, (x,), (("out", a),)),
             Allocate(t), CallExtern(aten.mm.out, (a,), (("out", t),)),
             Allocate(b), CallExtern(aten.mm.out, (t,), (("out", b),)),
             Allocate(c), CallExtern(aten.add.out, (b, 1), (("out", c),)),
             Allocate(d), CallExtern(aten.mm.out, (c,), (("out", d),)),
             Return((d,))]
    plan = plan_memory(lines)
    assert plan.peak_bytes_frees_only == 1280
    assert plan.peak_bytes <= plan.peak_bytes_frees_only
    assert _simulate([x], plan.lines) == plan.peak_bytes


def test_planned_hand_made_program_runs_like_unplanned():
    """Frees and reuse change storage, never values: the FX forms agree."""
    rng = random.Random(5)
    x = Buffer("arg0", (16, 16), (16, 1), F32, CPU)
    lines, prev = [], x
    ops = (aten.sin.out, aten.exp.out, aten.tanh.out, aten.neg.out)
    for k in range(8):
        out = Buffer(f"buf{k}", (16, 16), (16, 1), F32, CPU)
        lines += [Allocate(out), CallExtern(rng.choice(ops), (prev,), (("out", out),))]
        prev = out
    lines.append(Return((prev,)))
    plan = plan_memory(lines)
    assert plan.reused >= 1 and plan.peak_bytes < plan.peak_bytes_unplanned
    arg = torch.randn(16, 16, generator=_gen(14))
    planned = to_graph_module([x], plan.lines)(arg)[0]
    unplanned = to_graph_module([x], lines)(arg)[0]
    torch.testing.assert_close(planned, unplanned)


def test_unread_views_are_dropped_with_their_provenance():
    x = Buffer("arg0", (4, 8), (8, 1), torch.float32, torch.device("cpu"))
    out = Buffer("buf0", (8, 4), (4, 1), torch.float32, torch.device("cpu"))
    read = Buffer("buf1", (8, 4), (1, 8), torch.float32, torch.device("cpu"))
    dead = Buffer("buf2", (32,), (1,), torch.float32, torch.device("cpu"))
    dead_of_dead = Buffer("buf3", (2, 16), (16, 1), torch.float32, torch.device("cpu"))
    lines = [Comment("t: aten.t.default"), View(read, x),
             Comment("view: aten.view.default"), View(dead, x),
             Comment("view_1: aten.view.default"), View(dead_of_dead, dead),
             Allocate(out), CallExtern(aten.mul.out, (read, 2.0), (("out", out),)), Return((out,))]
    planned = plan_memory(lines, {}).lines
    views = [line.buf.name for line in planned if isinstance(line, View)]
    assert views == ["buf1"]
    comments = [line.text for line in planned if isinstance(line, Comment)]
    assert comments == ["t: aten.t.default"]
    x_val = torch.randn(4, 8)
    gm = to_graph_module([x], planned, {}, {})
    torch.testing.assert_close(gm(x_val)[0], x_val.t() * 2)


def test_equal_for_every_size_agrees_with_simplify():
    """The memory planner's size equality (expansion, then probes, then simplify) answers as
    ``sympy.simplify(a - b) == 0`` does."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    from fxwrap.core.memory import _equal_for_every_size

    s0, s1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    pairs = [(4 * s0 * s1, 4 * s1 * s0), (4 * (s0 + 1) * s1, 4 * s0 * s1 + 4 * s1), (4 * s0, 4 * s1),
             (8 * s0, 4 * s0), (4 * sympy.Max(s0, 1) * 3, 12 * s0), (4 * FloorDiv(s0, 2) * 2, 4 * s0),
             (4 * FloorDiv(2 * s0, 2), 4 * s0), (16 * s0 * s1, 16 * s0 * s1 + 16)]
    for a, b in pairs:
        _equal_for_every_size.cache_clear()
        assert _equal_for_every_size(a, b) == (sympy.simplify(a - b) == 0), (a, b)
    assert _equal_for_every_size(4 * (s0 + 1) * s1, 4 * s0 * s1 + 4 * s1)
    assert not _equal_for_every_size(4 * FloorDiv(s0, 2) * 2, 4 * s0)
