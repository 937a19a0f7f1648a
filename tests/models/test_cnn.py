"""A small CNN (conv2d, batchnorm2d, relu, max-pool, avg-pool, linear), forward and
backward, in train mode (batch statistics, running-stat updates) and eval mode."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from models_helpers import DYNAMIC, FWD_TOL, assert_same_training_step, compile_fxwrap, twin, zero_grads


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)  # any spatial size -> 16 features
        return self.fc(x)


def _perturb_batchnorm(model: nn.Module) -> None:
    """Non-trivial affine parameters and running statistics (not 1/0 defaults)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand_like(m.weight) + 0.5)
                m.bias.copy_(torch.randn_like(m.bias))
                m.running_mean.copy_(torch.randn_like(m.running_mean))
                m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_cnn_forward_backward(mode, dynamic):
    model = SmallCNN()
    _perturb_batchnorm(model)
    model.train(mode == "train")
    ref = twin(model)
    entry = "fxwrap.compile" if mode == "eval" else "torch.compile"
    compiled = compile_fxwrap(model, entry, dynamic)
    stats_before = model.bn2.running_var.clone()
    for shape in ((4, 3, 16, 16), (3, 3, 12, 20)):
        zero_grads(model, ref)
        assert_same_training_step(model, ref, compiled, torch.randn(shape))  # buffers too
    assert "backward" in compiled.kinds()
    # train mode updates the running statistics (like eager, checked above); eval does not
    assert torch.equal(model.bn2.running_var, stats_before) == (mode == "eval")


def _externs(program) -> list:
    return [line.op for line in program.lines if type(line).__name__ == "CallExtern"]


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "externs"])
def test_cnn_inference_calls_convolution_functionally(kernels, dynamic):
    """``aten.convolution.out`` has no kernel of its own (it computes into a temporary
    and copies), so the program calls ``aten.convolution.default``; matrix products
    keep their native out= overload.  With kernels, inference batch norm is no extern
    at all: it is pointwise math fused with the ReLU after each convolution."""
    torch.manual_seed(5)
    model = SmallCNN().eval()
    _perturb_batchnorm(model)
    compiled = compile_fxwrap(model, dynamic=dynamic, kernels=kernels)
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **FWD_TOL)
    (program,) = compiled.programs
    ops = _externs(program)
    aten = torch.ops.aten
    assert ops.count(aten.convolution.default) == 2 and aten.convolution.out not in ops
    assert aten.addmm.out in ops
    batch_norm = [op for op in ops if "batch_norm" in str(op)]
    if kernels:
        assert batch_norm == []
        compute = [line.op if type(line).__name__ == "CallExtern" else "kernel" for line in program.lines
                   if type(line).__name__ == "CallKernel"
                   or (type(line).__name__ == "CallExtern" and line.op is not aten.sym_storage_offset.default)]
        conv1 = compute.index(aten.convolution.default)
        assert compute[conv1 + 1] == "kernel"  # bn1 + relu
        assert not any("max_pool" in str(op) for op in ops)  # max pooling is a kernel too
    else:
        assert batch_norm and all(str(op).endswith(".default") for op in batch_norm)


class ResidualConvNet(nn.Module):
    """Two convolution blocks with a residual add, then a flattening of the whole map
    (``view`` of every spatial element: valid only on a contiguous tensor) or a pool."""

    def __init__(self, head: str):
        super().__init__()
        self.head = head
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + y)
        if self.head == "flatten":
            return y.view(y.shape[0], -1)
        return y, F.adaptive_avg_pool2d(y, 1).flatten(1)


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("head", ["pool", "flatten"])
def test_inference_convolutions_run_channels_last(head, dynamic):
    torch.manual_seed(6)
    model = ResidualConvNet(head).eval()
    _perturb_batchnorm(model)
    compiled = compile_fxwrap(model, dynamic=dynamic)
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **FWD_TOL)
        assert g.stride() == w.stride()  # outputs keep eager's layout
    (program,) = compiled.programs
    aten = torch.ops.aten
    conv_inputs = [line.args[0] for line in program.lines
                   if type(line).__name__ == "CallExtern" and line.op is aten.convolution.default]
    assert len(conv_inputs) == 2
    channels_last = [b.stride[1] == 1 for b in conv_inputs]
    # the flatten head views every spatial element: channels-last would need a copy
    # there, so the graph keeps its traced (contiguous) layout
    assert channels_last == ([True, True] if head == "pool" else [False, False])
