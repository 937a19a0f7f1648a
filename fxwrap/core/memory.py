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
it (``View`` lines, and results of externs whose schema says they alias an input,
such as ``split``'s pieces, are views).  First, a pointwise extern, or a kernel
whose emitter allows it (``Line.in_place_pairs``), writes its output into an input
that dies at that line (in place) when that input is read in the line only with the
output's exact layout.  Then a dead buffer's storage is handed to a new allocation
of the same device and dtype that fits in it, and only when keeping the old storage
alive until then does not raise the peak that in place left; a storage that leaves
the program (an output) takes only a dead storage of its own size (a small result
must not keep a large storage alive for its caller).
Storages a functional extern reads are never reused (the op might return an alias
of them); inputs, constants and anything reachable from the outputs are never freed.
"""
from __future__ import annotations

import functools

from collections.abc import Mapping
from dataclasses import dataclass, field

import sympy

from fxwrap.ir.symbolic import evaluate
from fxwrap.ir.lines import (
    Allocate, Buffer, Free, Line, Reuse,
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

    def end(self, n: int) -> int:
        """Last line index the storage is live at."""
        return self.last_use if self.freeable else n - 1


def _storages(lines: list[Line], hints) -> tuple[dict[str, _Storage], dict[str, str]]:
    """Owned storages by root name, and every buffer name -> its root name."""
    root_of: dict[str, str] = {}
    owned: dict[str, _Storage] = {}
    producers: dict[str, Line] = {}  # tuple / scalar result name -> the line making it

    def root(buf: Buffer) -> str:
        return root_of.get(buf.name, buf.name)

    def use(name: str, i: int) -> None:
        if name in owned:
            owned[name].last_use = max(owned[name].last_use, i)

    for i, line in enumerate(lines):
        base = line.alias_of(producers)
        for name in line.defines_values():
            producers[name] = line
        for buf in line.reads():
            use(root(buf), i)
            if root(buf) in owned:
                if line.may_return_alias:
                    owned[root(buf)].reusable = False
                if line.returns_reads:
                    owned[root(buf)].freeable = False
        for buf in line.defines():
            if base is not None:  # a view: no storage of its own, keeps its base alive
                root_of[buf.name] = root(base)
                use(root(base), i)
            else:
                root_of[buf.name] = buf.name
                owned[buf.name] = _Storage(buf, i, i, evaluate(buf.storage_bytes, hints), line.allocates)
    return owned, root_of


def _live_profile(n: int, storages: list[_Storage], keep_all: bool) -> list[int]:
    live = [0] * n
    for s in storages:
        for i in range(s.defined_at, (n - 1 if keep_all else s.end(n)) + 1):
            live[i] += s.nbytes
    return live


class _Planner:
    """Greedy in-place writes, then greedy reuse, in program order over the frees-only
    live profile.

    ``live[i]`` is the bytes live at line ``i`` under the decisions so far; a decision
    is taken only when every line it touches stays at or under ``peak``: the peak of
    the frees-only plan for in place, the (lower or equal) peak after in place for
    reuse, so neither raises the peak.
    """

    def __init__(self, lines: list[Line], owned: dict[str, _Storage], root_of: dict[str, str]):
        self.lines, self.owned, self.root_of = lines, owned, root_of
        self.n = len(lines)
        self.storages = sorted(owned.values(), key=lambda s: s.defined_at)
        self.live = _live_profile(self.n, self.storages, keep_all=False)
        self.peak = max(self.live, default=0)
        self.replaced: dict[int, Line] = {}
        self.absorbed: set[str] = set()  # roots whose storage moved on: no Free of their own
        self.written_over: dict[str, _Storage] = {}  # in-place donor's root -> the output taking it

    def fits_under_peak(self, span: range, extra: int) -> bool:
        return all(self.live[i] + extra <= self.peak for i in span)

    def hand_over(self, j: int, old: _Storage, new: _Storage, kept: range, grown: range) -> None:
        """``new`` (allocated at line ``j``) takes ``old``'s storage.

        ``old`` stays alive over ``kept`` (lines where it used to be dead), and the
        storage is ``old``'s size instead of ``new``'s over ``grown``.
        """
        for i in kept:
            self.live[i] += old.nbytes
        for i in grown:
            self.live[i] += old.nbytes - new.nbytes
        self.replaced[j] = Reuse(old.root, new.root)
        self.absorbed.add(old.root.name)
        new.nbytes = old.nbytes

    def run(self) -> None:
        """In place first, then reuse of dead storages under the peak that in place left.

        Writing in place only lowers the live bytes (the donor's storage was live at the
        line anyway), and it lowers the peak where a product and its epilogue's output
        were the largest pair (an MLP's hidden layer).  Reuse keeps a dead storage alive
        until a later allocation takes it: bounded by the frees-only peak, it could hold
        a storage across the very lines in place had just made the lowest peak, so the
        plan peaked one buffer above what it could (the conv net's fc1 product, 7 against
        6 activations).  So reuse is bounded by the peak after in place.
        """
        by_def = {s.defined_at: s for s in self.storages if isinstance(self.lines[s.defined_at], Allocate)}
        for j in range(self.n):
            if j in by_def:
                self.in_place(j, by_def[j])
        self.peak = max(self.live, default=0)
        # a new allocation may take a dead storage even when its own storage is never
        # handed on later (``reusable``: an extern that may return an alias reads it)
        dead: list[_Storage] = []
        for j in range(self.n):
            if j in by_def and j not in self.replaced:
                self.reuse_dead(j, by_def[j], dead)
            for s in self.storages:  # storages whose last use is line j die after it
                if s.last_use == j and s.freeable and s.reusable and s.root.name not in self.absorbed:
                    dead.append(s)

    def in_place(self, j: int, new: _Storage) -> bool:
        donor = _in_place_donor(self.lines, j, new, self.owned, self.root_of, self.absorbed)
        if donor is None:
            return False
        writer = donor.last_use
        # the donor's storage lives on until new's end instead of new's own storage
        if not self.fits_under_peak(range(writer + 1, new.end(self.n) + 1), donor.nbytes - new.nbytes):
            return False
        for i in range(j, writer + 1):  # until the call, the donor's storage is counted already
            self.live[i] -= new.nbytes
        self.hand_over(j, donor, new, range(0), range(writer + 1, new.end(self.n) + 1))
        self.written_over[donor.root.name] = new
        return True

    def chain(self, head: _Storage) -> list[_Storage]:
        """``head`` and the outputs written in place over its storage in turn: one storage
        of ``head``'s bytes (an output takes no larger donor than itself) from ``head``'s
        allocation to the last one's end."""
        out = [head]
        while out[-1].root.name in self.written_over:
            out.append(self.written_over[out[-1].root.name])
        return out

    def reuse_dead(self, j: int, new: _Storage, dead: list[_Storage]) -> None:
        holders = self.chain(new)
        end = holders[-1].end(self.n)
        returned = any(not s.freeable for s in holders)
        best = None
        for old in dead:
            if old.root.device != new.root.device or old.root.dtype != new.root.dtype:
                continue
            if not all(_fits(old.root, s.root, old.nbytes, s.nbytes) for s in holders):
                continue
            if returned and old.nbytes != new.nbytes:
                continue
            if not (self.fits_under_peak(range(old.last_use + 1, j), old.nbytes)
                    and self.fits_under_peak(range(j, end + 1), old.nbytes - new.nbytes)):
                continue
            key = (old.nbytes != new.nbytes, old.nbytes, -old.last_use)
            if best is None or key < best[0]:
                best = (key, old)
        if best is not None:
            dead.remove(best[1])
            old = best[1]
            self.hand_over(j, old, new, range(old.last_use + 1, j), range(j, end + 1))
            for s in holders[1:]:
                s.nbytes = old.nbytes

    def lines_with_frees(self) -> list[Line]:
        frees_after: dict[int, list[Buffer]] = {}
        for s in self.storages:
            if s.freeable and s.root.name not in self.absorbed:
                frees_after.setdefault(s.last_use, []).append(s.root)
        out: list[Line] = []
        for i, line in enumerate(self.lines):
            out.append(self.replaced.get(i, line))
            out.extend(Free(buf) for buf in frees_after.get(i, ()))
        return out


def drop_dead_views(lines: list[Line]) -> list[Line]:
    """The lines without the ``View`` lines whose view no later line reads (and without
    the provenance ``Comment`` right above each), repeated until none is left: a view
    costs a host call per program call, and an unread one computes nothing::

        buf1 = as_strided(arg5, (16, 1), (1, 1), arg5_offset)      # never read: dropped
        buf2 = as_strided(arg5, (16, 1, 1), (1, 1, 1), arg5_offset)
        fxwrap_pointwise_0(buf0, buf2, buf5)
    """
    lines = list(lines)
    while True:
        read_later: set[str] = set()
        dead: set[int] = set()
        for i in range(len(lines) - 1, -1, -1):
            line = lines[i]
            if line.view_base is not None and not {b.name for b in line.defines()} & read_later:
                dead.add(i)
                if i > 0 and lines[i - 1].annotates_next:
                    dead.add(i - 1)
                continue
            read_later.update(b.name for b in line.reads())
        if not dead:
            return lines
        lines = [line for i, line in enumerate(lines) if i not in dead]


def plan_memory(lines: list[Line], hints: Mapping[sympy.Symbol, int] | None = None,
                reuse: bool = True) -> MemoryPlan:
    """Drop unread views, then add ``Free`` lines and, where it never raises the peak,
    ``Reuse`` lines."""
    lines = drop_dead_views(lines)
    owned, root_of = _storages(lines, dict(hints or {}))
    planner = _Planner(lines, owned, root_of)
    frees_only = planner.peak
    unplanned = max(_live_profile(len(lines), planner.storages, keep_all=True), default=0)
    if reuse:
        planner.run()
    return MemoryPlan(planner.lines_with_frees(), max(planner.live, default=0), frees_only, unplanned,
                      len(planner.replaced))


def _in_place_donor(lines, j, new: _Storage, owned: dict[str, _Storage], root_of: dict[str, str],
                    absorbed: set[str]):
    """An input of the line writing ``new`` that dies at that very line and whose storage
    the line lets ``new`` take (``Line.in_place_pairs``: a pointwise extern's ``out=``,
    a kernel whose emitter allows it).

    Each element of such an input is read only before the same element of ``new`` is
    written, so when it has exactly ``new``'s layout, is read in the line through no
    other layout (no view of it with other strides or offset), and this is its last
    use, ``new`` may take its storage (in place), saving one buffer at the line.  The
    input may be a view of the storage (a matmul's result reshaped for its GELU) where
    it starts where ``new`` starts: a kernel pairs an input with an output only where
    it loads the input at exactly the offsets it stores the output at::

        aten.addmm.out(arg11, buf32, arg12, out=buf33)
        buf34 = empty_strided((2, 32, 256), (8192, 256, 1), ...)   # planned: buf34 = buf33
        fxwrap_pointwise_5(buf33, buf34)      # buf33 is (64, 256), (256, 1)
    """
    writer = next((i for i in range(j + 1, len(lines))
                   if new.root in lines[i].reads()), None)
    if writer is None:
        return None
    line = lines[writer]
    candidates = [i for i, o in line.in_place_pairs() if o.name == new.root.name]
    b = new.root
    layout = (b.size, b.stride, b.offset, b.dtype, b.device)
    paired = {(i.name, i.offset, i.dtype, i.device) for i in candidates if i.offset == b.offset}
    for buf in candidates:
        # the input, or (a kernel's paired input) the storage it views; an extern's input only
        # where it owns its storage.  A view whose storage a collective still has in flight at
        # ``new``'s allocation (a waited result) gives none: the reuse would precede the wait
        name = root_of.get(buf.name, buf.name) if line.in_place_by_offset else buf.name
        if name != buf.name and any(lines[k].waits_collective and
                                    any(root_of.get(r.name, r.name) == name for r in lines[k].reads())
                                    for k in range(j + 1, writer)):
            continue  # the storage is in flight until a wait after ``new``'s allocation
        donor = owned.get(name)
        if (donor is None or donor.root.name in absorbed or not donor.reusable
                or not donor.freeable or donor.last_use != writer
                or not _fits(donor.root, b, donor.nbytes, new.nbytes)
                or (not new.freeable and donor.nbytes != new.nbytes)):  # an output keeps no larger storage
            continue
        # every read of the donor's storage in the line: a paired input at the output's start
        # where the line proved it reads each offset it writes, else one of the output's layout
        reads = [r for r in line.reads() if root_of.get(r.name, r.name) == donor.root.name]
        if line.in_place_by_offset:
            safe = all((r.name, r.offset, r.dtype, r.device) in paired for r in reads)
        else:
            safe = all((r.size, r.stride, r.offset, r.dtype, r.device) == layout for r in reads)
        if safe:
            return donor
    return None


def _fits(old: Buffer, new: Buffer, old_bytes: int, new_bytes: int) -> bool:
    """Storage of ``old`` holds ``new`` for every size, not only at the hints."""
    if old.storage_bytes.free_symbols or new.storage_bytes.free_symbols:
        return _equal_for_every_size(old.storage_bytes, new.storage_bytes)
    return old_bytes >= new_bytes


#: sizes the symbols of two storage sizes are compared at before ``sympy.simplify`` is asked
_PROBES = ((2, 3, 5, 7, 11, 13), (17, 4, 9, 6, 19, 23))


@functools.lru_cache(maxsize=4096)
def _equal_for_every_size(a: sympy.Expr, b: sympy.Expr) -> bool:
    """``a == b`` for every value of their (positive integer) size symbols: ``sympy.simplify``'s
    answer, asked only when neither expansion proves it (``expand(a - b) == 0``) nor a probe
    disproves it (a difference at some sizes; simplify of a difference took seconds each)."""
    diff = a - b
    if diff == 0 or sympy.expand(diff) == 0:
        return True
    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    for values in _PROBES:
        point = {s: sympy.Integer(values[i % len(values)] + i // len(values)) for i, s in enumerate(symbols)}
        try:
            value = diff.xreplace(point)
        except ZeroDivisionError:  # a divisor of the sizes (FloorDiv(s0, s1 - 4)) is 0 at this probe
            continue
        if value.is_number and value != 0:
            return False
    return sympy.simplify(diff) == 0


@dataclass(frozen=True)
class Lifetime:
    """One storage of a planned program: the buffers that hold it in turn (``Reuse``
    hands it on), the line indices it is live over (inclusive) and its bytes (at the
    size hints); ``returned``: it leaves the program (live to the end)."""

    names: tuple[str, ...]
    start: int
    end: int
    nbytes: int
    returned: bool = False


def storage_lifetimes(lines: list[Line], hints: Mapping[sympy.Symbol, int] | None = None) -> list[Lifetime]:
    """The storages of planned ``lines`` (``MemoryPlan.lines``), in order of allocation:
    what the debug dump draws (buffer lifetimes on x, bytes on y)."""
    owned, _ = _storages(lines, dict(hints or {}))
    continues: dict[str, str] = {}  # storage handed on by a Reuse -> the storage it came from
    for line in lines:
        if isinstance(line, Reuse):
            continues[line.new.name] = continues.get(line.old.name, line.old.name)
    chains: dict[str, list[_Storage]] = {}
    for name, storage in owned.items():
        chains.setdefault(continues.get(name, name), []).append(storage)
    out = []
    n = len(lines)
    for chain in chains.values():
        out.append(Lifetime(tuple(s.root.name for s in chain), min(s.defined_at for s in chain),
                            max(s.end(n) for s in chain), max(s.nbytes for s in chain),
                            any(not s.freeable for s in chain)))
    return sorted(out, key=lambda life: (life.start, life.names))


def describe_plan(plan: MemoryPlan, hints: Mapping[sympy.Symbol, int] | None = None) -> str:
    """The memory plan in a few lines (the ``memory`` log): the peaks, and each storage's
    buffers, bytes and the lines it is live over."""
    lives = storage_lifetimes(plan.lines, hints)
    frees = sum(isinstance(line, Free) for line in plan.lines)
    head = (f"peak {plan.peak_bytes} B (frees only {plan.peak_bytes_frees_only} B, unplanned "
            f"{plan.peak_bytes_unplanned} B); {len(lives)} storages, {frees} frees, {plan.reused} reused")
    rows = [f"  {' -> '.join(life.names)}: {life.nbytes} B, lines {life.start}..{life.end}"
            + (" (returned)" if life.returned else "") for life in lives]
    return "\n".join([head, *rows])
