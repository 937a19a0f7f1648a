"""Issue 27: why fxwrap's SwiGLU kernel (``silu(gate) * up``) was timed at 22 us a layer inside HF
Llama (8 layers, 1024 wide, intermediate 2816, 4 x 512 tokens, bf16) against Inductor's 11.7 us,
while the same kernel alone issues 16-byte vector loads.

What the CPU side found (``--offline``, no GPU needed): the in-model kernel is the standalone
kernel.  Rendered with the GPU planner (an emitter that neither interprets nor autotunes), all
eight layers' SwiGLU kernels have the standalone kernel's body: 1-D plan, ``XBLOCK=1024,
num_warps=4``, int32 indices, inputs ``[4, 512, 2816]`` contiguous at storage offset 0, the flat
index ``1441792*x0 + 2816*x1 + x2``, bf16 loads and stores (fp32 only in registers), no fused
cast or down projection, one mask that is constant over every vector (5767168 = 11 * 2**19).
Compiled offline for sm_90 it issues ``ld.global.v4.b32`` / ``st.global.v4.b32``.  The only
differences are at run time: in the model the output is written in place over the gate
projection's buffer (the memory plan's reuse of a dying input), the inputs were just written by
two cuBLAS GEMMs (L2 state), and the kernels of the eight layers share one launcher (same
body, compiled from whichever loaded first, so one kernel row of that name counts all eight).
The profiler also gives every fxwrap launch more rows than the kernel's: the CPU
``record_function`` range of ``Kernel.__call__``, whose "self device time" is the kernel it
launched, and possibly a device-side user annotation of the same name; summing
``key_averages()`` rows (or rows by name) can count fxwrap's kernels twice and Inductor's once
(docs/debugging.md).

On the GPU this script separates those causes, each timed by torch.profiler's kernel events only
(``DeviceType.CUDA``, never CPU rows)::

    PYTHONPATH=. python benchmarks/swiglu_in_model.py                # all parts, H100: ~2-3 min
    PYTHONPATH=. python benchmarks/swiglu_in_model.py --parts alone  # kernels alone: ~30 s
    PYTHONPATH=. python benchmarks/swiglu_in_model.py --offline      # CPU: sources and plans

Parts:

* ``alone``: ``silu(a) * b`` at ``[4, 512, 2816]`` bf16 -- fxwrap (fresh output), fxwrap's same
  launcher writing in place over ``a`` (as in the model), over buffers rotated so nothing is in
  L2, and Inductor; then the MLP block alone (``x -> silu(x @ Wg.T) * (x @ Wu.T)``, the GEMMs
  before it as in the model) under both compilers.
* ``model``: the HF Llama inference workload of ``benchmarks/capture.py`` under Inductor, fxwrap
  and fxwrap with ``reuse=False`` (no in-place output): per launch of each SwiGLU kernel, the
  kernel time; the data pointers (mod 16 and 4096) and the launcher fxwrap used; layer 0's
  kernel relaunched alone on the model's own buffers; both compilers' kernel time per step
  counted once, and the last session's row sums beside it.

Reading the result: fxwrap's SwiGLU by device events near Inductor's (~11-12 us on an H100)
while the row sums give ~22 us: the 22 us was the profile's accounting.  Near 22 us by device
events: compare ``reuse=False`` (in-place output), the relaunch on the model's buffers (their
addresses) and the ``alone`` variants (in place, cold L2).
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fxwrap  # noqa: E402
from fxwrap.targets.cuda_triton.emitter import clear_caches  # noqa: E402

SHAPE = (4, 512, 2816)
STEPS = 5


def swiglu(x, y):
    return F.silu(x) * y


# ------------------------------------------------------------------------------------ timing
def kernel_times(fn, steps: int = STEPS, warmup: int = 3) -> dict[str, list[float]]:
    """``{kernel name: [us of each launch]}`` over ``steps`` calls of ``fn``: the profiler's
    kernel events only (a CPU op's "self device time" is the kernel it launched, counted again,
    and a ``record_function`` range can come back as a device-side user annotation: both are
    left out)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.autograd import DeviceType

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and not e.is_user_annotation:
            out[e.name].append(e.time_range.elapsed_us())
    return dict(out)


