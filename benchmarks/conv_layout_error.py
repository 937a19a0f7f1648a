"""Is a channels-last convolution training step's gradient error a tolerance question or a bug?

The conformance kit trains its ``conv_net`` one step on the GPU and compares every gradient
with eager's on the CPU (float32, ``GRADIENT_TOLERANCE`` rtol 1e-3, atol 1e-4).  With
channels-last training on CUDA the weight gradient came out 2e-4 off (H100, 2026-11-27).
This script measures, for the same model, seed and batch, each gradient's largest error
against a float64 CPU reference, for:

* ``eager-nchw`` / ``eager-nhwc``: eager on the GPU, the traced layout and the model and
  input converted to channels-last (cuDNN's NHWC kernels: no compiler involved);
* ``inductor``: ``torch.compile`` (Inductor keeps the layout it is given);
* ``fxwrap-nchw`` / ``fxwrap-nhwc``: the ``cuda`` target, without and with channels-last
  training pairs (``training_convolution_layout``, forced here on a copy of the device);

each with cuDNN's TF32 on (PyTorch's default for convolutions) and off.  If ``fxwrap-nhwc``'s
error is the size of ``eager-nhwc``'s and both shrink to ~1e-6 with TF32 off, the 2e-4 is
TF32 accumulation in cuDNN's NHWC algorithms (a tolerance question: the kit compares a GPU's
TF32 convolution with a CPU's float32 one); if ``fxwrap-nhwc`` stays off with TF32 off, or is
far worse than ``eager-nhwc``, it is a bug.

    python benchmarks/conv_layout_error.py [--batch 2] [--seed 0]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys

import torch

import fxwrap
from fxwrap.targets.cuda_triton import plugin as triton_plugin
from fxwrap.targets.cuda_triton.device import CudaDevice
from fxwrap.testing.models import GRADIENT_TOLERANCE, MODEL_CASES


class ChannelsLastTrainingDevice(CudaDevice):
    """The CUDA device, asking for channels-last convolution training pairs."""

    def capabilities(self, device=None):
        return dataclasses.replace(super().capabilities(device), training_convolution_layout="channels_last")


def _targets():
    cuda = next(t for t in triton_plugin.fxwrap_targets() if t.name == "cuda")
    return {"fxwrap-nchw": cuda,
            "fxwrap-nhwc": dataclasses.replace(cuda, name="cuda-nhwc", device=ChannelsLastTrainingDevice())}


def _grads(model, x, weight, channels_last=False, compile_with=None):
    """Every gradient (the input's first) of one forward and ``(out * weight).sum()`` backward."""
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    x = x.detach().clone().requires_grad_()
    run = model if compile_with is None else compile_with(model)
    out = run(x)
    (out * weight).sum().backward()
    return {"input": x.grad.detach(), **{n: p.grad.detach() for n, p in model.named_parameters()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/conv_layout_error.py needs a CUDA GPU; skipped", file=sys.stderr)
        return 0
    case = MODEL_CASES["conv_net"]
    torch.manual_seed(args.seed)
    model = case.build().train()
    x = torch.randn(args.batch, *case.batch().shape[1:])
    weight = torch.randn(x.shape[0], 10)
    ref = _grads(copy.deepcopy(model).double(), x.double(), weight.double())
    cpu32 = _grads(copy.deepcopy(model), x, weight)
    print(f"# {torch.cuda.get_device_name()}: torch {torch.__version__}; conv_net batch {args.batch}, "
          f"seed {args.seed}; max |grad - float64 reference| per gradient; kit tolerance {GRADIENT_TOLERANCE}")
    names = list(ref)
    print(f"{'variant':<14} {'tf32':<5} " + " ".join(f"{n[:16]:>16}" for n in names) + "  kit-vs-cpu-eager")
    print(f"{'cpu-eager-f32':<14} {'-':<5} "
          + " ".join(f"{(cpu32[n].double() - ref[n]).abs().max().item():16.2e}" for n in names) + "  (reference)")
    targets = _targets()
    variants = {
        "eager-nchw": dict(),
        "eager-nhwc": dict(channels_last=True),
        "inductor": dict(compile_with=torch.compile),
        **{name: dict(compile_with=lambda m, t=t: fxwrap.compile(m, target=t)) for name, t in targets.items()},
    }
    for tf32 in (True, False):
        for name, how in variants.items():
            torch._dynamo.reset()
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
                got = _grads(copy.deepcopy(model).cuda(), x.cuda(), weight.cuda(), **how)
            errs = {n: (got[n].double().cpu() - ref[n]).abs().max().item() for n in names}
            fails = []
            for n in names:  # the kit's check: the GPU's gradient against the CPU's float32 eager one
                if not torch.allclose(got[n].float().cpu(), cpu32[n], **GRADIENT_TOLERANCE):
                    fails.append(n)
            print(f"{name:<14} {str(tf32):<5} " + " ".join(f"{errs[n]:16.2e}" for n in names)
                  + f"  {'ok' if not fails else 'FAILS ' + ','.join(fails)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
