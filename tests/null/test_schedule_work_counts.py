"""Work of the compiler that must grow linearly with the program, counted (not timed): the
cold compile of a training graph (hundreds of kernels, long fused chains in the backward)
is where a quadratic step shows."""
from __future__ import annotations

import torch

from fxwrap.core import scheduler


def chain(x, y):
    """Sixty dependent pointwise steps, each also returned: one fused kernel of 60 stores."""
    outs = []
    for i in range(60):
        x = torch.sin(x) * y + i
        outs.append(x * 2)
    return outs


def test_fusing_a_long_chain_walks_each_expression_once(monkeypatch):
    """Each job that joins a group asks which buffers the group reads (``job_names``, the
    argument count); the answer for each of the group's values is remembered
    (``scheduler.loads_of``), so the loop-IR nodes walked grow with the chain, not with its
    square (403000 nodes walked without the memo, 12005 with it)."""
    walked = []
    real = scheduler.walk

    def counted(*roots, **kwargs):
        nodes = real(*roots, **kwargs)
        walked.append(len(nodes))
        return nodes
    monkeypatch.setattr(scheduler, "walk", counted)
    programs = []
    x, y = torch.randn(64), torch.randn(64)
    compiled = torch.compile(chain, backend="fxwrap",
                             options={"target": "reference", "cache": False, "on_program": programs.append})
    got = compiled(x, y)
    for g, w in zip(got, chain(x, y)):
        torch.testing.assert_close(g, w)
    (program,) = programs
    assert sum(type(line).__name__ == "CallKernel" for line in program.lines) == 1
    assert sum(walked) < 40000, sum(walked)

