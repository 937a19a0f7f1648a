"""The reference npu device (``fxwrap_npu.device``) and fxwrap's ``npu`` target on it.

The device's memory is a range of handles the host cannot read, and its streams run work
on worker threads: what fxwrap does on real accelerators is checked here on a CPU-only
machine.  Parameters and inputs live on the device; results are compared with eager on
the device and on the CPU.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallKernel

device = pytest.importorskip("fxwrap_npu.device", reason="the npu device builds with g++ and torch's headers")
NPU = torch.device("npu", 0)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))


# -- the device -------------------------------------------------------------------------

def test_device_memory_is_not_host_memory():
    """A tensor's data_ptr() is a device handle: reading it on the host faults, as on real
    hardware; reading the tensor through a copy to the CPU gives its values."""
    x = torch.randn(8)
    y = x.to(NPU)
    assert device.is_device_address(y.data_ptr()) and not device.is_device_address(x.data_ptr())
    assert torch.equal(y.cpu(), x)
    code = ("import ctypes, torch, fxwrap_npu.device\n"
            "y = torch.randn(8).to('npu')\n"
            "print(ctypes.string_at(y.data_ptr(), 4))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == -11, (result.returncode, result.stderr[-2000:])  # SIGSEGV


def test_launches_return_before_the_work_and_host_reads_wait():
    y = torch.randn(64).to(NPU)
    start = time.perf_counter()
    device.sleep_on_stream(300)
    queued = time.perf_counter() - start
    values = y.cpu()
    waited = time.perf_counter() - start
    assert queued < 0.1 and waited >= 0.3, (queued, waited)
    assert values.shape == (64,)


def test_an_event_orders_two_streams():
    """Stream 1 writes a tensor late; stream 0 waits for its event before reading it.
    Without the wait the read sees the old values (the test checks that too)."""
    before, after = torch.zeros(256), torch.randn(256)
    y = before.to(NPU)
    side = torch.Stream(device="npu")
    with torch.StreamContext(side) if hasattr(torch, "StreamContext") else side:
        device.sleep_on_stream(200)
        y.copy_(after)
        done = torch.Event(device="npu")
        done.record()
    early = y.cpu()  # the default stream does not wait for the side stream
    torch.npu.current_stream().wait_event(done)
    assert torch.equal(y.cpu(), after) and torch.equal(early, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool])
def test_round_trips_views_and_copies(dtype):
    x = (torch.randn(7, 13) * 10).to(dtype)
    d = x.to(NPU)
    assert torch.equal(d.cpu(), x)
    assert torch.equal(d[2:, 1::3].cpu(), x[2:, 1::3])  # a view: an interior handle
    assert torch.equal(d.t().contiguous().cpu(), x.t().contiguous())
    assert torch.equal(d.to("npu:1").cpu(), x)  # across devices
    e = torch.empty(13, 7, dtype=dtype, device=NPU)
    e.copy_(d.t())  # device to device, strided source
    assert torch.equal(e.cpu(), x.t())
    f = torch.empty(7, 13, dtype=dtype, device=NPU)[:, ::2]
    f.copy_(x[:, ::2])  # host to device into a strided view
    assert torch.equal(f.cpu(), x[:, ::2])
    if dtype.is_floating_point:
        assert d[3, 4].item() == x[3, 4].item()


def test_convolution_forward_and_backward_on_the_device():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    on_device = copy.deepcopy(conv).to(NPU)
    x = torch.randn(2, 3, 8, 8)
    xd = x.to(NPU).requires_grad_()
    xc = x.clone().requires_grad_()
    on_device(xd).square().sum().backward()
    conv(xc).square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(on_device.weight.grad.cpu(), conv.weight.grad, rtol=1e-5, atol=1e-5)


# -- the fxwrap target ------------------------------------------------------------------

def test_the_npu_target_is_chosen_for_npu_tensors():
    programs = []
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    out = torch.compile(lambda t: (t.sin() * 2).softmax(-1), backend="fxwrap",
                        options={"on_program": programs.append})(x.to(NPU))
    assert [p.target.name for p in programs] == ["npu"] and out.device == NPU
    torch.testing.assert_close(out.cpu(), (x.sin() * 2).softmax(-1))


@pytest.mark.parametrize("what", ["mlp", "softmax", "layernorm"])
def test_inference_matches_eager_on_the_device(what):
    x = torch.randn(6, 16)
    if what == "mlp":
        model = _mlp()
    elif what == "softmax":
        model = torch.nn.Softmax(-1)
    else:
        model = torch.nn.LayerNorm(16)
    on_device = copy.deepcopy(model).to(NPU)
    torch._dynamo.reset()
    got = torch.compile(on_device, backend="fxwrap")(x.to(NPU))
    torch.testing.assert_close(got.cpu(), on_device(x.to(NPU)).cpu())
    torch.testing.assert_close(got.cpu(), model(x), rtol=1e-5, atol=1e-5)


def test_a_training_step_matches_eager_on_the_device():
    reference, model = _mlp(), _mlp().to(NPU)
    compiled = torch.compile(model, backend="fxwrap")
    x = torch.randn(6, 16)
    torch._dynamo.reset()
    for _ in range(2):
        loss = compiled(x.to(NPU)).square().mean()
        loss.backward()
        expected = reference(x).square().mean()
        expected.backward()
        with torch.no_grad():
            for p, q in zip(model.parameters(), reference.parameters()):
                p -= 0.1 * p.grad
                q -= 0.1 * q.grad
                p.grad = q.grad = None
        torch.testing.assert_close(loss.cpu(), expected, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_reduce_overhead_replays_a_launch_list_of_npu_tensors():
    model = _mlp()
    on_device = copy.deepcopy(model).to(NPU)
    torch._dynamo.reset()
    compiled = torch.compile(on_device, backend="fxwrap", mode="reduce-overhead")
    for seed in range(3):  # record, then replays on new inputs
        x = torch.randn(6, 16, generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(compiled(x.to(NPU)).cpu(), model(x), rtol=1e-5, atol=1e-5)


def test_a_compiled_call_adds_no_host_sync():
    """Kernels are queued, never waited for: a program of kernels alone makes no host
    wait; one with externs (which run through the device's CPU fallback, each a copy to
    the host) waits no more often than eager does for the same model."""
    x = torch.randn(32, 64).to(NPU)
    torch._dynamo.reset()
    kernels_only = torch.compile(lambda t: (t.sin() * t).softmax(-1) + t.mean(-1, keepdim=True), backend="fxwrap")
    kernels_only(x)
    before = device.host_syncs()
    kernels_only(x)
    assert device.host_syncs() == before
    model = _mlp().to(NPU)
    compiled = torch.compile(model, backend="fxwrap")
    y = torch.randn(6, 16).to(NPU)
    compiled(y)
    s0 = device.host_syncs()
    compiled(y)
    s1 = device.host_syncs()
    model(y)
    s2 = device.host_syncs()
    assert s1 - s0 <= s2 - s1, (s1 - s0, s2 - s1)


def test_a_saved_program_runs_in_a_fresh_process(tmp_path):
    model = _mlp().to(NPU)
    x = torch.randn(6, 16)
    program = fxwrap.lower(model, x.to(NPU))
    path = tmp_path / "mlp.fxw"
    program.save(str(path))
    torch.save({"x": x, "expected": model(x.to(NPU)).cpu()}, tmp_path / "io.pt")
    code = ("import sys, torch, fxwrap, fxwrap_npu.device\n"
            "io = torch.load(sys.argv[2])\n"
            "program = fxwrap.load(sys.argv[1])\n"
            "got = program.run(io['x'].to('npu'))\n"
            "got = got[0] if isinstance(got, (tuple, list)) else got\n"
            "torch.testing.assert_close(got.cpu(), io['expected'])\n"
            "print('OK', got.device)\n")
    result = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "io.pt")],
                            capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert result.returncode == 0 and "OK npu:0" in result.stdout, result.stderr[-3000:]


def test_profile_times_kernels_with_the_devices_events():
    x = torch.randn(64, 256).to(NPU)
    report = fxwrap.profile(lambda t: (t.sin() * t).softmax(-1), x)
    text = str(report)
    assert "target npu" in text and "fxwrap_" in text, text
    kernels = [launch for launch in report.launches if launch.kind == "kernel"]
    assert kernels and all(launch.total_s > 0 for launch in kernels)


def test_the_kits_stream_check_fails_a_launcher_that_ignores_the_current_stream():
    """The conformance kit's ``test_stream_order`` (``checks.check_stream_order``) passes on
    the npu target and fails a planted one whose launcher queues on the default stream."""
    import fxwrap_npu.target as target_module
    from fxwrap.testing import checks

    class DefaultStreamEmitter(target_module.NpuEmitter):
        def load(self, source):
            launch = super().load(source)
            default = torch.Stream(stream_id=0, device_index=0, device_type=20)

            def on_the_default_stream(*args):
                with default:
                    launch(*args)
            return on_the_default_stream

    checks.check_stream_order("npu", NPU, device.sleep_on_stream)
    planted = fxwrap.Target("npu_default_stream", "npu", target_module.NpuDevice(), DefaultStreamEmitter,
                            fxwrap.WrapperCodegen)
    torch._dynamo.reset()
    with pytest.raises(AssertionError, match="do not go to the current stream"):
        checks.check_stream_order(planted, NPU, device.sleep_on_stream)


class Block(torch.nn.Module):
    """A small pre-norm transformer block: RMSNorm, causal attention through
    F.scaled_dot_product_attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, dim=32, heads=4, hidden=64):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(dim, eps=1e-6), torch.nn.RMSNorm(dim, eps=1e-6)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim, bias=False), torch.nn.Linear(dim, dim, bias=False)
        self.gate, self.up = torch.nn.Linear(dim, hidden, bias=False), torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        F = torch.nn.functional
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def test_a_transformer_block_inference_and_training_step():
    torch.manual_seed(0)
    block = Block()
    eager, on_device = copy.deepcopy(block).to(NPU), copy.deepcopy(block).to(NPU)
    torch._dynamo.reset()
    compiled = torch.compile(on_device, backend="fxwrap")
    x, target = torch.randn(2, 10, 32), torch.randn(2, 10, 32)
    with torch.no_grad():
        out = compiled(x.to(NPU))
        torch.testing.assert_close(out.cpu(), eager(x.to(NPU)).cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.cpu(), block(x), rtol=1e-5, atol=1e-5)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, on_device)]
    for run, opt in ((eager, opts[0]), (compiled, opts[1])):
        opt.zero_grad()
        torch.nn.functional.mse_loss(run(x.to(NPU)), target.to(NPU)).backward()
        opt.step()
    for p, q in zip(eager.parameters(), on_device.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(q.detach().cpu(), p.detach().cpu(), rtol=1e-5, atol=1e-5)


def test_template_timing_measures_the_devices_queued_work():
    """``DeviceInterface.time_calls`` times between the device's events: work queued on the
    stream counts, though each call returns at once on the host."""
    from fxwrap_npu.target import NpuDevice
    seconds = NpuDevice().time_calls(lambda: device.sleep_on_stream(20), 3)
    assert 0.018 <= seconds < 0.2, seconds


def test_a_two_layer_hf_llama_inference_and_training_step():
    """transformers' ``LlamaForCausalLM`` (2 layers, grouped KV heads, SDPA, rotary
    embeddings) with its parameters and tokens on the device: logits and a training step's
    gradients are eager's on the device and on the CPU."""
    transformers = pytest.importorskip("transformers", reason="the HF Llama needs transformers")
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=128, vocab_size=300,
                                      max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    eager, on_device = copy.deepcopy(model).to(NPU), copy.deepcopy(model).to(NPU)
    tokens = torch.randint(0, 300, (2, 12))
    torch._dynamo.reset()
    programs = []
    compiled = torch.compile(on_device, backend=fxwrap.Backend("npu", {"on_program": programs.append}))
    with torch.no_grad():
        got = compiled(tokens.to(NPU)).logits
    assert programs and all(p.target.name == "npu" for p in programs)
    assert sum(isinstance(ln, CallKernel) for p in programs for ln in p.lines) >= 10  # norms, rotary, SwiGLU
    with torch.no_grad():
        torch.testing.assert_close(got.cpu(), eager(tokens.to(NPU)).logits.cpu(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.cpu(), model(tokens).logits, rtol=1e-4, atol=1e-4)
    eager.train(), on_device.train()
    for run in (eager, compiled):
        run(tokens.to(NPU), labels=tokens.to(NPU)).loss.backward()
    assert {p.kind for p in programs} >= {"inference", "forward", "backward"}
    for (name, p), q in zip(eager.named_parameters(), on_device.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-3, atol=1e-5, msg=name)
