"""Horizontal fusion as data (``core/combo.py``; no device, no compiler): which fused groups
``combine`` puts in one combo kernel, and the two scheduler rules that give the foreach /
optimizer programs one group a tensor (``scheduler.fuse``: the look-back over groups of the
same ranges, and a ``copy_`` into an input read only where it is written)."""
from __future__ import annotations

import torch

from fxwrap.core.combo import ComboGroup, combine
from fxwrap.core.scheduler import Group, Job, fuse
from fxwrap.ir.combo import ComboKernel, ComboLimits, format_combo
from fxwrap.ir.lines import CallExtern, Comment
from fxwrap.ir.loops import Store, xvar
from shared_helpers import buf, const, kernel, ld, op

i, j = xvar(0), xvar(1)
LIMITS = ComboLimits(max_members=3, max_arguments=64)


def group(outer, *stores) -> Group:
    g = Group(tuple(outer))
    for st in stores:
        g.add(Job(tuple(outer), stores=[st], roots=[st.buffer]))
    return g


def twice(src: str, index) -> object:
    return op("mul", torch.float32, ld(src, index), const(2.0))


def shape(items) -> list:
    return [[m.roots for m in x.members] if isinstance(x, ComboGroup) else type(x).__name__ for x in items]


def test_independent_groups_of_other_ranges_are_one_combo():
    items = [group((7, 3), Store("a", 3 * i + j, twice("x", 3 * i + j))),
             group((11,), Store("b", i, twice("y", i))),
             group((5,), Store("c", i, twice("z", i)))]
    assert shape(combine(items, LIMITS)) == [[["a"], ["b"], ["c"]]]
    assert combine(items, None) == items  # an emitter without combo kernels


def test_a_group_reading_what_another_writes_starts_a_new_combo():
    items = [group((7, 3), Store("a", 3 * i + j, twice("x", 3 * i + j))),
             group((11,), Store("b", i, twice("a", i))),         # reads a: after it
             group((5,), Store("c", i, twice("z", i)))]
    assert shape(combine(items, LIMITS)) == ["Group", [["b"], ["c"]]]


def test_a_group_writing_what_another_reads_starts_a_new_combo():
    items = [group((7, 3), Store("a", 3 * i + j, twice("x", 3 * i + j))),
             group((11,), Store("x", i, twice("y", i)))]          # overwrites x (a GPU runs both at once)
    assert shape(combine(items, LIMITS)) == ["Group", "Group"]


def test_a_line_between_that_writes_what_the_group_reads_keeps_it_in_place():
    y = buf("y", (11,))
    bump = CallExtern(torch.ops.aten.add_.Tensor, (y, y))  # writes y in place
    items = [group((7, 3), Store("a", 3 * i + j, twice("x", 3 * i + j))), bump,
             group((11,), Store("b", i, twice("y", i)))]
    assert shape(combine(items, LIMITS)) == ["Group", "CallExtern", "Group"]
    # an independent group does not move over an extern call either (it would hold its outputs
    # longer), but over a comment it does
    independent = [items[0], bump, group((5,), Store("c", i, twice("z", i)))]
    assert shape(combine(independent, LIMITS)) == ["Group", "CallExtern", "Group"]
    noted = [items[0], Comment("a note"), group((5,), Store("c", i, twice("z", i)))]
    assert shape(combine(noted, LIMITS)) == [[["a"], ["c"]], "Comment"]


def test_member_and_argument_limits():
    items = [group((n,), Store(f"o{n}", i, twice(f"x{n}", i))) for n in range(2, 9)]
    def sizes(items):
        return [len(x.members) if isinstance(x, ComboGroup) else 1 for x in items]

    assert sizes(combine(items, LIMITS)) == [3, 3, 1]
    narrow = ComboLimits(max_members=8, max_arguments=4)  # two buffers a group: two groups a combo
    assert sizes(combine(items, narrow)) == [2, 2, 2, 1]


def test_reductions_stay_kernels_of_their_own():
    reduction = Group((4,), reduced=(8,))  # a row reduction's group (its stores: the epilogue)
    reduction.stores.append(Store("r", i, ld("x", i)))
    items = [group((7,), Store("a", i, twice("x", i))), reduction, group((5,), Store("c", i, twice("z", i)))]
    assert shape(combine(items, LIMITS)) == [[["a"], ["c"]], "Group"]


def test_foreach_order_fuses_each_tensor_once():
    """``_foreach_add_(xs, ys)`` then ``_foreach_mul(xs, 0.5)`` over 6 sizes, as the lowerer
    gives it: the adds, the products, then the copies back into ``xs``.  One group a size,
    which writes its ``x`` where it reads it."""
    sizes = [4, 7, 10, 13, 16, 19]
    adds = [Job((n,), stores=[Store(f"add{n}", i, op("add", torch.float32, ld(f"x{n}", i), ld(f"y{n}", i)))],
                roots=[f"add{n}"]) for n in sizes]
    muls = [Job((n,), stores=[Store(f"mul{n}", i, op("mul", torch.float32, ld(f"add{n}", i), const(0.5)))],
                roots=[f"mul{n}"]) for n in sizes]
    copies = [Job((n,), stores=[Store(f"x{n}", i, ld(f"add{n}", i))], roots=[f"copy{n}"]) for n in sizes]
    fused = fuse([*adds, *muls, *copies])
    assert [sorted(st.buffer for st in g.stores) for g in fused] == \
        [sorted([f"add{n}", f"mul{n}", f"x{n}"]) for n in sizes]


