"""Compile-time autotuning of a kernel's block sizes and warp counts (GPU only).

``choose(make_launcher, kernel, hints, configs, device, device_interface)`` builds random inputs from the kernel's
buffers at the size hints (floats ``randn``; integer and bool buffers zeros, so an
indirect load always reads index 0, in bounds), compiles every config, times each
with CUDA events and returns the fastest with the timings::

    ({"XBLOCK": 1024, "num_warps": 4}, {"XBLOCK=1024,num_warps=4": 0.0123, ...})

Under the interpreter there is nothing to time: the planner's one config is used.
"""
from __future__ import annotations


import torch

from fxwrap.core import logs
from fxwrap.ir.symbolic import evaluate, storage_elements



def config_key(cfg) -> str:
    return ",".join(f"{k}={v}" for k, v in cfg)


def _inputs(kernel, hints, device):
    args = []
    for buf in (*kernel.inputs, *kernel.outputs):
        n = evaluate(storage_elements(buf.size, buf.stride, buf.offset), hints)
        n = max(int(n), 1)
        if buf.dtype.is_floating_point:
            t = torch.randn(n, device=device, dtype=torch.float32).to(buf.dtype)
        else:
            t = torch.zeros(n, device=device, dtype=buf.dtype)
        args.append(t[int(evaluate(buf.offset, hints)):] if int(evaluate(buf.offset, hints)) else t)
    args += [int(hints[s]) for s in kernel.size_symbols]
    return args


def _time(launcher, args, device, device_interface, reps: int = 10) -> float:
    """Milliseconds per launch, between events on the stream the launches go to
    (``device_interface.current_stream(device)``), after the device finished earlier work."""
    for _ in range(2):
        launcher(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device_interface.synchronize(device)
    stream = device_interface.current_stream(device)
    start.record(stream)
    for _ in range(reps):
        launcher(*args)
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / reps


def choose(make_launcher, kernel, hints: dict, configs: list, device, device_interface):
    """The fastest of ``configs`` (tuples of ``(name, value)``) and every timing (ms), timed on
    ``device`` through the target's ``device_interface`` (synchronize, current_stream)."""
    missing = [s for s in kernel.size_symbols if s not in hints]
    if missing or len(configs) < 2:
        return configs[0], {}
    args = _inputs(kernel, hints, device)
    timings: dict[str, float] = {}
    best, best_t = configs[0], float("inf")
    for cfg in configs:
        try:
            launcher = make_launcher(cfg)
            t = _time(launcher, args, device, device_interface)
        except Exception as e:  # a config that does not fit (shared memory, registers)
            logs.logger("autotune").debug("%s config %s failed: %s", kernel.name, config_key(cfg), e)
            continue
        timings[config_key(cfg)] = round(t, 5)
        if t < best_t:
            best, best_t = cfg, t
    if logs.enabled("autotune"):
        logs.logger("autotune").debug("%s: chose %s of %s (ms)", kernel.name, config_key(best), timings)
    return best, timings
