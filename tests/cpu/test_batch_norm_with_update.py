"""``aten._batch_norm_with_update`` (what ``batch_norm`` in training becomes in graphs
captured before dispatch, and an OpInfo of its own) with bf16/fp16 running stats.

torch's meta function gives the functional op's new running stats as float32 where the
CPU and CUDA kernels return the input's dtype; run as an extern, fxwrap read the bf16
results as float32 and wrote garbage into ``running_mean``/``running_var`` (the OpInfo
sweep on an H200 found it).  The op is decomposed now, as Inductor does.
"""
import pytest
import torch

import fxwrap  # noqa: F401  (registers the backend)


def batch_norm_with_update(x, weight, bias, running_mean, running_var):
    return torch.ops.aten._batch_norm_with_update(x, weight, bias, running_mean, running_var, 0.5, 0.6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_running_stats_are_eagers(dtype):
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(4, 6, 5, generator=g).to(dtype), torch.randn(6, generator=g).to(dtype),
            torch.randn(6, generator=g).to(dtype), torch.randn(6, generator=g).to(dtype),
            (torch.rand(6, generator=g) + 0.5).to(dtype)]
    eager_args = [a.clone() for a in args]
    expected = batch_norm_with_update(*eager_args)
    torch._dynamo.reset()
    compiled_args = [a.clone() for a in args]
    got = torch.compile(batch_norm_with_update, backend="fxwrap")(*compiled_args)
    # fxwrap computes in float32 and rounds once; eager rounds between steps: one ulp apart
    tol = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float32 else {}
    torch.testing.assert_close(got[0], expected[0], **tol)
    for name, i in (("running_mean", 3), ("running_var", 4)):
        torch.testing.assert_close(compiled_args[i], eager_args[i], **tol, msg=lambda m: f"{name}: {m}")
