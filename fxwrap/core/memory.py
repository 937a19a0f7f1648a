"""Liveness, frees and storage reuse over a list of Wrapper IR lines.

Input (after ``wrapper_ir.build``)::

    buf0 = empty_strided((1024,), (1,), ...)
    aten.exp.out(arg0, out=buf0)
    buf1 = empty_strided((1024,), (1,), ...)
    aten.sin.out(buf0, out=buf1)
    buf2 = empty_strided((1024,), (1,), ...)
    aten.cos.out(buf1, out=buf2)
    return (buf2,)

``plan_memory`` output::

    buf0 = empty_strided((1024,), (1,), ...)
    aten.exp.out(arg0, out=buf0)
    buf1 = empty_strided((1024,), (1,), ...)
    aten.sin.out(buf0, out=buf1)
    buf2 = buf0  # reuse
    aten.cos.out(buf1, out=buf2)
    free(buf1)
    return (buf2,)

Rules: a buffer is freed right after the last line that touches it or any view of
it; a dead buffer's storage is handed to a new allocation of the same device and
dtype that fits in it, and only when keeping the old storage alive until then does
not raise the peak of the frees-only plan.  Storages a functional extern reads are
never reused (the op might return an alias of them); inputs, constants and
anything reachable from the outputs are never freed.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy
import torch

from fxwrap.core.symbolic import evaluate
from fxwrap.wrapper_ir.lines import (
    Allocate, Buffer, CallExtern, Free, Line, Return, Reuse, View,
    buffers_defined, buffers_in, buffers_read,
)


@dataclass
class MemoryPlan:
    """Planned lines and the peak bytes of live storages they imply (at the size hints).

    ``peak_bytes`` is the plan with frees and reuse; ``peak_bytes_frees_only`` without
    reuse; ``peak_bytes_unplanned`` with every storage kept to the end.
    """

    lines: list[Line] = field(repr=False)
    peak_bytes: int
    peak_bytes_frees_only: int
    peak_bytes_unplanned: int
    reused: int


@dataclass
class _Storage:
    root: Buffer
    defined_at: int
    last_use: int
    nbytes: int
    reusable: bool
    freeable: bool = True


def _storages(lines: list[Line], hints) -> tuple[dict[str, _Storage], dict[str, str]]:
    """Owned storages by root name, and every buffer name -> its root name."""
    root_of: dict[str, str] = {}
    owned: dict[str, _Storage] = {}
    for i, line in enumerate(lines):
        if isinstance(line, View):
            root_of[line.buf.name] = root_of.get(line.base.name, line.base.name)
            continue
        for buf in buffers_defined(line):
            root_of[buf.name] = buf.name
            reusable = isinstance(line, (Allocate, Reuse))
            owned[buf.name] = _Storage(buf, i, i, evaluate(buf.storage_bytes, hints), reusable)
        for buf in buffers_read(line):
            root = root_of.get(buf.name, buf.name)
            if root in owned:
                owned[root].last_use = i
                if isinstance(line, CallExtern) and line.out is not None:
                    owned[root].reusable = False
                if isinstance(line, Return):
                    owned[root].freeable = False
        for buf in buffers_defined(line):  # a view defined here keeps its root alive
            root = root_of.get(buf.name, buf.name)
            if root in owned:
                owned[root].last_use = max(owned[root].last_use, i)
    return owned, root_of


def _live_profile(n: int, storages: list[_Storage], keep_all: bool) -> list[int]:
    live = [0] * n
    for s in storages:
        end = n - 1 if (keep_all or not s.freeable) else s.last_use
        for i in range(s.defined_at, end + 1):
            live[i] += s.nbytes
    return live


def plan_memory(lines: list[Line], hints: Mapping[sympy.Symbol, int] | None = None,
                reuse: bool = True) -> MemoryPlan:
    """Add ``Free`` lines and, where it never raises the peak, ``Reuse`` lines."""
    hints = dict(hints or {})
    owned, _ = _storages(lines, hints)
    storages = sorted(owned.values(), key=lambda s: s.defined_at)
    n = len(lines)
    unplanned = max(_live_profile(n, storages, keep_all=True), default=0)
    live = _live_profile(n, storages, keep_all=False)
    peak = max(live, default=0)

    # Greedy reuse in program order: storage `old` (dead) is handed to `new`.
    replaced: dict[int, Line] = {}
    absorbed: set[str] = set()  # roots whose storage moved on: no Free of their own
    chain: dict[str, _Storage] = {}  # storage (by its first root) -> current holder
    dead: list[_Storage] = []
    by_def = {s.defined_at: s for s in storages if s.reusable and isinstance(lines[s.defined_at], Allocate)}
    for s in storages:
        chain[s.root.name] = s
    for j in range(n):
        new = by_def.get(j)
        if reuse and new is not None:
            donor = _in_place_donor(lines, j, new, owned, absorbed)
            if donor is not None:
                writer = donor.last_use
                for i in range(j, writer + 1):
                    live[i] -= new.nbytes
                # from here on the storage is the donor's (maybe larger, reused) one
                for i in range(writer + 1, (new.last_use if new.freeable else n - 1) + 1):
                    live[i] += donor.nbytes - new.nbytes
                new.nbytes = donor.nbytes
                replaced[j] = Reuse(donor.root, new.root)
                absorbed.add(donor.root.name)
                new = None
        if reuse and new is not None:
            best = None
            for old in dead:
                if old.last_use >= j or old.root.device != new.root.device or old.root.dtype != new.root.dtype:
                    continue
                if not _fits(old.root, new.root, old.nbytes, new.nbytes):
                    continue
                extra = old.nbytes - new.nbytes
                window = range(old.last_use + 1, j)
                lifetime = range(j, (new.last_use if new.freeable else n - 1) + 1)
                if any(live[i] + old.nbytes > peak for i in window):
                    continue
                if any(live[i] + extra > peak for i in lifetime):
                    continue
                key = (old.nbytes != new.nbytes, old.nbytes, -old.last_use)
                if best is None or key < best[0]:
                    best = (key, old)
            if best is not None:
                old = best[1]
                for i in range(old.last_use + 1, j):
                    live[i] += old.nbytes
                for i in range(j, (new.last_use if new.freeable else n - 1) + 1):
                    live[i] += old.nbytes - new.nbytes
                replaced[j] = Reuse(old.root, new.root)
                absorbed.add(old.root.name)
                dead.remove(old)
                new.nbytes = old.nbytes
        # storages whose last use is line j die after it
        for s in storages:
            if s.last_use == j and s.freeable and s.reusable and s.root.name not in absorbed:
                dead.append(s)

    out: list[Line] = []
    frees_after: dict[int, list[Buffer]] = {}
    for s in storages:
        if s.freeable and s.root.name not in absorbed:
            frees_after.setdefault(s.last_use, []).append(s.root)
    for i, line in enumerate(lines):
        out.append(replaced.get(i, line))
        for buf in frees_after.get(i, ()):
            out.append(Free(buf))
    return MemoryPlan(out, max(live, default=0), peak, unplanned, len(replaced))


def _in_place_donor(lines, j, new: _Storage, owned: dict[str, _Storage], absorbed: set[str]):
    """An input of the pointwise extern writing ``new`` that dies at that very call.

    Elementwise ops read each element before writing the same element, so when an
    input has exactly the output's layout and this is its last use, the output may
    take its storage (in place), saving one buffer at the call.
    """
    writer = next((i for i in range(j + 1, len(lines))
                   if new.root in buffers_read(lines[i])), None)
    if writer is None:
        return None
    line = lines[writer]
    if not (isinstance(line, CallExtern) and line.out is None
            and torch.Tag.pointwise in getattr(line.op, "tags", ())):
        return None
    outs = {b.name for b in buffers_in([v for _, v in line.kwargs])}
    if new.root.name not in outs:
        return None
    inputs = buffers_in(line.args) + [b for k, v in line.kwargs for b in buffers_in([v])
                                      if b.name not in outs]
    for buf in inputs:
        donor = owned.get(buf.name)
        if (donor is None or donor.root.name in absorbed or not donor.reusable
                or not donor.freeable or donor.last_use != writer):
            continue
        a, b = donor.root, new.root
        if (a.size, a.stride, a.offset, a.dtype, a.device) == (b.size, b.stride, b.offset, b.dtype, b.device):
            return donor
    return None


def _fits(old: Buffer, new: Buffer, old_bytes: int, new_bytes: int) -> bool:
    """Storage of ``old`` holds ``new`` for every size, not only at the hints."""
    if old.storage_bytes.free_symbols or new.storage_bytes.free_symbols:
        return sympy.simplify(old.storage_bytes - new.storage_bytes) == 0
    return old_bytes >= new_bytes
