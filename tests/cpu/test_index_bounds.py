"""Index arithmetic that proves its bounds (``core/rules/indexing._proven``): ``torch.roll``
(``index_select`` at ``(arange + k) % n``), Swin's roll + window partition, gathers at an
``arange``: no ``check_index_bounds`` extern, no index tensor in memory, the read a direct
(strided / modular) one fused with its consumer.  Indices that are not provably in range
keep their check (an out-of-range one still raises ``IndexError``).  Numbers against
eager: negative shifts, several dims, static and dynamic."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel
from fxwrap.runtime.checks import check_index_bounds


def _lower(fn, x, dynamic):
    return fxwrap.lower(fn, x, dynamic=dynamic, options={"cache": False})


def _checks(program):
    return [line for line in program.lines if isinstance(line, CallExtern) and line.op is check_index_bounds]


def _kernels(program):
    return [line for line in program.lines if isinstance(line, CallKernel)]


ROLLS = {
    "one_dim_negative": lambda x: torch.roll(x, -3, 1) * 2,
    "two_dims": lambda x: torch.roll(x, shifts=(2, -1), dims=(1, 2)) + 1,
    "shift_past_size": lambda x: torch.roll(x, shifts=(11, -13), dims=(2, 1)),
    "flat": lambda x: torch.roll(x, 5).relu(),
}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", sorted(ROLLS))
def test_roll_is_one_kernel_without_index_checks(name, dynamic):
    fn = ROLLS[name]
    x = torch.randn(2, 6, 5, 3)
    program = _lower(fn, x, dynamic)
    for shape in [(2, 6, 5, 3), (3, 7, 9, 4)] if dynamic else [(2, 6, 5, 3)]:
        x = torch.randn(shape)
        torch.testing.assert_close(program.run(x), fn(x))
    assert not _checks(program), program.code()
    assert not [line for line in program.lines if isinstance(line, CallExtern)
                and not line.op.__name__.startswith("sym_")], program.code()
    assert len(_kernels(program)) == 1, program.code()  # the indices are not stored first
    assert "int64" not in str([b.dtype for line in program.lines for b in line.reads()])


def window_partition(x, window=4, shift=2):
    """Swin: cyclic shift, then windows of ``window`` x ``window`` as rows."""
    B, H, W, C = x.shape
    x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
    x = x.view(B, H // window, window, W // window, window, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, C) * 0.5


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_shifted_window_partition_is_one_kernel(dynamic):
    programs = []
    torch._dynamo.reset()
    compiled = torch.compile(window_partition, dynamic=dynamic,
                             backend=fxwrap.Backend(None, {"on_program": programs.append, "cache": False}))
    for shape in [(2, 8, 12, 3), (1, 12, 16, 5)] if dynamic else [(2, 8, 12, 3)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), window_partition(x))
    assert programs
    for program in programs:
        assert not _checks(program), program.code()
        assert len(_kernels(program)) == 1, program.code()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_gathers_at_an_arange_need_no_check(dynamic):
    def fn(x):
        n = x.shape[1]
        picked = x.index_select(1, torch.arange(1, n, device=x.device))  # columns 1..n-1
        every_other = x[:, torch.arange(0, n, 2, device=x.device)]
        return picked.sum(1), every_other * 3

    x = torch.randn(4, 7)
    program = _lower(fn, x, dynamic)
    for shape in [(4, 7), (5, 9)] if dynamic else [(4, 7)]:
        x = torch.randn(shape)
        for got, want in zip(program.run(x), fn(x)):
            torch.testing.assert_close(got, want)
    assert not _checks(program), program.code()


def test_index_that_may_be_out_of_range_keeps_its_check():
    """``arange(5) + 1`` into a dim of 5 reaches 5: checked, and eager's IndexError."""
    def fn(x):
        return x.index_select(0, torch.arange(5) + 1) * 2

    x = torch.randn(6, 3)
    program = _lower(fn, x, True)  # rows: a size symbol, which may be 5
    torch.testing.assert_close(program.run(x), fn(x))
    assert _checks(program), program.code()
    with pytest.raises(IndexError):
        program.run(torch.randn(5, 3))


CONSTANT_INDICES = {
    "columns": lambda x: x[:, torch.tensor([0, 2, 1])] * 2,
    "negative_rows": lambda x: x[torch.tensor([-1, 0, 2])].sin(),
    "index_select": lambda x: torch.index_select(x, 1, torch.tensor([2, 2, 0])) + 1,
    "gather": lambda x: torch.gather(x, 1, torch.tensor([[0, 2], [1, 1], [2, 0], [0, 0]])) * 3,
}


@pytest.mark.parametrize("name", sorted(CONSTANT_INDICES))
def test_a_constant_index_in_range_is_checked_once_when_the_program_is_built(name):
    """``x[:, torch.tensor([0, 2, 1])]``: the index is a program constant no node writes, so
    its values are checked when the program is built, not by a host check on every call."""
    fn = CONSTANT_INDICES[name]
    x = torch.randn(4, 3)
    program = _lower(fn, x, dynamic=False)
    assert not _checks(program), program.code()
    for _ in range(2):
        x = torch.randn(4, 3)
        torch.testing.assert_close(program.run(x), fn(x))


def test_a_constant_index_out_of_range_raises_as_eager_does():
    with pytest.raises(Exception, match="index 5 is out of bounds for dimension 1 with size 3"):
        _lower(lambda x: x[:, torch.tensor([0, 5])] * 2, torch.randn(4, 3), dynamic=False)


def test_an_index_buffer_of_a_module_is_still_checked_on_every_call():
    """A module's index buffer is an input (``.data`` can change it between calls): its check
    stays, and an index made out of range after the compile raises."""
    class Pick(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("idx", torch.tensor([0, 2, 1]))

        def forward(self, x):
            return x[:, self.idx] * 2

    module = Pick()
    x = torch.randn(4, 3)
    compiled = torch.compile(module, backend="fxwrap")
    try:
        torch.testing.assert_close(compiled(x), module(x))
        module.idx.data[1] = 7
        with pytest.raises(Exception, match="out of bounds"):
            compiled(x)
    finally:
        torch._dynamo.reset()
