"""Welford reductions over a non-contiguous dimension, split: batch norm's statistics over
(N, H, W) of a channels-last tensor, ``var_mean`` over the rows of a column-major matrix
and over the middle dim of ``[A, R, B]``.  The planner gives them the split-outer plan
(partial mean, M2 and count per chunk into three workspaces, then Chan's combine in a
fixed order), where before they ran one program per tile of channels walking every row.
Numbers against eager (fp32, bf16, training batch norm's outputs and running stats,
symbolic sizes); the plan from the kernels' launch metadata."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from triton_helpers import DEVICE, GPU, check, compiled

ROWS = 8192 if GPU else 1001  # reduced elements per channel large enough to split


def _split_welford(ks):
    return [k for k in ks if k.launch.plan == "split-outer" and "_fx_welford" in k.source]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_var_mean_over_rows_of_channels_last_is_split(dtype):
    # [N, C, H, W] channels-last: var_mean over (0, 2, 3) reads C contiguous, reduces N*H*W
    n, h, w = (8, 32, 32) if GPU else (1, 13, 11)
    x = torch.randn(n, 6, h, w, device=DEVICE).to(dtype).to(memory_format=torch.channels_last) * 3 + 1
    ks = check(lambda x: torch.var_mean(x, dim=(0, 2, 3), correction=0), (x,),
               tol=dict(rtol=2e-2, atol=2e-2) if dtype is torch.bfloat16 else dict(rtol=1e-4, atol=1e-4))
    sk = _split_welford(ks)
    assert sk, [k.launch.plan for k in ks]
    assert sk[0].launch.workspace_dtypes == ("torch.float32",) * 3
    assert dict(sk[0].launch.config)["NSPLIT"] >= 2


def test_middle_dim_var_mean_is_split():
    x = torch.randn(3, ROWS, 5, device=DEVICE) * 2 - 1
    ks = check(lambda x: torch.var_mean(x, dim=1), (x,), tol=dict(rtol=1e-4, atol=1e-4))
    assert _split_welford(ks), [k.launch.plan for k in ks]


def test_training_batch_norm_over_nhwc():
    """F.batch_norm in training over a channels-last input: the output, the batch statistics
    through the running mean / var buffers (updated in place) against eager's."""
    n, h, w = (8, 32, 32) if GPU else (1, 13, 11)
    x = (torch.randn(n, 5, h, w, device=DEVICE) * 2 + 0.5).to(memory_format=torch.channels_last)
    weight, bias = torch.rand(5, device=DEVICE) + 0.5, torch.randn(5, device=DEVICE)
    mean, var = torch.zeros(5, device=DEVICE), torch.ones(5, device=DEVICE)
    mean2, var2 = mean.clone(), var.clone()

    def fn(x, mean, var):
        return F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5)

    torch._dynamo.reset()
    f, programs = compiled(fn)
    got = f(x, mean, var)
    want = fn(x, mean2, var2)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mean, mean2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var, var2, rtol=1e-4, atol=1e-4)
    ks = [n.target for p in programs for n in p.graph_module.graph.nodes if hasattr(n.target, "launch")]
    assert _split_welford(ks), [k.launch.plan for k in ks]


def test_welford_split_with_symbolic_sizes():
    f, programs = compiled(lambda x: torch.var_mean(x, dim=0), dynamic=True)
    for rows, cols in ((ROWS, 7), (ROWS + 33, 7), (ROWS // 2 + 3, 4), (2, 7)):
        x = torch.randn(rows, cols, device=DEVICE) + 3
        for g, e in zip(f(x), torch.var_mean(x, dim=0)):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
