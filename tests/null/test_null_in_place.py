"""``ScheduledKernel.in_place_pairs``: which (input, output) buffers of a hand-made kernel
may share one storage (the memory planner's in-place reuse), and which may not: an
input read at another element, another layout or dtype, a store that does not write
every element once (broadcast, overlapping), a reduction."""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.loops import Op, Reduction, ScheduledKernel, Store, rvar, xvar
from fxwrap.ir.lines import Buffer

F32 = torch.float32
CPU = torch.device("cpu")
s0 = sympy.Symbol("s0", integer=True, positive=True)
x0, x1 = xvar(0), xvar(1)


def _buf(name, size, stride, dtype=F32):
    return Buffer(name, tuple(sympy.sympify(n) for n in size), tuple(sympy.sympify(s) for s in stride), dtype, CPU)


def _kernel(inputs, outputs, ranges, stores, reductions=(), reduction_ranges=()):
    return ScheduledKernel("k", tuple(inputs), tuple(outputs), tuple(sorted(
        set().union(*(sympy.sympify(n).free_symbols for n in ranges)), key=str)),
        tuple(ranges), tuple(reduction_ranges), tuple(reductions), tuple(stores))


def _relu_of(name, index, dtype=F32):
    return Op("maximum", dtype, (Op.load(name, index, dtype), Op.const(0.0, dtype)))


def test_same_element_same_layout_pairs():
    a, out = _buf("a", (s0, 8), (8, 1)), _buf("out", (s0, 8), (8, 1))
    k = _kernel([a], [out], (s0, 8), [Store("out", 8 * x0 + x1, _relu_of("a", 8 * x0 + x1))])
    assert k.in_place_pairs() == (("a", "out"),)


def test_channels_last_like_permuted_layout_pairs():
    a, out = _buf("a", (2, 3, 4), (12, 1, 3)), _buf("out", (2, 3, 4), (12, 1, 3))
    index = 12 * x0 + x1 + 3 * xvar(2)
    k = _kernel([a], [out], (2, 3, 4), [Store("out", index, _relu_of("a", index))])
    assert k.in_place_pairs() == (("a", "out"),)


def test_input_read_at_another_element_does_not_pair():
    a, out = _buf("a", (s0, 8), (8, 1)), _buf("out", (s0, 8), (8, 1))
    value = Op("add", F32, (_relu_of("a", 8 * x0 + x1), Op.load("a", 8 * x0 + 7 - x1, F32)))
    k = _kernel([a], [out], (s0, 8), [Store("out", 8 * x0 + x1, value)])
    assert k.in_place_pairs() == ()


def test_other_layout_or_dtype_does_not_pair():
    a_t, out = _buf("a", (8, 8), (1, 8)), _buf("out", (8, 8), (8, 1))
    k = _kernel([a_t], [out], (8, 8), [Store("out", 8 * x0 + x1, _relu_of("a", x0 + 8 * x1))])
    assert k.in_place_pairs() == ()
    a16 = _buf("a", (8, 8), (8, 1), torch.bfloat16)
    value = Op("cast", F32, (Op.load("a", 8 * x0 + x1, torch.bfloat16),))
    k = _kernel([a16], [out], (8, 8), [Store("out", 8 * x0 + x1, value)])
    assert k.in_place_pairs() == ()


def test_store_not_writing_each_element_once_does_not_pair():
    # overlapping layout: stride 1 over a dim of 8 and stride 4 over the next
    a, out = _buf("a", (4, 8), (4, 1)), _buf("out", (4, 8), (4, 1))
    k = _kernel([a], [out], (4, 8), [Store("out", 4 * x0 + x1, _relu_of("a", 4 * x0 + x1))])
    assert k.in_place_pairs() == ()
    # ranges other than the buffer's sizes (a broadcast store)
    a, out = _buf("a", (8,), (1,)), _buf("out", (8,), (1,))
    k = _kernel([a], [out], (3, 8), [Store("out", x1, _relu_of("a", x1))])
    assert k.in_place_pairs() == ()


def test_reduction_kernel_does_not_pair():
    a, out = _buf("a", (8, 8), (8, 1)), _buf("out", (8, 8), (8, 1))
    r0 = rvar(0)
    red = Reduction("r", "sum", Op.load("a", 8 * x0 + r0, F32), F32)
    value = Op("sub", F32, (Op.load("a", 8 * x0 + x1, F32), Op.acc("r", 0, F32)))
    k = _kernel([a], [out], (8, 8), [Store("out", 8 * x0 + x1, value)], [red], (8,))
    assert k.in_place_pairs() == ()


def test_an_input_a_later_store_reads_pairs_only_with_the_last_reader():
    """Two stores (batch norm's running mean and variance in one kernel): the first store
    may not take the storage of an input the second store still reads (the emitter writes
    ``out0`` before it loads ``b`` for ``out1``: training running statistics came out wrong)."""
    a, b = _buf("a", (8,), (1,)), _buf("b", (8,), (1,))
    out0, out1 = _buf("out0", (8,), (1,)), _buf("out1", (8,), (1,))
    first = Op("add", F32, (_relu_of("a", x0), Op.load("b", x0, F32)))
    second = Op("mul", F32, (Op.load("b", x0, F32), Op.const(0.9, F32)))
    k = _kernel([a, b], [out0, out1], (8,), [Store("out0", x0, first), Store("out1", x0, second)])
    # ``a`` is read only before either store: out1 may take it too (each element of ``a``
    # is read by its own iteration, before out1's store in it)
    assert set(k.in_place_pairs()) == {("a", "out0"), ("a", "out1"), ("b", "out1")}
