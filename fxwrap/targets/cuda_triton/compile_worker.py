"""One Triton compile worker process: ``python -m fxwrap.targets.cuda_triton.compile_worker``.

It reads jobs from its standard input and answers each on its standard output, both as
length-prefixed pickles (``compile_workers.write_message``).  A job is a ``CompileUnit``: a
kernel module's text and one launch of it (symbol, config, pointer dtypes)::

    CompileUnit(text="import triton\\n...\\n@triton.jit\\ndef fxwrap_pointwise_0(in_ptr0, ...", symbol=
                "fxwrap_pointwise_0", launch=TritonLaunch(config=(("XBLOCK", 1024), ("num_warps", 4)), ...),
                pointer_dtypes=("torch.bfloat16", "torch.float32"))  ->  (True, "")

It first answers ``("ready", pid)`` (its imports done: no job waits on them).  The worker
imports the module as the compiling process would (``launcher.load_module``) and
compiles it for the launch's config (``launcher.compile_kernel``: ``JITFunction.warmup``), which
writes Triton's on-disk cache; the process that then binds the launcher finds the compiled
kernel there.  Interpreted launches are imported only (the interpreter compiles nothing).  The
answer is ``(ok, error text)``: a failure is reported, not raised, and the binding process
compiles that unit itself (and reports its error where it fails again).  Anything the
compiler prints goes to the standard error: the standard output carries the answers only.
"""
from __future__ import annotations

import os
import sys

import torch

from fxwrap.targets.cuda_triton.compile_workers import CompileUnit, read_message, write_message
from fxwrap.targets.cuda_triton.launcher import compile_kernel, load_module


def compile_unit(unit: CompileUnit) -> None:
    """Import ``unit``'s module and, for a compiled launch, compile it (Triton's disk cache),
    with the cache folders the submitting process had (``unit.environment``)."""
    for name, value in unit.environment:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    fn = getattr(load_module(unit.text, unit.symbol, bool(unit.launch.interpret)), unit.symbol)
    if unit.launch.interpret:
        return
    dtypes = [getattr(torch, d.replace("torch.", "")) for d in unit.pointer_dtypes]
    compile_kernel(fn, unit.launch, dtypes, len(unit.launch.size_symbols))


def serve(requests, answers) -> None:
    """Say it is ready (its imports done), then answer every job of ``requests`` (a binary
    stream) on ``answers`` until the end of the input."""
    write_message(answers, ("ready", os.getpid()))
    while True:
        unit = read_message(requests)
        if unit is None:
            return
        try:
            compile_unit(unit)
            answer = (True, "")
        except Exception as error:  # noqa: BLE001 - reported to the parent, which compiles it again
            answer = (False, f"{type(error).__name__}: {error}")
        write_message(answers, answer)


def main() -> int:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints of the compiler: not in the answers
    serve(sys.stdin.buffer, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
