"""Communication / computation overlap: a pass over the lines of a program.

Each collective (a line with ``issues_collective``) moves up to just below the last
line it depends on, each wait (``waits_collective``) moves down to just above the
first line that depends on it, and the work after that line that depends on nothing
from the wait on (up to the next collective) moves above the wait: every independent
line runs while the communication is under way.  (The scheduler, ``fuse``, keeps such
work out of the kernels that read a wait's value, ``_holds_until_wait``.)  Before::

    fxwrap_pointwise_0(arg0, buf0)
    buf1 = _c10d_functional.all_reduce.default(buf0, 'sum', '0')  # collective
    buf2 = _c10d_functional.wait_tensor.default(buf1)  # wait for buf1
    aten.mm.out(arg1, arg1, out=buf3)
    fxwrap_pointwise_1(buf2, buf3, buf4)

after ``overlap_collectives``::

    fxwrap_pointwise_0(arg0, buf0)
    buf1 = _c10d_functional.all_reduce.default(buf0, 'sum', '0')  # collective
    aten.mm.out(arg1, arg1, out=buf3)
    buf2 = _c10d_functional.wait_tensor.default(buf1)  # wait for buf1
    fxwrap_pointwise_1(buf2, buf3, buf4)

Two lines depend on each other when one defines or writes a name the other uses or
writes (buffers by their storage, so a view counts as its base); collectives and waits
cross only kernel launches and the lines the scheduler moves kernels across
(``_plain``), never a ``Return`` or a control-flow line.
Collectives keep their order among themselves (every rank issues them in the same
order), and a ``Comment`` moves with the line it annotates.  The pass runs before the
memory plan (``core.memory``), which then keeps what a collective reads alive up to
its wait.  The same order as Inductor's ``raise_comms`` / ``sink_waits``
(``torch/_inductor/comms.py``), over Wrapper IR lines.
"""
from __future__ import annotations

import sympy


def _root_names(line, roots: dict[str, str]) -> tuple[set[str], set[str], set[str]]:
    """``(names defined, names used, names written)`` of a line, buffers by their storage root."""
    root = lambda name: roots.get(name, name)  # noqa: E731
    defined = {root(b.name) for b in line.defines()} | set(line.defines_values()) \
        | {s.name for s in line.defines_symbols()}
    used = {root(b.name) for b in line.reads()} \
        | {s.name for e in line.size_exprs() for s in sympy.sympify(e).free_symbols}
    written = {root(b.name) for b in line.writes()}
    return defined, used, written


def _touches_nothing(line) -> bool:
    return not (line.reads() or line.writes() or line.defines() or line.defines_values()
                or line.defines_symbols() or line.size_exprs())


def _glued_to_next(line) -> bool:
    """A ``Comment`` on the next line, or a line that touches nothing and orders nothing
    (a ``DefineKernel`` above its launch): it moves with the line after it."""
    return line.annotates_next or (line.fusion_barrier and _touches_nothing(line))


def _plain(line) -> bool:
    """A line whose order is given by what it reads, writes and defines alone: a kernel
    launch (``binds_device``), a line the scheduler moves kernels across (an allocation,
    a view, an extern call...), or one glued to the next.  Anything else (a ``Return``,
    a control-flow line whose nested programs may hold collectives, a vendor's line)
    stays where it is, and collectives and waits do not cross it."""
    return line.binds_device or not line.fusion_barrier or _glued_to_next(line)


def _is_collective(unit: list) -> bool:
    return unit[-1].issues_collective


def _is_wait(unit: list) -> bool:
    return unit[-1].waits_collective


def _independent(a: list, b: list, roots: dict[str, str]) -> bool:
    """May units ``a`` and ``b`` (next to each other: each a line with the lines glued
    to it) swap places?"""
    for unit in (a, b):
        if not (_is_collective(unit) or _is_wait(unit) or all(_plain(line) for line in unit)):
            return False
    if _is_collective(a) and _is_collective(b):
        return False  # every rank issues collectives in the same order
    da, ua, wa = set(), set(), set()
    for line in a:
        d, u, w = _root_names(line, roots)
        da, ua, wa = da | d, ua | u, wa | w
    db, ub, wb = set(), set(), set()
    for line in b:
        d, u, w = _root_names(line, roots)
        db, ub, wb = db | d, ub | u, wb | w
    return not ((da | wa) & (ub | wb | db) or (db | wb) & (ua | wa | da))


def _storage_roots(lines: list) -> dict[str, str]:
    """Every buffer name -> the name of the buffer owning its storage (views, aliasing
    results, a wait's result), through ``Line.alias_of``."""
    roots: dict[str, str] = {}
    producers: dict = {}
    for line in lines:
        base = line.alias_of(producers)
        for name in line.defines_values():
            producers[name] = line
        if base is not None:
            for buf in line.defines():
                roots[buf.name] = roots.get(base.name, base.name)
    return roots


def overlap_collectives(lines: list) -> list:
    """``lines`` with every collective raised and every wait sunk (see the module doc);
    the same list when there is none.  Deterministic: a function of the lines alone."""
    if not any(x.issues_collective or x.waits_collective for x in lines):
        return lines
    roots = _storage_roots(lines)
    units: list[list] = []
    pending: list = []
    for line in lines:
        pending.append(line)
        if not _glued_to_next(line):
            units.append(pending)
            pending = []
    if pending:
        units.append(pending)
    # raise collectives, first to last
    for i in range(len(units)):
        if not _is_collective(units[i]):
            continue
        j = i
        while j > 0 and _independent(units[j - 1], units[j], roots):
            units[j - 1], units[j] = units[j], units[j - 1]
            j -= 1
    # sink waits, last to first (a later wait goes first, so an earlier one can pass it)
    for i in range(len(units) - 1, -1, -1):
        if not _is_wait(units[i]):
            continue
        j = i
        while j + 1 < len(units) and _independent(units[j], units[j + 1], roots):
            units[j], units[j + 1] = units[j + 1], units[j]
            j += 1
    # pull independent work that comes after a wait's first reader above the wait
    i = 0
    while i < len(units):
        if _is_wait(units[i]):
            units = _pull_above(units, i, roots)
        i += 1
    return [line for unit in units for line in unit]


def _footprint(unit: list, roots: dict[str, str]) -> tuple[set, set, set]:
    defined, used, written = set(), set(), set()
    for line in unit:
        d, u, w = _root_names(line, roots)
        defined, used, written = defined | d, used | u, written | w
    return defined, used, written


def _pull_above(units: list, at: int, roots: dict[str, str]) -> list:
    """``units`` with every unit after the wait at ``at`` that depends on nothing from the
    wait on moved just above it (in their order), up to the next collective or a unit
    that is not plain: the work runs while the communication is under way instead of
    after it."""
    moved: list = []
    kept: list = [units[at]]
    acc_defined, acc_used, acc_written = _footprint(units[at], roots)
    k = at + 1
    while k < len(units):
        unit = units[k]
        if _is_collective(unit) or not (_is_wait(unit) or all(_plain(line) for line in unit)):
            break
        defined, used, written = _footprint(unit, roots)
        free = not _is_wait(unit) and not ((defined | written) & (acc_used | acc_written | acc_defined)
                                           or used & (acc_defined | acc_written))
        if free:
            moved.append(unit)
        else:
            kept.append(unit)
            acc_defined |= defined
            acc_used |= used
            acc_written |= written
        k += 1
    return units[:at] + moved + kept + units[k:]
