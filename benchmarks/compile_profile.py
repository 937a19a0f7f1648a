"""Where one model's cold compile goes: fxwrap's phases, a cProfile of the compile, and Inductor.

    PYTHONPATH=. python benchmarks/compile_profile.py --model swin_t --target cpu
    PYTHONPATH=. python benchmarks/compile_profile.py --model swin_t --target triton-interpret --no-inductor
    PYTHONPATH=. python benchmarks/compile_profile.py --model swin_t --target cpu --cprofile 30
    python benchmarks/compile_profile.py --model swin_t --device cuda --target cuda   # the GPU's sizes
    PYTHONPATH=. python benchmarks/compile_profile.py --model llama --variant training-amp --target cuda-offline \
        --no-inductor --cprofile 40   # a training step's two graphs, the GPU's kernels rendered

Each compile runs in a fresh process with an empty cache directory and the whole-graph caches
off (fxwrap's program cache and warm-start cache, Inductor's FX graph and AOTAutograd caches),
one thread.  The model is the suite's small CPU one (``benchmarks/suite_models.py``); with
``--device cuda`` the suite's GPU size (Swin-T: 32 images), as ``benchmarks/models.py`` runs it.
``--variant``: ``inference-fp32`` (default), or a training step (forward and backward of the
loss, both graphs compiled): ``training-fp32``, ``training-amp`` (under ``torch.autocast`` to
bfloat16).  ``--target cuda-offline``: the kernels the ``cuda`` target renders (its plans, no
autotuning) on CPU tensors, never compiled; their launches zero the outputs, so a training step
goes on to its backward.

* ``fxwrap``: the first call of ``torch.compile(model, backend="fxwrap")``; its own time
  (``compile_aten_graph``) split into phases (``fxwrap.core.logs.PhaseTimer``), summed over
  the graphs.  With ``--compile-only`` (default for ``triton-interpret``, whose kernels would
  run in the Triton interpreter) the first graph is compiled and the model is not run.
* ``inductor``: the first call of ``torch.compile(model)`` (CPU C++ code), same caches off.
* CPU seconds of the first call: the process's (every thread) and its compilers' (ended
  child processes), which a loaded machine does not inflate as it does wall time.
* ``--cprofile N``: the N functions of largest cumulative time inside fxwrap's compile, in
  thread CPU time (a loaded machine's waits not counted; the phases are wall time).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("inference-fp32", "training-fp32", "training-amp")


class _Compiled(Exception):
    """Raised after the first graph compiled, in --compile-only runs."""


def _import_torchvision() -> None:
    """torchvision whose compiled ops do not load against this torch (a CPU build beside a
    CUDA wheel): its models still build without the ops' meta registrations."""
    import types
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision  # noqa: F401
    except ImportError:
        pass


