"""Values that depend on no input are built once per program (``core/constant_folding.py``):
a Swin shifted-window attention mask (``new_zeros``, slice assignments of a ``torch.tensor``
count, view / permute / difference / ``masked_fill``), ``torch.tensor([...])`` constants read
by an extern; never a value the program returns (the caller may write into it), and never a
roll's index arithmetic (a kernel computes it from its index).  Numbers against eager on
fresh inputs, static and dynamic."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel

WINDOW, SHIFT = (4, 4), (2, 2)


def shifted_window_scores(x):
    """torchvision's ``shifted_window_attention`` mask and scores, small."""
    B, H, W, C = x.shape
    x = torch.roll(x, shifts=(-SHIFT[0], -SHIFT[1]), dims=(1, 2))
    attn_mask = x.new_zeros((H, W))
    h_slices = ((0, -WINDOW[0]), (-WINDOW[0], -SHIFT[0]), (-SHIFT[0], None))
    w_slices = ((0, -WINDOW[1]), (-WINDOW[1], -SHIFT[1]), (-SHIFT[1], None))
    count = 0
    for h in h_slices:
        for w in w_slices:
            attn_mask[h[0]: h[1], w[0]: w[1]] = count
            count += 1
    attn_mask = attn_mask.view(H // WINDOW[0], WINDOW[0], W // WINDOW[1], WINDOW[1])
    attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(-1, WINDOW[0] * WINDOW[1])
    attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
    attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
    windows = x.view(B, H // WINDOW[0], WINDOW[0], W // WINDOW[1], WINDOW[1], C)
    windows = windows.permute(0, 1, 3, 2, 4, 5).reshape(-1, WINDOW[0] * WINDOW[1], C)
    attn = windows @ windows.transpose(1, 2)
    attn = attn.view(B, -1, WINDOW[0] * WINDOW[1], WINDOW[0] * WINDOW[1]) + attn_mask.unsqueeze(0)
    return attn.softmax(-1)


def _computes(line, *ops) -> bool:
    return any(origin.target.split(".")[1] in ops for origin in getattr(line, "origins", ()) or ())


_MASK_OPS = ("lift_fresh_copy", "slice_scatter", "copy", "masked_fill", "where", "full")


def test_shifted_window_mask_built_once():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 8, 3)
    program = fxwrap.lower(shifted_window_scores, x, options={"cache": False})
    for _ in range(2):  # fresh inputs each call
        x = torch.randn(2, 8, 8, 3)
        torch.testing.assert_close(program.run(x), shifted_window_scores(x))
    per_call = [line for line in program.lines if isinstance(line, (CallKernel, CallExtern))
                and _computes(line, *_MASK_OPS)]
    assert not per_call, program.code()
    masks = [t for t in program.constants.values() if t.numel() == 4 * 16 * 16]
    assert len(masks) == 1, program.code()
    assert set(masks[0].unique().tolist()) == {0.0, -100.0}


def test_shifted_window_mask_with_symbolic_sizes_matches_eager():
    """Symbolic sizes: the mask is computed per call (its size is the input's), and right."""
    torch.manual_seed(1)
    x = torch.randn(2, 8, 12, 3)
    program = fxwrap.lower(shifted_window_scores, x, dynamic=True, options={"cache": False})
    for shape in [(2, 8, 12, 3), (3, 12, 16, 5)]:
        x = torch.randn(shape)
        torch.testing.assert_close(program.run(x), shifted_window_scores(x))


def test_tensor_constant_read_by_an_extern_is_not_copied_per_call():
    def fn(x):
        weight = torch.tensor([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]]) * 2 + 1
        return torch.mm(x, weight.t()), torch.flip(x, (0,)) * torch.tensor([0.5, 1.5, -1.0])

    x = torch.randn(5, 3)
    program = fxwrap.lower(fn, x, options={"cache": False})
    for _ in range(2):
        x = torch.randn(5, 3)
        for got, want in zip(program.run(x), fn(x)):
            torch.testing.assert_close(got, want)
    assert not [line for line in program.lines if isinstance(line, CallKernel) and _computes(line, "lift_fresh_copy")
                and not _computes(line, "mul")], program.code()
    (mm,) = [line for line in program.lines if isinstance(line, CallExtern) and _computes(line, "mm")]
    assert mm.args[1].name in program.constants, program.code()  # the weight, built once


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_returned_constant_is_fresh_each_call(dynamic):
    """A value built from constants alone that the program returns is the caller's to write
    into: each call returns a new tensor, and writing into it changes no later call."""
    def fn(x):
        scale = torch.tensor([1.0, 2.0, 3.0]) * 2
        return x * scale, scale.view(3, 1) - 1

    x = torch.randn(4, 3)
    program = fxwrap.lower(fn, x, dynamic=dynamic, options={"cache": False})
    first = program.run(x)
    first[1].add_(100.0)
    first[0].add_(100.0)
    again = program.run(x)
    for got, want in zip(again, fn(x)):
        torch.testing.assert_close(got, want)
    assert again[1].data_ptr() != first[1].data_ptr()


def test_roll_index_arithmetic_is_not_folded():
    """A roll's ``(arange + k) % n`` indices stay index arithmetic (no constant index tensor)."""
    def fn(x):
        return torch.roll(x, shifts=(3, -1), dims=(0, 1)) * 2

    x = torch.randn(6, 5)
    program = fxwrap.lower(fn, x, options={"cache": False})
    x = torch.randn(6, 5)
    torch.testing.assert_close(program.run(x), fn(x))
    assert not [t for t in program.constants.values() if not t.dtype.is_floating_point], program.code()
