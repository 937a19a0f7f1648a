"""In a channels-last convolution net, a sum whose first operand is a broadcast (``expand(grad /
256) + convolution_backward(...)[0]``, the average pool's gradient plus a residual's), which
ATen makes NCHW, takes its operands the other way round and is channels-last
(``core/layout._follow_channels_last``).  The suite conv net's max-pool gradient read that sum
with a channel stride of H*W: its two kernels (fused with the batch-norm gradient's column
sums) took 27 ms at one thread, 10.6 ms reading it channels-last."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import DefineKernel


def _pool_grad_of_broadcast_plus_conv(x, w, g, pooled_from, indices):
    y = F.conv2d(x, w, padding=1)
    z = g[:, :, None, None].expand_as(y) / 256 + y      # NCHW by ATen's rule (first operand)
    return torch.ops.aten.max_pool2d_with_indices_backward(z, pooled_from, [2, 2], [2, 2], [0, 0], [1, 1],
                                                           False, indices)


def _inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    pooled_from = torch.randn(2, 16, 10, 10, generator=gen).to(memory_format=torch.channels_last)
    return (torch.randn(2, 8, 5, 5, generator=gen), torch.randn(16, 8, 3, 3, generator=gen),
            torch.randn(2, 16, generator=gen), pooled_from, F.max_pool2d(pooled_from, 2, return_indices=True)[1])


def test_sum_read_by_pooling_gradient_is_channels_last():
    program = fxwrap.lower(_pool_grad_of_broadcast_plus_conv, *_inputs(0), options={"cache": False})
    (source,) = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)
                 and "max_pool2d_with_indices_backward" in line.kernel.source.split('extern "C"')[0]]
    # the gradient the pooling gathers from, as the pooling kernel reads it: channels-last
    read = re.findall(r"// in_ptr\d+: \w+ float32 size=\(2, 16, 5, 5\) stride=\(([\d, ]+)\)", source)
    assert read == ["400, 1, 80, 16"], (read, source[:1500])
    for seed in (1, 2):
        args = _inputs(seed)
        out = program.run(*args)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, _pool_grad_of_broadcast_plus_conv(*args), rtol=1e-4, atol=1e-4)


def test_sum_read_by_pointwise_ops_is_one_kernel_with_them():
    def fn(x, w, g):
        y = F.conv2d(x, w, padding=1)
        return (g[:, :, None, None].expand_as(y) / 256 + y).relu() * 2

    program = fxwrap.lower(fn, *_inputs(0)[:3], options={"cache": False})
    assert len(re.findall(r"empty_strided\(\(2, 16, 5, 5\)", program.code())) == 1  # the output only
    args = _inputs(3)[:3]
    out = program.run(*args)
    torch.testing.assert_close(out[0] if isinstance(out, (tuple, list)) else out, fn(*args), rtol=1e-4, atol=1e-4)


def test_dynamic_sizes_match_eager():
    program = fxwrap.lower(_pool_grad_of_broadcast_plus_conv, *_inputs(0), dynamic=True, options={"cache": False})
    args = _inputs(4)
    out = program.run(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, _pool_grad_of_broadcast_plus_conv(*args), rtol=1e-4, atol=1e-4)