def _step(model_name: str, device: str, compile_model, variant: str = "inference-fp32"):
    """One step of suite model ``model_name`` at ``device``'s size, compiled by ``compile_model``:
    an inference call, or for ``training-*`` variants forward and backward of the loss
    (``training-amp``: under ``torch.autocast`` to bfloat16, as ``benchmarks/models.py`` steps it)."""
    import torch
    import suite_models

    training, amp = variant.startswith("training"), variant == "training-amp"
    entry = next(m for m in suite_models.MODELS if m.name == model_name)
    torch.manual_seed(0)
    model, make_inputs, loss_fn = entry.build(device, "small" if device == "cpu" else "large")
    model = model.to(device).train(training)
    inputs = make_inputs(1)
    compiled = compile_model(model)

    def step():
        if training:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                loss = loss_fn(compiled(*inputs))
            loss.backward()
        else:
            with torch.no_grad():
                compiled(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
    return step


def _offline_backend(options: dict):
    """``cuda-offline``: kernels rendered as the ``cuda`` target renders them (the GPU's plans,
    no autotuning) on CPU tensors, never compiled by Triton; each launch zeroes its outputs
    (indices stay in bounds), so a training step reaches its backward's compile."""
    from fxwrap.api import Backend
    from fxwrap.targets.base import DirectCallWrapper, Target
    from fxwrap.targets.host.device import CpuDevice
    from fxwrap.testing.offline_cuda import OfflineTritonEmitter

    class SkippingEmitter(OfflineTritonEmitter):
        def load(self, source):
            n_in = sum(arg.role == "input" for arg in source.signature)
            n_out = len(source.signature) - n_in - sum(arg.role == "size" for arg in source.signature)

            def zero_outputs(*args):
                for out in args[n_in:n_in + n_out]:
                    out.zero_()
            return zero_outputs

    target = Target("cuda-offline", "cpu", CpuDevice(), SkippingEmitter, DirectCallWrapper,
                    options={"interpret": False, "autotune": False})
    return Backend(target, {k: v for k, v in options.items() if k != "target"})


def child(backend: str, model_name: str, target: str, compile_only: bool, cprofile: int,
          device: str = "cpu", variant: str = "inference-fp32") -> dict:
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    sys.path.insert(0, HERE)
    _import_torchvision()
    phases: dict[str, float] = {}
    own = {"s": 0.0, "cpu_s": 0.0, "graphs": 0, "lines": 0}
    profile = None
    if backend == "fxwrap":
        import cProfile

        import fxwrap.api as api
        from fxwrap.core import logs

        timers = []
        init = logs.PhaseTimer.__init__

        def recording_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            timers.append(self)
        logs.PhaseTimer.__init__ = recording_init
        compile_aten_graph = api.compile_aten_graph
        # thread CPU time: what the compile computes, not what it waits for on a loaded machine
        # (the kernel compiler's subprocesses are not counted)
        profile = cProfile.Profile(time.thread_time) if cprofile else None

        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            if profile is not None:
                profile.enable()
            try:
                program = compile_aten_graph(*args, **kwargs)
            finally:
                if profile is not None:
                    profile.disable()
                own["s"] += time.perf_counter() - start
                own["cpu_s"] += time.thread_time() - cpu
                own["graphs"] += 1
            own["lines"] += len(program.lines)
            if compile_only:
                raise _Compiled()
            return program
        api.compile_aten_graph = timed
        options = {"cache": False, "target": target}
        if target == "cuda-offline":
            compile_model = lambda model: torch.compile(model, backend=_offline_backend(options))  # noqa: E731
        else:
            compile_model = lambda model: torch.compile(model, backend="fxwrap", options=options)  # noqa: E731
    else:
        compile_model = torch.compile
    step = _step(model_name, device, compile_model, variant)
    start, used = time.perf_counter(), _cpu_seconds()
    try:
        step()
    except Exception as error:  # noqa: BLE001 - dynamo wraps the backend's exception
        if not compile_only or "_Compiled" not in repr(error) and not isinstance(error.__cause__, _Compiled):
            raise
    first = time.perf_counter() - start
    own_cpu, compilers_cpu = (after - before for after, before in zip(_cpu_seconds(), used))
    for timer in timers if backend == "fxwrap" else ():
        for name, seconds in timer.phases.items():
            phases[name] = phases.get(name, 0.0) + seconds
    top = []
    if profile is not None:
        import pstats

        stats = pstats.Stats(profile)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:cprofile]
        top = [{"function": f"{os.path.relpath(f, os.path.dirname(HERE)) if f.startswith('/') else f}:{line}"
                            f"({name})", "calls": nc, "tottime": tt, "cumtime": ct}
               for (f, line, name), (cc, nc, tt, ct, _) in rows]
    return {"first_s": first, "cpu_s": own_cpu, "compilers_cpu_s": compilers_cpu, "own_s": own["s"], "own_cpu_s": own["cpu_s"], "graphs": own["graphs"], "lines": own["lines"],
            "phases": phases, "top": top}


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of this process (all its threads) and of its ended child processes
    (the C++ compilers): unlike wall time, what a loaded machine's waits do not inflate."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def _spawn(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="fxwrap-compile-profile-") as cache_dir:
        env = dict(os.environ, FXWRAP_CACHE_DIR=os.path.join(cache_dir, "fxwrap"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(cache_dir, "inductor"), FXWRAP_PROGRAM_CACHE="0",
                   PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="swin_t")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the first graph, do not run (default for triton-interpret)")
    parser.add_argument("--cprofile", type=int, default=0, help="show the N functions of most cumulative time")
    parser.add_argument("--device", default="cpu", help="cpu: the suite's small size; cuda: its GPU size")
    parser.add_argument("--variant", default="inference-fp32", choices=VARIANTS,
                        help="training-*: forward and backward of the loss (both graphs compiled); "
                             "training-amp: under autocast to bfloat16")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        backend, model, target, compile_only, cprofile, device, variant = args.child
        print(json.dumps(child(backend, model, target, compile_only == "1", int(cprofile), device, variant)))
        return 0
    compile_only = args.compile_only or args.target == "triton-interpret"
    fx = _spawn(["fxwrap", args.model, args.target, "1" if compile_only else "0", str(args.cprofile), args.device,
                 args.variant])
    print(f"# {args.model} {args.variant} on {args.device}, target {args.target}, caches off"
          f"{', compile only (model not run)' if compile_only else ''}")
    print(f"fxwrap    first call {fx['first_s']:7.2f} s   own (compile_aten_graph) {fx['own_s']:6.2f} s   "
          f"(thread CPU {fx['own_cpu_s']:6.2f} s)   graphs {fx['graphs']}  wrapper lines {fx['lines']}")
    print(f"          CPU {fx['cpu_s']:6.2f} s in the process, {fx['compilers_cpu_s']:6.2f} s in compilers")
    for name, seconds in sorted(fx["phases"].items(), key=lambda kv: -kv[1]):
        print(f"    {name:<28} {seconds:7.3f} s")
    if not args.no_inductor:
        ind = _spawn(["inductor", args.model, args.target, "0", "0", args.device, args.variant])
        print(f"inductor  first call {ind['first_s']:7.2f} s")
        print(f"          CPU {ind['cpu_s']:6.2f} s in the process, {ind['compilers_cpu_s']:6.2f} s in compilers")
    if fx["top"]:
        print(f"{'cumtime':>8} {'tottime':>8} {'calls':>8}  function")
        for row in fx["top"]:
            print(f"{row['cumtime']:8.3f} {row['tottime']:8.3f} {row['calls']:8d}  {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
