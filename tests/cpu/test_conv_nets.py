"""Convolution nets on the ``cpu`` target against eager: conv / batch norm / ReLU blocks,
max-pools, residual adds, with odd channel counts, strides, groups, dilation, batch 1,
float32 and bfloat16, static and ``dynamic=True``; and the structure of their programs:
batch norm + ReLU written in place into the convolution's result, a pooled activation
stored once (the layout pass drops the channels-last clone it would need otherwise), a
small output that keeps no large storage alive, and kernels that must not write in
place (an input read at another element) that do not."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, Return, Reuse

aten = torch.ops.aten


def _bn(c):
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():  # running statistics and affine far from the identity
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class Block(nn.Module):
    """conv (stride, dilation) -> BN -> ReLU -> max-pool -> grouped conv -> BN -> ReLU, + residual."""

    def __init__(self, cin, cmid, stride, groups, dilation):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cmid, 3, stride=stride, padding=dilation, dilation=dilation, bias=False)
        self.bn1 = _bn(cmid)
        self.conv2 = nn.Conv2d(cmid, cmid, 3, padding=1, groups=groups, bias=True)
        self.bn2 = _bn(cmid)
        self.head = nn.Linear(cmid, 7)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.max_pool2d(y, 2, ceil_mode=True)
        z = F.relu(self.bn2(self.conv2(y))) + y
        return self.head(F.adaptive_avg_pool2d(z, 1).flatten(1)), z


CASES = [  # batch, cin, cmid, (h, w), stride, groups, dilation
    (2, 3, 5, (13, 11), 1, 1, 1),
    (1, 4, 6, (9, 9), 2, 3, 2),
    (3, 1, 8, (8, 10), 1, 8, 1),
    (2, 6, 12, (7, 16), 2, 4, 1),
]
IDS = [f"b{c[0]}-c{c[1]}x{c[2]}-{c[3][0]}x{c[3][1]}-s{c[4]}-g{c[5]}-d{c[6]}" for c in CASES]
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (4e-2, 4e-2)}


def _close(got, want, dtype):
    rtol, atol = TOL[dtype]
    scale = max(1.0, want.float().abs().max().item())
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_block_matches_eager(case, dtype, dynamic):
    batch, cin, cmid, (h, w), stride, groups, dilation = case
    torch.manual_seed(0)
    model = Block(cin, cmid, stride, groups, dilation).eval().to(dtype)
    compiled = torch.compile(model, backend="fxwrap", dynamic=dynamic, options={"cache": False})
    shapes = [(batch, cin, h, w), (batch + 1, cin, h + 3, w + 2)] if dynamic else [(batch, cin, h, w)] * 2
    with torch.no_grad():
        for shape in shapes:  # fresh inputs each call (a second shape under dynamic=True)
            x = torch.randn(shape, dtype=dtype)
            got, want = compiled(x), model(x)
            for g, e in zip(got, want):
                _close(g, e, dtype)
                assert g.stride() == e.stride()


def _lower(fn, *inputs, dynamic=False):
    return fxwrap.lower(fn, *inputs, dynamic=dynamic, options={"cache": False})


def _conv_bn_relu_pool_net():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), _bn(16), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(16, 8, 3, padding=1), _bn(8), nn.ReLU()).eval()


def _defined_by(lines, op):
    return {line.out.name for line in lines if isinstance(line, CallExtern) and line.op is op}


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_batch_norm_relu_written_into_the_convolution_result(dynamic):
    """The BN + ReLU kernel after a convolution writes into the convolution's result (as
    Inductor's in_out_ptr does): a ``Reuse`` of the conv output by the kernel's output,
    and those two pointers without ``__restrict__`` in the kernel's source."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), _bn(16), nn.ReLU(),
                        nn.Conv2d(16, 8, 3, stride=2, padding=1), _bn(8), nn.ReLU(),
                        nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(2, 3, 12, 10)
    with torch.no_grad():
        program = _lower(net, x, dynamic=dynamic)
        x = torch.randn(2, 3, 12, 10)
        torch.testing.assert_close(program.run(x), net(x), rtol=1e-4, atol=1e-4)
    lines = program.lines
    convs = _defined_by(lines, aten.convolution.default)
    assert len(convs) == 3
    in_place = [line for line in lines if isinstance(line, Reuse) and line.old.name in convs]
    assert len(in_place) == 2, program.code()
    for reuse in in_place:
        kernel = next(line for line in lines if isinstance(line, CallKernel) and reuse.new in line.args)
        assert reuse.old in kernel.args
        pairs = kernel.kernel.launch.in_place
        assert (reuse.old.name, reuse.new.name) in pairs
        head = next(ln for ln in kernel.kernel.source.splitlines() if ln.startswith('extern "C" void'))
        assert head.count("__restrict__") == head.count("ptr") - 2, head
    # and the plan's peak is below the frees-only plan's (one conv-sized buffer less)
    assert program.memory.peak_bytes < program.memory.peak_bytes_frees_only


