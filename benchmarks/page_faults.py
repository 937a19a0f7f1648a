"""Minor page faults and thread CPU time per call of a suite model: eager, fxwrap, Inductor.

    OMP_NUM_THREADS=1 python benchmarks/page_faults.py --model resnet18
    OMP_NUM_THREADS=1 python benchmarks/page_faults.py --model resnet18 --inductor
    OMP_NUM_THREADS=1 python benchmarks/page_faults.py --model resnet18 --inductor \
        --options "{'arena': False}" --options "{}"         # fxwrap without and with its arena
    MALLOC_MMAP_THRESHOLD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456 \\
        OMP_NUM_THREADS=1 python benchmarks/page_faults.py --model resnet18

At one thread every kernel and ATen call runs on the calling thread, so its CPU time
(``time.thread_time``) is the work done, whatever the load of the machine; a page the
kernel faults in (and zeroes) is counted in it.  Measured (2026-11-27, torch 2.13 CPU,
torchvision ResNet-18, one 224x224 image, fp32, a 2-core machine under a load of 10-14):

    eager     0 faults a call   60.8 ms
    Inductor  0 faults a call   56-60 ms
    fxwrap    4,576 faults      73.7 ms
    fxwrap    0 faults          62.9 ms   with glibc's mmap / trim thresholds raised (above)

fxwrap's faults are in the channels-last relayout of the layer-4 weights (9.4 MB each, three
of them relaid by one kernel before the first of their convolutions) and in oneDNN's weight
reorder inside those convolutions: the storage freed between calls goes back to the system
(glibc trims the heap's top once more than twice the mmap threshold is free there) and
the next call faults it in again.  The allocation order of the program decides it, not the
kernels: most of fxwrap's gap to Inductor on ResNet-18 at one thread.

After the CPU runner's arena (``fxwrap/runtime/arena.py``: temporaries in one storage kept
across calls), the last command, ms of thread time a call (faults a call), one process per
model, 8 calls each, load 11-14 (2026-11-27):

    model               eager          fxwrap arena=False   fxwrap (arena)   Inductor
    resnet18            55.70 (0)      80.88 (10,193)       58.65 (0)        68.44 (5,336)
    resnet50            136.50 (0)     134.52 (0)           134.56 (0)       147.13 (8,012)
    mobilenet_v3_large  26.41 (2,263)  15.17 (12)           15.39 (0)        14.92 (0)
    efficientnet_b0     40.29 (2,804)  28.32 (1)            28.90 (1)        24.62 (0)
    regnet_y_400mf      34.10 (1,732)  20.12 (1)            21.94 (1)        19.33 (1,252)

Which program faults depends on the heap the process has by then (the order of the runs):
Inductor faults here after fxwrap's runs, and not when it runs alone (first table).
"""
from __future__ import annotations

import argparse
import copy
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite_models  # noqa: E402


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--inductor", action="store_true", help="also Inductor (a long compile)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--options", action="append", default=None,
                        help="fxwrap options, a Python dict literal; repeat it to compare (each a run)")
    args = parser.parse_args(argv)
    entry = next(m for m in suite_models.MODELS if m.name == args.model)
    why = suite_models.missing(entry)
    if why:
        print(f"{args.model}: skipped: {why}")
        return 0
    torch.manual_seed(0)
    model, make_inputs, _ = entry.build("cpu", "small")
    model.eval()
    inputs = make_inputs(1)
    runs = {"eager": model}
    for literal in args.options or ["{}"]:
        options = {"cache": False, **eval(literal, {})}  # noqa: S307 - a command-line literal
        name = "fxwrap" if literal == "{}" else f"fxwrap {literal}"
        runs[name] = torch.compile(copy.deepcopy(model), backend="fxwrap", options=options)
    if args.inductor:
        runs["inductor"] = torch.compile(copy.deepcopy(model))
    print(f"# {args.model}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}, "
          f"torch {torch.__version__}")
    with torch.no_grad():
        for name, run in runs.items():
            run(*inputs)
            run(*inputs)
            faults, start = _faults(), time.thread_time()
            for _ in range(args.reps):
                run(*inputs)
            ms = (time.thread_time() - start) / args.reps * 1e3
            print(f"{name:<9} {(_faults() - faults) / args.reps:9.0f} minor faults a call  {ms:8.2f} ms thread time",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
