"""Split (two-kernel) column reductions: ``x.sum(0)`` with a long reduction and few
columns runs as per-chunk partials into a workspace, then an ordered combine that also
runs the epilogue.  Compared with eager on fresh random inputs; the plan is asserted
from the kernels' launch metadata."""
from __future__ import annotations

import pytest
import torch

from triton_helpers import DEVICE, GPU, Reduction, Store, acc, buf, build, check, compiled, kernel, kernels, ld, r0, x0

F32 = torch.float32
# rows large enough that the planner splits (GPU: rnumel >= 4096; interpreter: >= 128)
ROWS = 8192 if GPU else 1001


def plans(ks):
    return [k.launch.plan for k in ks]


def split_kernels(ks):
    return [k for k in ks if k.launch.plan == "split-outer"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_sum_is_split(dtype):
    x = torch.randn(ROWS, 37, device=DEVICE).to(dtype)
    ks = check(lambda x: x.sum(0), (x,))
    sk = split_kernels(ks)
    assert sk, plans(ks)
    launch = sk[0].launch
    assert launch.nsplit == dict(launch.config)["NSPLIT"] >= 2
    assert launch.workspace_dtypes == ("torch.float32",)
    assert "_partial" in launch.partial_symbol and launch.partial_symbol in sk[0].source


def test_column_max_and_min_propagate_nan():
    x = torch.randn(ROWS, 19, device=DEVICE)
    x[ROWS // 2, 3] = float("nan")       # in a middle chunk
    x[ROWS - 1, 7] = float("nan")        # in the last (ragged) chunk
    x[:, 11] = float("-inf")
    ks = check(lambda x: (x.amax(0), x.amin(0)), (x,))
    assert split_kernels(ks), plans(ks)
    got = compiled(lambda x: x.amax(0))[0](x)
    assert torch.isnan(got[3]) and torch.isnan(got[7]) and got[11] == float("-inf")


def test_column_sum_with_an_epilogue():
    x = torch.randn(ROWS, 45, device=DEVICE)
    y = torch.randn(45, device=DEVICE)
    ks = check(lambda x, y: torch.relu(x.sum(0) * 2 + y), (x, y))
    assert split_kernels(ks), plans(ks)


@pytest.mark.parametrize("rows", [ROWS + 1, ROWS + 31, 3 * ROWS // 2 + 7])
def test_ragged_rows_and_columns(rows):
    x = torch.randn(rows, 23, device=DEVICE)
    ks = check(lambda x: x.sum(0), (x,), tol=dict(rtol=1e-4, atol=1e-3))
    assert split_kernels(ks), plans(ks)


def test_column_sum_of_a_3d_tensor_and_mean():
    x = torch.randn(ROWS, 3, 5, device=DEVICE)
    ks = check(lambda x: (x.sum(0), x.mean(0)), (x,), tol=dict(rtol=1e-4, atol=1e-3))
    assert split_kernels(ks), plans(ks)


def test_column_any_all_prod():
    x = torch.randn(ROWS, 9, device=DEVICE)
    b = x > -2.5
    b[:, 4] = True
    p = 1 + torch.rand(ROWS, 9, device=DEVICE) * 1e-4
    check(lambda b, p: (b.any(0), b.all(0), p.prod(0)), (b, p), tol=dict(rtol=1e-4, atol=1e-4))


def test_dynamic_shapes_split_and_stay_correct():
    f, programs = compiled(lambda x: x.sum(0) * 3, dynamic=True)
    for rows, cols in ((ROWS, 33), (ROWS + 77, 33), (ROWS // 2 + 5, 20), (3, 33), (0, 33)):
        x = torch.randn(rows, cols, device=DEVICE)
        torch.testing.assert_close(f(x), x.sum(0) * 3, rtol=1e-4, atol=1e-3)
    ks = kernels(programs)
    assert ks and any(k.launch.plan == "split-outer" for k in ks), plans(ks)


def test_split_is_bitwise_reproducible():
    x = torch.randn(ROWS, 41, device=DEVICE)
    f, programs = compiled(lambda x: x.sum(0))
    first = f(x)
    assert all(torch.equal(f(x), first) for _ in range(3))
    assert split_kernels(kernels(programs))


def test_short_or_inner_reductions_are_not_split():
    x = torch.randn(40, 37, device=DEVICE)
    ks = check(lambda x: x.sum(0), (x,))
    assert not split_kernels(ks)
    x = torch.randn(7, ROWS, device=DEVICE)
    ks = check(lambda x: x.sum(1), (x,), tol=dict(rtol=1e-4, atol=1e-3))
    assert not split_kernels(ks)


def test_column_softmax_is_not_split():
    """A reduction that reads another's result (max, then sum of exp) keeps one kernel."""
    x = torch.randn(ROWS, 7, device=DEVICE)
    ks = check(lambda x: torch.softmax(x, 0), (x,))
    assert not split_kernels(ks)


def test_handmade_split_kernel_runs_both_launches():
    rows, cols = ROWS + 5, 45
    k = kernel("colsum", [buf("a", (rows, cols))], [buf("o", (cols,))], [Store("o", x0, acc("acc0", F32))],
               ranges=(cols,), reduction_ranges=(rows,),
               reductions=[Reduction("acc0", "sum", ld("a", cols * r0 + x0), F32)])
    launch, src = build(k)
    assert src.launch.plan == "split-outer" and "plan: split reduction" in src.text
    a, o = torch.randn(rows, cols, device=DEVICE), torch.full((cols,), 7.0, device=DEVICE)
    # the partials live in a workspace the caller allocates (the program's Allocate line;
    # here the helper's launcher)
    (ws,) = src.workspaces
    assert ws.dtype == torch.float32 and int(ws.numel) == src.launch.nsplit * cols
    launch(a, o)
    torch.testing.assert_close(o, a.sum(0), rtol=1e-4, atol=1e-3)


# rows long enough that a row reduction splits (GPU: >= 65536 elements; interpreter: >= 128)
LONG = 1 << 17 if GPU else 1003


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_whole_tensor_and_few_long_rows_are_split(dynamic):
    """``x.sum()`` (a loss) and a few long rows: the rows are cut into chunks reduced by
    programs of their own, then combined in order (bitwise reproducible)."""
    x = torch.randn(3, LONG, device=DEVICE)
    for fn in (lambda x: x.sum(), lambda x: (x * x).mean(), lambda x: x.amax(1), lambda x: x.sum(1) * 2):
        ks = check(fn, (x,), dynamic=dynamic)
        sk = split_kernels(ks)
        assert sk and sk[0].launch.reduction_shape == "inner", plans(ks)
    f = compiled(lambda x: x.sum())[0]
    assert torch.equal(f(x), f(x))


def test_split_column_reduction_also_makes_its_row_indexed_stores():
    """A bias gradient fused with the gradient it sums: the partials kernel writes every
    element of ``g * sigmoid(h)`` once (the chunk holding it) and sums its columns."""
    g, h = (torch.randn(ROWS, 70, device=DEVICE) for _ in range(2))

    def bias_grad(g, h):
        d = g * torch.sigmoid(h)
        return d * 3, d.sum(0)

    ks = check(bias_grad, (g, h))
    assert split_kernels(ks), plans(ks)