def test_pooled_activation_stored_once():
    """max-pool feeding a convolution (through the layout pass's channels-last clone) and
    a residual add: the pool's kernel stores one buffer, which the convolution reads."""
    torch.manual_seed(2)
    conv1, conv2, bn1, bn2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), _bn(8), _bn(8)

    def fn(x):  # BN + ReLU + pool: worth storing for the add, not recomputed there
        y = F.max_pool2d(F.relu(bn1(conv1(x))), 2)
        return F.relu(bn2(conv2(y))) + y

    x = torch.randn(2, 4, 10, 10)
    with torch.no_grad():
        program = _lower(fn, x)
        torch.testing.assert_close(program.run(x), fn(x), rtol=1e-4, atol=1e-4)
    lines = program.lines
    conv2_line = [line for line in lines if isinstance(line, CallExtern) and line.op is aten.convolution.default][1]
    pooled = conv2_line.args[0]
    writers = [line for line in lines if isinstance(line, CallKernel) and pooled in line.writes()]
    assert len(writers) == 1
    # the pooled values, once (a combo kernel may write another tensor beside them)
    assert [b for b in writers[0].writes() if tuple(b.size) == tuple(pooled.size)] == [pooled], program.code()


def test_small_output_keeps_no_large_storage():
    """A graph output takes a dead storage only of its own size: the caller keeps the
    output, and with it the storage, after the program returns."""
    net = nn.Sequential(_conv_bn_relu_pool_net(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).eval()
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        program = _lower(net, x)
        out = program.run(x)
        torch.testing.assert_close(out, net(x), rtol=1e-4, atol=1e-4)
    assert out.untyped_storage().nbytes() == out.numel() * out.element_size()
    returned = {b.name for line in program.lines if isinstance(line, Return)
                for b in line.values if hasattr(b, "name")}
    for line in program.lines:
        if isinstance(line, Reuse) and line.new.name in returned:
            assert line.old.storage_bytes == line.new.storage_bytes


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_kernel_reading_other_elements_does_not_write_in_place(dynamic):
    """``relu(y) + max_pool3x3(y)`` (stride 1, same size) between two convolutions reads
    each element of ``y`` in nine places: writing the result into ``y`` (one channels-last
    layout) would read overwritten values. The kernel gets no in-place pair and the
    numbers are eager's."""
    torch.manual_seed(3)
    conv, conv2 = nn.Conv2d(3, 6, 3, padding=1), nn.Conv2d(6, 4, 1)

    def fn(x):
        y = conv(x)
        return conv2(F.relu(y) + F.max_pool2d(y, 3, stride=1, padding=1) * 0.5)

    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        program = _lower(fn, x, dynamic=dynamic)
        for shape in [(2, 3, 9, 9), (3, 3, 11, 11)] if dynamic else [(2, 3, 9, 9)]:
            x = torch.randn(shape)
            torch.testing.assert_close(program.run(x), fn(x), rtol=1e-5, atol=1e-5)
    convs = _defined_by(program.lines, aten.convolution.default)
    assert not [line for line in program.lines if isinstance(line, Reuse) and line.old.name in convs]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_copy_in_its_source_layout_never_leaves_as_an_alias(dynamic):
    """``clone`` of a permuted input keeps the permuted layout, so a kernel need not store
    it again inside the program; but returned (here as a view) it must be a storage of
    its own, as eager's: writing into the output leaves the input as it was."""
    def fn(x):
        y = x.permute(0, 2, 3, 1).clone()
        return y.permute(0, 3, 1, 2), torch.flip(y, (1,)).sum()  # flip: an extern reading y

    x = torch.randn(2, 3, 4, 5)
    program = _lower(fn, x, dynamic=dynamic)
    x = torch.randn(2, 3, 4, 5)
    before = x.clone()
    out, total = program.run(x)
    want_out, want_total = fn(x)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(total, want_total)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    out.add_(1.0)
    torch.testing.assert_close(x, before, rtol=0, atol=0)