def lead_rows(fn, names, steps: int = STEPS) -> None:
    """The last session's accounting (``gpu_runs/llama_prof.py``): CUDA activity only, every
    ``key_averages()`` row summed.  Prints the rows whose key is one of ``names`` with their
    device type and user-annotation flag (a ``record_function`` range, fxwrap's name for each
    launch, can come back as a device row of the kernel's time), and the two sums."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    every = sum(e.self_device_time_total for e in ka) / steps
    kernels_only = sum(e.self_device_time_total for e in ka if not e.is_user_annotation) / steps
    print(f"  llama_prof-style: sum of every row {every / 1000:.3f} ms/step, without user annotations "
          f"{kernels_only / 1000:.3f} ms/step, rows/step {sum(e.count for e in ka) // steps}")
    for e in ka:
        if e.key in names:
            print(f"    row {e.key[:50]:50s} device {str(e.device_type):18s} annotation {e.is_user_annotation!s:5s} "
                  f"x{e.count / steps:4.1f}/step  self {e.self_device_time_total / steps:8.2f} us/step")


def per_step(times: dict[str, list[float]], steps: int = STEPS) -> float:
    return sum(sum(v) for v in times.values()) / steps


def summary(times: dict[str, list[float]], pick, steps: int = STEPS) -> str:
    rows = []
    for name, us in sorted(times.items()):
        if pick(name):
            rows.append(f"    {name[:70]:70s} x{len(us) // steps:3d}/step  mean {statistics.mean(us):7.2f} us  "
                        f"min {min(us):7.2f}  max {max(us):7.2f}")
    return "\n".join(rows) if rows else "    (no kernel matched)"


def is_inductor_swiglu(name: str) -> bool:
    return "silu" in name and "mul" in name


# ------------------------------------------------------------------------------------ fxwrap
def swiglu_kernels(programs) -> list:
    """The ``Kernel`` objects of ``programs`` that compute an MLP's ``act_fn`` (SwiGLU), or the
    probe's own ``silu(x) * y`` (provenance ``swiglu``)."""
    found = []
    for program in programs:
        for line in program.lines:
            kernel = getattr(line, "kernel", None)
            if kernel is None or type(line).__name__ != "DefineKernel":
                continue
            head = kernel.source.split("@triton.jit")[0]
            if "act_fn" in head or ("sigmoid" in head and "in swiglu" in head):
                found.append(kernel)
    return found


LAST_ARGS: dict = {}  # kernel name -> (launcher, the arguments of its last launch)


def record_pointers(kernels, log: list) -> None:
    """Wrap each kernel's launcher so that a call appends (kernel, launcher class, path, args'
    ``data_ptr() % 16``, ``% 4096``, and the pointer distances) to ``log``."""
    for kernel in kernels:
        launcher = kernel.launcher()

        def wrapped(*args, _k=kernel, _l=launcher):
            ptrs = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
            log.append((_k.name, type(_l).__name__, getattr(_l, "path", "?"),
                        sorted(getattr(_l, "unaligned", ()) or ()), [p % 16 for p in ptrs],
                        [p % 4096 for p in ptrs], [p - ptrs[0] for p in ptrs]))
            LAST_ARGS[_k.name] = (_l, args)
            return _l(*args)
        kernel.bind(wrapped)


def print_source(kernel) -> None:
    print(kernel.source)
    print("launch config", kernel.launch.config, "plan", kernel.launch.plan)
    try:  # the compiled code's loads and stores (the launcher's aligned variant)
        launcher = kernel.launcher()
        compiled = getattr(launcher, "compiled", None) or getattr(getattr(launcher, "root", None), "compiled", None)
        if compiled is not None:
            ptx = compiled.asm["ptx"]
            print("ptx:", sorted(set(re.findall(r"(ld\.global[.\w]*|st\.global[.\w]*)", ptx))),
                  "registers", getattr(compiled, "n_regs", "?"))
    except Exception as error:  # noqa: BLE001 - a diagnostic only
        print("no ptx:", type(error).__name__, error)


