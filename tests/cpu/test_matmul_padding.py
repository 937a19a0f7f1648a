"""Matrix products with an odd column count computed over padded rows (``fxwrap.core.
matmul_padding``, asked for by ``capabilities()["matmul_alignment_bytes"]``: cuBLAS's fast
kernels want 16-byte leading dimensions).  Here the capability is switched on for the CPU
target: a language-model head (``F.linear`` with a transposed weight), an ``addmm`` with a
bias, a product read by a softmax and a view, and one left alone (aligned), each with
eager's numbers; structure: the padded product's result has rows of a multiple of 16
bytes, an inference output keeps them (no copy back), a training output comes back contiguous,
a small product is not padded."""
from __future__ import annotations

import dataclasses
import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.core import matmul_padding
from fxwrap.plugins.session import CompileSession
from fxwrap.ir.lines import CallExtern


EXTERN = {"templates": "off"}  # the product an ATen call (out=), as on CUDA by default


@pytest.fixture
def aligned(monkeypatch):
    original = CompileSession.capabilities

    def capabilities(self):
        return dataclasses.replace(original.fget(self), matmul_alignment_bytes=16)
    monkeypatch.setattr(CompileSession, "capabilities", property(capabilities))
    monkeypatch.setattr(matmul_padding, "MIN_FLOPS", 1)


def head(h, wte):                       # GPT-2's tied head: h @ wte.t()
    return F.linear(h, wte).view(2, -1, wte.shape[0])


def biased_softmax(x, w, b):
    return torch.softmax(F.linear(x, w, b), -1).sum(0), F.linear(x, w, b)[:, :5] * 2


def flattened(x, w):  # a view that only a contiguous result allows: the pass stands back
    return F.linear(x, w).view(-1) * 2


def aligned_product(x, w):
    return x @ w


def _products(program):
    return [ln for ln in program.lines if isinstance(ln, CallExtern) and "mm" in str(ln.op)]


def _widths(program):
    """The row strides of the buffers the products write (``out=``)."""
    return [int(out.stride[0]) for call in _products(program) for _, out in call.kwargs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_odd_columns_are_computed_over_padded_rows(aligned, dtype):
    gen = torch.Generator().manual_seed(7)
    h, wte = torch.randn(2 * 9, 32, generator=gen).to(dtype), torch.randn(1001, 32, generator=gen).to(dtype)
    program = fxwrap.lower(head, h, wte, target="cpu", options=EXTERN)
    got, want = program.run(h, wte), head(h, wte)
    tol = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    step = 16 // got.element_size()
    assert _widths(program) and all(w % step == 0 and w >= 1001 for w in _widths(program))
    # the output keeps the padded rows (as Inductor's pad_mm returns it): no copy back, so the
    # program holds the product once, beside the padded weight (18 and 32 rows of that width)
    padded = _widths(program)[0]
    assert got.shape == want.shape and got.stride() == (9 * padded, padded, 1)
    assert program.peak_bytes == (18 + 32) * padded * got.element_size()


def test_an_output_of_a_training_forward_is_cloned_back(aligned):
    """In a training graph the model's output keeps eager's layout (AOTAutograd hands it to
    the user and to autograd as traced): the padded product's rows are copied back."""
    gen = torch.Generator().manual_seed(12)
    h = torch.randn(18, 32, generator=gen, requires_grad=True)
    wte = torch.randn(1001, 32, generator=gen, requires_grad=True)
    compiled = torch.compile(head, backend=fxwrap.Backend("cpu", EXTERN))
    got = compiled(h, wte)
    torch.testing.assert_close(got, head(h, wte))
    assert got.is_contiguous()
    got.sum().backward()
    want_h, want_w = torch.autograd.grad(head(h, wte).sum(), (h, wte))
    torch.testing.assert_close(h.grad, want_h)
    torch.testing.assert_close(wte.grad, want_w)


def test_a_bias_and_readers_of_the_padded_result(aligned):
    gen = torch.Generator().manual_seed(8)
    x, w, b = torch.randn(12, 40, generator=gen), torch.randn(77, 40, generator=gen), torch.randn(77, generator=gen)
    program = fxwrap.lower(biased_softmax, x, w, b, target="cpu", options=EXTERN)
    for got, want in zip(program.run(x, w, b), biased_softmax(x, w, b)):
        torch.testing.assert_close(got, want)
    assert len(_widths(program)) == 2 and all(width == 80 for width in _widths(program))


def test_a_view_the_padded_rows_do_not_allow_keeps_the_graph_as_it_was(aligned):
    gen = torch.Generator().manual_seed(10)
    x, w = torch.randn(12, 40, generator=gen), torch.randn(77, 40, generator=gen)
    program = fxwrap.lower(flattened, x, w, target="cpu", options=EXTERN)
    torch.testing.assert_close(program.run(x, w), flattened(x, w))
    assert _widths(program) == [77]


def test_aligned_and_small_products_are_left_alone(aligned, monkeypatch):
    gen = torch.Generator().manual_seed(9)
    x, w = torch.randn(16, 24, generator=gen), torch.randn(24, 64, generator=gen)
    program = fxwrap.lower(aligned_product, x, w, target="cpu", options=EXTERN)
    torch.testing.assert_close(program.run(x, w), x @ w)
    assert _widths(program) == [64]
    monkeypatch.setattr(matmul_padding, "MIN_FLOPS", 1 << 40)
    h, wte = torch.randn(18, 32, generator=gen), torch.randn(1001, 32, generator=gen)
    assert _widths(fxwrap.lower(head, h, wte, target="cpu", options=EXTERN)) == [1001]


def test_a_one_row_product_is_left_alone(aligned):
    """A decode step's head (one row): padding would copy the whole weight on every call."""
    gen = torch.Generator().manual_seed(11)
    h, wte = torch.randn(1, 1, 32, generator=gen), torch.randn(1001, 32, generator=gen)

    def decode_head(h, wte):  # logits (1, 1, vocab) of one token
        return F.linear(h, wte).view(1, 1, -1)

    program = fxwrap.lower(decode_head, h, wte, target="cpu", options=EXTERN)
    torch.testing.assert_close(program.run(h, wte), decode_head(h, wte))
    assert _widths(program) == [1001]


def head_with_a_constant(h, wte):
    """A tensor the program computes once (constant folding: a real tensor in the graph, as the
    empty KV cache HF GPT-2 concatenates to) beside the head: the pass must still apply."""
    scale = torch.tensor([0.5, 2.0]).repeat(16)     # folded into one constant when the program is built
    return F.linear(h * scale, wte).view(2, -1, wte.shape[0])


def test_a_folded_constant_in_the_graph_does_not_stop_the_padding(aligned):
    gen = torch.Generator().manual_seed(12)
    h, wte = torch.randn(2 * 9, 32, generator=gen), torch.randn(1001, 32, generator=gen)
    program = fxwrap.lower(head_with_a_constant, h, wte, target="cpu", options=EXTERN)
    torch.testing.assert_close(program.run(h, wte), head_with_a_constant(h, wte))
    assert _widths(program) and all(w % 4 == 0 and w >= 1001 for w in _widths(program)), _widths(program)
