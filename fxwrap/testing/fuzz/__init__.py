"""fxwrap.testing.fuzz: seeded random programs checked against eager on any target.

    python -m fxwrap fuzz --target cpu --programs 200 --seed 0 --out fuzz-out

or from Python::

    from fxwrap.testing.fuzz import fuzz
    summary = fuzz("npu", programs=200, seed=0, out="fuzz-out")
    print(summary.report()); assert summary.ok

``generate(seed)`` is the source of program ``seed`` (the same bytes for the same seed),
``check(load(source), target)`` compares one program with eager (forward, gradients,
mutated inputs and buffers), ``check_bad_inputs`` feeds a lowered and a saved-and-loaded
program wrong inputs, and every failure becomes a standalone reproducer file
(``write_reproducer``) that imports torch and fxwrap only.
"""
from fxwrap.testing.fuzz.bad_inputs import check_bad_inputs
from fxwrap.testing.fuzz.generator import generate, load
from fxwrap.testing.fuzz.harness import check
from fxwrap.testing.fuzz.reproducer import reproducer_source, write_reproducer
from fxwrap.testing.fuzz.runner import Failure, Summary, fuzz

__all__ = ["Failure", "Summary", "check", "check_bad_inputs", "fuzz", "generate", "load", "reproducer_source",
           "write_reproducer"]
