"""Graph-capture partitions, decided from the Wrapper IR's lines.

``partition_for_capture(device_type)`` is a Wrapper IR pass (declared by the built-in
plugin ``fxwrap.plugins.graph_capture`` when the options ask for graph capture and the
target's device declares it).  Each line says whether a recorded replay of it would compute
what running it computes (``Line.capture_refusal``); lines that launch nothing and read no
value (``Line.capture_neutral``: views, frees, comments) go with the lines around them, a
comment with the line it annotates.  Runs of lines of the same decision are partitions, each
opened by a ``PartitionBoundary`` line (``fxwrap.ir.partitions``)::

    buf0 = empty_strided(...)                 partition(0, capture=True)
    fxwrap_reduction_0(arg0, buf0)            buf0 = empty_strided(...)
    u0 = aten._local_scalar_dense(buf0)  ->   fxwrap_reduction_0(arg0, buf0)
    buf1 = empty_strided(...)                 partition(1, capture=False)  # ... reads a value back
    fxwrap_pointwise_1(arg1, buf1, u0)        u0 = aten._local_scalar_dense.default(buf0)
    return (buf1,)                            partition(2, capture=True)
                                              ...

A capturable run that writes nothing (only allocations and views) is not worth a recording:
it runs plainly with the partition it borders.  The decisions are logged to
``fxwrap.capture``.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from fxwrap.ir.lines import Line
from fxwrap.ir.partitions import PartitionBoundary

log = logging.getLogger("fxwrap.capture")

_NEUTRAL = object()
#: the reason of a run of lines that computes nothing
NOTHING_TO_RECORD = "nothing to record (allocations and views only)"


def _decisions(lines: Sequence[Line], device_type: str) -> list:
    """Per line: None (capturable), a reason (plain) or ``_NEUTRAL``, then neutral lines
    resolved: a comment takes the next line's decision, any other the previous one's."""
    raw = [_NEUTRAL if line.capture_neutral else line.capture_refusal(device_type) for line in lines]
    for i in range(len(lines) - 1, -1, -1):  # comments take the line they annotate's decision
        if lines[i].annotates_next and i + 1 < len(lines):
            raw[i] = raw[i + 1]
    first = next((d for d in raw if d is not _NEUTRAL), None)
    previous = first
    for i, d in enumerate(raw):
        if d is _NEUTRAL:
            raw[i] = previous
        else:
            previous = d
    return raw


def _runs(lines: Sequence[Line], decisions: list) -> list[list]:
    """``[capture, reason, [lines]]`` runs of lines of the same decision, a capturable run that
    writes nothing merged into a plain neighbour."""
    runs: list[list] = []
    for line, decision in zip(lines, decisions):
        capture = decision is None
        if runs and runs[-1][0] == capture:
            runs[-1][2].append(line)
        else:
            runs.append([capture, decision or "", [line]])
    if len(runs) > 1:
        for run in runs:
            if run[0] and not any(line.writes() for line in run[2]):
                run[0], run[1] = False, NOTHING_TO_RECORD
    merged: list[list] = []
    for run in runs:
        if merged and merged[-1][0] == run[0]:
            merged[-1][2].extend(run[2])
            if merged[-1][1] == NOTHING_TO_RECORD:
                merged[-1][1] = run[1]
        else:
            merged.append(run)
    return merged


def partition_for_capture(device_type: str, label: str = "program"):
    """The pass: ``lines -> lines`` with a ``PartitionBoundary`` opening each partition."""

    def partition_pass(lines: Sequence[Line]) -> list[Line]:
        lines = list(lines)
        out: list[Line] = []
        for index, (capture, reason, run) in enumerate(_runs(lines, _decisions(lines, device_type))):
            log.info("%s partition %d (%d lines): %s", label, index, len(run),
                     "recorded and replayed" if capture else f"runs plainly: {reason}")
            out.append(PartitionBoundary(index, capture, "" if capture else reason))
            out.extend(run)
        return out

    partition_pass.__name__ = "partition_for_capture"
    return partition_pass
