"""What a CPU conv net's per-call weight relayout costs: the channels-last layout pass gives
every convolution an NHWC weight, which a kernel copies from the NCHW parameter on every
call (``fxwrap_pointwise_N(arg0, buf1)  # clone_default``).  Three ways to run the same net
(fp32 inference, ``cpu`` target), interleaved, in one process:

* ``relayout``: the parameters as the model holds them (NCHW): the relayout kernels run;
* ``prelaid``: the model converted once with ``model.to(memory_format=torch.channels_last)``:
  no relayout kernel (what a cache keyed by the parameter's ``_version`` / ``data_ptr``, or
  an opt-in freezing, would give);
* ``cached``: the NCHW model with ``options={"cache_weight_layouts": True}``: each weight
  relaid once per version of it (``fxwrap.runtime.weight_layouts``);
* ``inductor``: ``torch.compile`` default on the same NCHW model.

    python benchmarks/weight_relayout.py --out relayout.log
    python benchmarks/weight_relayout.py --threads 16 --batch 1 --image 224

It prints milliseconds per call (the median of rounds), the relayout's share of a call
(``relayout`` against ``prelaid``), and the relayout kernels counted in each program.
Measured here (2 shared cores, load 18, 1 thread, batch 1, 64x64): relayout 121 ms,
prelaid 36 ms, Inductor 58 ms a call.  Passing the NCHW parameter to oneDNN instead (no
kernel of ours) cost the same 123 ms: ATen then copies the weight to channels-last inside
the call.  A cache keyed by ``_version`` and ``data_ptr`` does not see writes through
``param.data`` (a detached tensor with a version counter of its own), so it is an opt-in
(``cache_weight_layouts``), as Inductor's ``freezing`` is.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import torch
from torch import nn

import fxwrap


def resnet_like(width: int = 64) -> nn.Module:
    """A ResNet-18-shaped stack: stem, four stages of two 3x3 conv + BN + ReLU blocks."""
    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    c = width
    for stage in range(4):
        out = width * 2 ** stage
        for block in range(2):
            stride = 2 if block == 0 and stage > 0 else 1
            layers += [nn.Conv2d(c, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU(),
                       nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
            c = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000)).eval()


def _relayouts(program) -> int:
    return sum(1 for line in program.lines if type(line).__name__ == "CallKernel"
               and line.origins and all(o.node.startswith("clone_default") for o in line.origins))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = resnet_like()
    prelaid = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, args.image, args.image)
    runs, counts = {}, {}
    with torch.no_grad():
        for name, m, opts in (("relayout", model, {}), ("prelaid", prelaid, {}),
                              ("cached", model, {"cache_weight_layouts": True})):
            program = fxwrap.lower(m, x, options={"cache": False, **opts})
            torch.testing.assert_close(program.run(x), model(x), rtol=1e-3, atol=1e-3)
            runs[name], counts[name] = (lambda p=program: p.run(x)), _relayouts(program)
        inductor = torch.compile(copy.deepcopy(model))
        inductor(x)
        runs["inductor"] = lambda: inductor(x)
        samples = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                run()
                start = time.perf_counter()
                for _ in range(args.reps):
                    run()
                samples[name].append((time.perf_counter() - start) / args.reps * 1e3)
    ms = {name: statistics.median(v) for name, v in samples.items()}
    lines = [f"# cpu, {torch.get_num_threads()} threads, batch {args.batch} x {args.image}x{args.image}, "
             f"load {os.getloadavg()[0]:.1f}, torch {torch.__version__}"]
    lines += [f"{name:<9} {ms[name]:9.3f} ms/call" + (f"  relayout kernels {counts[name]}" if name in counts else "")
              for name in runs]
    lines.append(f"relayout share of a call: {100 * (ms['relayout'] - ms['prelaid']) / ms['relayout']:.1f}%; "
                 f"fxwrap/Inductor: relayout {ms['relayout'] / ms['inductor']:.3f}, "
                 f"prelaid {ms['prelaid'] / ms['inductor']:.3f}, cached {ms['cached'] / ms['inductor']:.3f}")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
