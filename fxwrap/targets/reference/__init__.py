"""The ``reference`` target: executes scheduled kernels with eager torch ops.

A golden model for the loop IR, with no compiler: every ``ScheduledKernel`` is
evaluated over its whole iteration space at once (index grids from
``torch.arange``), reductions with torch's own reductions.  Slow, simple, and the
oracle a new emitter is checked against::

    torch.compile(fn, backend="fxwrap", options={"target": "reference"})
"""