def test_a_copy_into_an_input_read_elsewhere_stays_apart():
    """The group reads ``x`` at ``i + 1``: writing ``x`` in it could feed a later iteration the
    new value."""
    shifted = Job((6,), stores=[Store("a", i, ld("x", i + 1))], roots=["a"])
    write = Job((6,), stores=[Store("x", i, ld("y", i))], roots=["copy"])
    assert len(fuse([shifted, write])) == 2
    same = Job((6,), stores=[Store("a", i, ld("x", i))], roots=["a"])
    assert len(fuse([same, write])) == 1


def test_combo_kernel_arguments_and_in_place_pairs():
    x, y, a, b = buf("x", (4,)), buf("y", (6,)), buf("a", (4,)), buf("b", (6,))
    m0 = kernel("k_m0", [x], [a], [Store("a", i, twice("x", i))], ranges=(4,))
    m1 = kernel("k_m1", [x, y], [b], [Store("b", i, op("add", torch.float32, ld("y", i), ld("x", i)))], ranges=(6,))
    combo = ComboKernel("k", (m0, m1))
    assert [b.name for b in combo.inputs] == ["x", "y"] and [b.name for b in combo.outputs] == ["a", "b"]
    assert combo.argument_positions(m1) == (0, 1, 3)
    # x -> a alone would be in place, but m1 reads x too; y -> b is m1's alone
    assert combo.in_place_pairs() == (("y", "b"),)
    assert format_combo(combo).splitlines()[0] == "k: 2 members; inputs x, y; outputs a, b"


def test_independent_work_of_one_range_stays_within_the_argument_limit():
    """Ten tensors of one size, nothing shared: one loop nest of 20 arguments without a limit;
    with the emitter's limit (6) groups of three, which ``combine`` then launches together."""
    jobs = [Job((8,), stores=[Store(f"o{n}", i, twice(f"x{n}", i))], roots=[f"o{n}"]) for n in range(10)]
    assert len(fuse(jobs)) == 1
    fused = fuse(jobs, argument_limit=6)
    assert [len(g.stores) for g in fused] == [3, 3, 3, 1]
    # a job using a buffer of the group (the same tensor's next op) joins past the limit
    chained = jobs[:3] + [Job((8,), stores=[Store("p0", i, twice("o0", i))], roots=["p0"])]
    assert len(fuse(chained, argument_limit=6)) == 1


def test_optimizer_order_one_group_a_tensor_however_many_tensors_share_its_size():
    """Adam's ``foreach`` order over 120 tensors of one size: every first moment, every second
    moment, every parameter, then the copies back (a comment before each), 960 items.  A
    tensor's second moment shares its gradient with its first moment's group, far outside the
    window, and must join it rather than the open group of another tensor's second moment; the
    copies come hundreds of items later.  One group a tensor, storing its three inputs in place
    and the intermediates (dropped later: nothing else reads them)."""
    n = 120
    add, mul, div = (lambda a, b, o=o: op(o, torch.float32, a, b) for o in ("add", "mul", "truediv"))
    firsts = [Job((8,), stores=[Store(f"m1_{k}", i, add(ld(f"m{k}", i), ld(f"g{k}", i)))], roots=[f"m1_{k}"])
              for k in range(n)]
    seconds = [Job((8,), stores=[Store(f"v1_{k}", i, add(ld(f"v{k}", i), mul(ld(f"g{k}", i), ld(f"g{k}", i))))],
                   roots=[f"v1_{k}"]) for k in range(n)]
    params = [Job((8,), stores=[Store(f"p1_{k}", i, add(ld(f"p{k}", i), div(ld(f"m1_{k}", i), ld(f"v1_{k}", i))))],
                  roots=[f"p1_{k}"]) for k in range(n)]
    copies = []
    for name in ("p", "m", "v"):
        for k in range(n):
            copies += [Comment(f"copy into {name}{k}"),
                       Job((8,), stores=[Store(f"{name}{k}", i, ld(f"{name}1_{k}", i))], roots=[f"copy_{name}{k}"])]
    fused = [g for g in fuse([*firsts, *seconds, *params, *copies], argument_limit=16) if isinstance(g, Group)]
    where = {st.buffer: at for at, g in enumerate(fused) for st in g.stores}
    for k in range(n):  # (tensors of one size share a group within the argument limit: 5 of 3 arguments)
        assert len({where[f"{name}{k}"] for name in ("m1_", "v1_", "p1_", "p", "m", "v")}) == 1, k
    assert len(fused) == n // 5