def inductor_kernels(fn, *args) -> list[str]:
    """Inductor's generated Triton kernels of one first call of ``fn`` that compute silu
    (``run_and_get_code`` resets dynamo: ``fn`` compiles now; no FX-graph cache hit)."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    with config.patch(fx_graph_cache=False):
        _, codes = run_and_get_code(fn, *args)
    out = []
    for code in codes:
        for m in re.finditer(r"@triton\.jit\s*\ndef (triton_\w+)\(.*?(?=\n'''|\n\"\"\"|\Z)", code, re.S):
            if "silu" in m.group(1):
                out.append(m.group(0)[:2500])
    return out


# ------------------------------------------------------------------------------------ parts
def part_alone() -> None:
    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    a = torch.randn(SHAPE, device=dev, dtype=dt)
    b = torch.randn(SHAPE, device=dev, dtype=dt)
    nbytes = 3 * a.numel() * a.element_size()
    print(f"\n== alone: silu(a) * b {SHAPE} bf16, {nbytes / 2**20:.1f} MiB moved a call")
    with torch.no_grad():
        clear_caches()  # a kernel's launcher (and its CUfunction's name) is shared by equal bodies
        program = fxwrap.lower(swiglu, a, b, target="cuda")
        kernels = [l.kernel for l in program.lines if type(l).__name__ == "DefineKernel"]
        (kernel,) = kernels
        print_source(kernel)
        launch = kernel.launcher()
        out = torch.empty_like(a)
        sets = [(torch.randn_like(a), torch.randn_like(b), torch.empty_like(a)) for _ in range(4)]
        ring = iter(range(1 << 30))

        def rotated():  # 4 x 34.6 MB: every call's buffers were evicted from the 50 MB L2
            x, y, o = sets[next(ring) % 4]
            launch(x, y, o)

        inplace = a.clone()
        variants = {
            "fxwrap program (fresh output)": lambda: program.run(a, b),
            "fxwrap launcher, out separate": lambda: launch(a, b, out),
            "fxwrap launcher, out = a (in place, as in the model)": lambda: launch(inplace, b, inplace),
            "fxwrap launcher, buffers rotated (cold L2)": rotated,
        }
        ind = torch.compile(swiglu)
        variants["inductor (fresh output)"] = lambda: ind(a, b)
        for name, fn in variants.items():
            t = kernel_times(fn, steps=20)
            us = per_step(t, 20)
            print(f"  {name:55s} {us:7.2f} us/call  {nbytes / us / 1e6:5.2f} TB/s   kernels {sorted(t)}")
        for src in inductor_kernels(torch.compile(swiglu), a, b):
            print("inductor kernel:\n" + src)

    print("\n== alone: the MLP block x -> silu(x @ Wg.T) * (x @ Wu.T) (GEMMs before it, in place as in the model)")
    x = torch.randn(4, 512, 1024, device=dev, dtype=dt)
    wg = torch.randn(2816, 1024, device=dev, dtype=dt) * 0.02
    wu = torch.randn(2816, 1024, device=dev, dtype=dt) * 0.02

    def block(x, wg, wu):
        return F.silu(x @ wg.t()) * (x @ wu.t())
    with torch.no_grad():
        for name, reuse in (("fxwrap", True), ("fxwrap reuse=False", False)):
            progs: list = []
            clear_caches()
            fn = torch.compile(block, backend=fxwrap.Backend(options={"on_program": progs.append, "reuse": reuse}))
            fn(x, wg, wu)
            t = kernel_times(lambda: fn(x, wg, wu))
            names = {line.kernel.name for p in progs for line in p.lines if type(line).__name__ == "DefineKernel"}
            print(f"  {name}: kernel time/step {per_step(t):.2f} us")
            print(summary(t, lambda n: n in names or "sigmoid" in n))
            for p in progs:
                print(p.code())
        torch._dynamo.reset()
        ind = torch.compile(block)
        t = kernel_times(lambda: ind(x, wg, wu))
        print(f"  inductor: kernel time/step {per_step(t):.2f} us")
        print(summary(t, lambda n: n.startswith("triton")))
        for src in inductor_kernels(torch.compile(block), x, wg, wu):
            print("inductor kernel:\n" + src)


def part_model() -> None:
    import capture

    args = argparse.Namespace(hf_hidden=1024, hf_layers=8, hf_batch=4, hf_seq=512)
    model, run, _ = capture.WORKLOADS["llama-infer"](args, "cuda", torch.bfloat16)
    results = {}
    for name in ("inductor", "fxwrap", "fxwrap reuse=False"):
        torch._dynamo.reset()
        progs: list = []
        if name == "inductor":
            fn = torch.compile(copy.deepcopy(model))
        else:
            clear_caches()  # this program's kernels name their launchers (shared by equal bodies)
            fn = torch.compile(copy.deepcopy(model), backend=fxwrap.Backend(
                options={"on_program": progs.append, "reuse": name == "fxwrap"}))
        first = [None]
        if name == "inductor":
            with torch.no_grad():
                sources = inductor_kernels(lambda: run(fn, 0))
            first[0] = sources[0] if sources else "(no silu kernel found in Inductor's code)"
        t = kernel_times(lambda: run(fn, 0), warmup=4)
        print(f"\n== model, {name}: kernel time/step {per_step(t) / 1000:.3f} ms (device events only), "
              f"launches/step {sum(len(v) for v in t.values()) // STEPS}")
        if name == "inductor":
            print(summary(t, is_inductor_swiglu))
            lead_rows(lambda: run(fn, 0), {n for n in t if is_inductor_swiglu(n)})
            print("inductor SwiGLU kernel:\n" + first[0])
            swi = [us for n, v in t.items() if is_inductor_swiglu(n) for us in v]
        else:
            kernels = swiglu_kernels(progs)
            names = {k.name for k in kernels}
            log: list = []
            record_pointers(kernels, log)
            run(fn, 0)
            torch.cuda.synchronize()
            for entry in log:
                print("    launch", entry)
            # the same launcher on the model's own buffers (same pointers, output over the gate
            # projection), launched back to back after the step: the addresses' share of the time
            launcher, saved = LAST_ARGS[kernels[0].name]
            again = kernel_times(lambda: launcher(*saved), steps=20)
            print(f"    layer-0 kernel relaunched alone on the model's buffers: {per_step(again, 20):.2f} us a launch")
            # the eight layers' kernels share one launcher (same body): its CUfunction's name is
            # the first kernel's; pick rows by the names of every SwiGLU kernel
            print(summary(t, lambda n: n in names))
            lead_rows(lambda: run(fn, 0), names)
            swi = [us for n, v in t.items() if n in names for us in v]
            if name == "fxwrap":
                print_source(kernels[0])
                for p in progs:
                    code = p.code()
                    i = code.find(kernels[0].name + "(")
                    print("    wrapper around it:\n" + code[max(0, code.rfind("\n", 0, max(0, i - 900))):i + 400])
        per_layer = sum(swi) / STEPS / args.hf_layers if swi else float("nan")
        results[name] = (per_step(t) / 1000, per_layer)
        print(f"  SwiGLU: {per_layer:.2f} us a layer (device events)")
        del fn
    print("\n== summary (kernel ms/step, SwiGLU us/layer):")
    for name, (ms, us) in results.items():
        print(f"  {name:22s} {ms:7.3f} ms   {us:6.2f} us")


# ------------------------------------------------------------------------------------ offline
def offline() -> None:
    """No GPU: the in-model and standalone SwiGLU kernels as the ``cuda`` target renders them
    (``fxwrap.testing`` offline target), side by side."""
    from fxwrap.testing.offline_cuda import offline_programs

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                         num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (4, 512))
    with torch.no_grad():
        (in_model,) = offline_programs(lambda i: model(input_ids=i, use_cache=False).logits, ids)
        a, b = torch.randn(SHAPE, dtype=torch.bfloat16), torch.randn(SHAPE, dtype=torch.bfloat16)
        (alone,) = offline_programs(swiglu, a, b)
    ks = swiglu_kernels([in_model]) + swiglu_kernels([alone])
    for k in ks:
        print(k.source, "\nconfig", k.launch.config, "plan", k.launch.plan, "\n")
    code = in_model.code()
    for k in ks[:-1]:
        i = code.find(k.name + "(")
        print(code[max(0, code.rfind("\n", 0, max(0, i - 700))):i + 300])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="alone,model")
    parser.add_argument("--offline", action="store_true", help="no GPU: print the kernels as cuda renders them")
    opts = parser.parse_args()
    if opts.offline:
        offline()
        return
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA device (or --offline)")
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    for part in opts.parts.split(","):
        {"alone": part_alone, "model": part_model}[part]()


if __name__ == "__main__":
    main()
