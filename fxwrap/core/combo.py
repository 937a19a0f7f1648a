"""Horizontal fusion: independent pointwise kernels over different iteration spaces
become one combo kernel (``ir/combo.py``), one launch instead of one a tensor.

``fuse`` (``core/scheduler.py``) gives one group a loop nest; an optimizer step over
parameters of many shapes leaves one group per parameter and update.  ``combine`` walks
the fused items in order and lets a pointwise group join the open ``ComboGroup`` before
it when

* neither reads or writes what the other writes (views resolved to their storage), nor
  does anything between them stand in the way: the group moves up to the combo's place
  over the kernels and the views or comments since (``scheduler.can_hoist``, the test
  ``fuse`` uses), never over an extern call (its outputs would be allocated before the
  call and held longer: a higher peak);
* the combo stays within the emitter's ``ComboLimits`` (members, arguments).

A barrier line (a collective) or a group that cannot join closes the combo; a combo of
one group stays that group.  Given (the ``(7, 3)`` and ``(11,)`` groups independent)::

    Group((7, 3): buf0 = arg0 * 2)   View(...)   Group((11,): buf1 = arg1 + 1)

``combine`` returns ``[ComboGroup([Group((7, 3)...), Group((11,)...)]), View(...)]``;
the renderer makes its members ``ScheduledKernel``s and asks the emitter's
``render_combo`` for one kernel of them (separate kernels where it cannot).
Members are pointwise: reductions, scans, templates and indexed writes stay kernels of
their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field


from fxwrap.core.scheduler import (Group, argument_count, can_hoist, indexed, inert, is_barrier, job_names,
                                   view_roots)
from fxwrap.ir.combo import ComboLimits


@dataclass(eq=False)
class ComboGroup:
    """Pointwise groups (``members``, in program order) rendered as one combo kernel."""

    members: list[Group] = field(default_factory=list)

    @property
    def roots(self) -> list[str]:
        return [r for m in self.members for r in m.roots]

    @property
    def origins(self) -> list:
        return [o for m in self.members for o in m.origins]

    @property
    def started_because(self) -> str:
        return f"a combo kernel of {len(self.members)} independent pointwise kernels"


def combinable(group: Group) -> bool:
    """A pointwise group of plain stores (no reduction, scan, template or indexed write)."""
    return bool(group.stores) and not group.reductions and not group.reduced and group.template is None \
        and not indexed(group)


def combine(items: list, limits: ComboLimits | None, kept: dict[int, set[str]] | None = None) -> list:
    """Fused items (lines and ``Group``s, in order) -> lines, ``Group``s and ``ComboGroup``s
    (see the module docstring); ``limits`` None (the emitter renders no combo kernels):
    ``items`` as they are.  ``kept``: by id of each group, the buffers of its stores its kernel
    keeps (``scheduler.argument_count``); None: every store counts as an argument."""
    if limits is None:
        return list(items)
    roots = view_roots(items)
    out: list = []
    open_combo: ComboGroup | None = None
    waited: set[str] = set()  # buffers a collective's wait defines
    for item in items:
        if not isinstance(item, Group):
            out.append(item)
            if getattr(item, "waits_collective", False):
                waited |= {b.name for b in item.defines()}
            if is_barrier(item):
                open_combo = None
            continue
        if not combinable(item) or job_names(item)[0] & waited:
            # a kernel reading a collective's result stays alone: combined with independent
            # work, that work could no longer be raised above the wait (core/overlap.py)
            out.append(item)
            continue
        if open_combo is not None and _joins(open_combo, item, out, roots, limits, kept):
            open_combo.members.append(item)
            continue
        open_combo = ComboGroup([item])
        out.append(open_combo)
    return [x.members[0] if isinstance(x, ComboGroup) and len(x.members) == 1 else x for x in out]


def _joins(combo: ComboGroup, group: Group, out: list, roots: dict, limits: ComboLimits,
           kept: dict[int, set[str]] | None) -> bool:
    """Whether ``group`` may join ``combo`` (an item of ``out``): within the limits, only
    kernels, views and comments since the combo, and free to move up to the combo's place
    over its members and everything since."""
    if len(combo.members) >= limits.max_members:
        return False
    if argument_count([*combo.members, group], kept) > limits.max_arguments:
        return False
    at = next(i for i in range(len(out) - 1, -1, -1) if out[i] is combo)
    if not all(isinstance(x, (Group, ComboGroup)) or inert(x) for x in out[at + 1:]):
        return False  # not over an extern call: moved ahead of it, the kernel's outputs would live longer
    since: list = []
    for x in [combo, *out[at + 1:]]:
        since += x.members if isinstance(x, ComboGroup) else [x]
    return can_hoist(group, since, roots)
