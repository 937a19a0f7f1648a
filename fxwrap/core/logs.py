"""Logging by compiler stage: one ``logging`` logger per stage, ``fxwrap.<stage>``.

``FXWRAP_LOG=schedule,memory`` (or ``all``) prints what those stages log, to stderr,
at every compile::

    $ FXWRAP_LOG=schedule python model.py
    [fxwrap.schedule] fxwrap_pointwise_1 <- relu, mul (model.py:12 in forward, fc)
    [fxwrap.schedule]   started: not fused into the kernel of exp: other loop ranges ((4, 4) vs (4, 8))

The stages, in the order a graph meets them, are ``STAGES``.  An unknown name is an
error that lists them (raised at the first compile: ``import fxwrap`` reads nothing).
Without ``FXWRAP_LOG`` the loggers are ordinary ``logging`` loggers: a program may
configure them itself (``logging.getLogger("fxwrap.kernels").setLevel(logging.DEBUG)``),
and a stage builds its text only when its logger is enabled (``enabled(stage)``), so
logging costs nothing when it is off.

A module of its own at the bottom of the compiler (above ``fxwrap.runtime`` only):
every compiler layer may import it; it imports nothing of fxwrap.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager

#: stage -> what its logger says
STAGES: dict[str, str] = {
    "capture": "the ATen graphs AOTAutograd hands to fxwrap (inference, forward, backward)",
    "lowering": "the loop IR of every kernel (after numerics legalization)",
    "schedule": "which ATen nodes fused into which kernel, and why a fusion was refused",
    "memory": "the memory plan: frees, reused storage, the peak",
    "wrapper": "the Wrapper IR of every program (Program.code())",
    "fx": "the FX code of every program's GraphModule, with provenance comments",
    "kernels": "every kernel's source",
    "autotune": "autotuning: the configs tried and their times",
    "cache": "program and kernel cache hits and misses (in process and on disk)",
    "timing": "how long each compile phase took",
}

ENV = "FXWRAP_LOG"
_HANDLER_TAG = "_fxwrap_stage_handler"
_configured: str | None = None


class UnknownLogStage(ValueError):
    """``FXWRAP_LOG`` names a stage fxwrap does not have."""


def logger(stage: str) -> logging.Logger:
    """The logger of ``stage`` (one of ``STAGES``): ``logging.getLogger("fxwrap.<stage>")``."""
    if stage not in STAGES:
        raise UnknownLogStage(f"fxwrap has no log stage {stage!r}; stages: {', '.join(STAGES)}")
    return logging.getLogger(f"fxwrap.{stage}")


def enabled(stage: str) -> bool:
    """Whether ``stage``'s logger would print a DEBUG record (build the text only then)."""
    return logging.getLogger(f"fxwrap.{stage}").isEnabledFor(logging.DEBUG)


def requested_stages(value: str | None = None) -> tuple[str, ...]:
    """The stages ``FXWRAP_LOG`` (or ``value``) names, in ``STAGES`` order; ``all`` is
    every stage.  Raises ``UnknownLogStage`` naming the unknown keys and the valid ones."""
    value = os.environ.get(ENV, "") if value is None else value
    keys = [k.strip() for k in value.split(",") if k.strip()]
    unknown = [k for k in keys if k != "all" and k not in STAGES]
    if unknown:
        raise UnknownLogStage(
            f"{ENV}={value!r}: unknown stage(s) {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(STAGES)}, or all (e.g. {ENV}=schedule,kernels)")
    if "all" in keys:
        return tuple(STAGES)
    return tuple(s for s in STAGES if s in keys)


def configure() -> tuple[str, ...]:
    """Read ``FXWRAP_LOG`` (again whenever it changed) and send each stage it names to
    stderr at DEBUG level.  Called at the start of every compile."""
    global _configured
    value = os.environ.get(ENV, "")
    if value == _configured:
        return requested_stages(value)
    stages = requested_stages(value)
    for stage in STAGES:
        log = logging.getLogger(f"fxwrap.{stage}")
        handler = next((h for h in log.handlers if getattr(h, _HANDLER_TAG, False)), None)
        if stage in stages and handler is None:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(f"[fxwrap.{stage}] %(message)s"))
            setattr(handler, _HANDLER_TAG, True)
            log.addHandler(handler)
            log.setLevel(logging.DEBUG)
            log.propagate = False
        elif stage not in stages and handler is not None:  # turned off since the last compile
            log.removeHandler(handler)
            log.setLevel(logging.NOTSET)
            log.propagate = True
    _configured = value
    return stages


class PhaseTimer:
    """Wall time of each compile phase of one program, reported to the ``timing`` logger
    (and kept, for the debug dump)::

        timer = PhaseTimer("forward")
        with timer.phase("build"):
            ...
        timer.phases   # {"build": 0.0123, ...} seconds
    """

    def __init__(self, program: str):
        self.program = program
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.phases[name] = self.phases.get(name, 0.0) + seconds
            if enabled("timing"):
                logger("timing").debug("%s: %s %.1f ms", self.program, name, seconds * 1e3)

    def summary(self) -> str:
        total = sum(self.phases.values())
        parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.phases.items())
        return f"{self.program}: {total * 1e3:.1f} ms ({parts})"
