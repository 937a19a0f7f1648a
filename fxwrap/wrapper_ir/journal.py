"""Undo records of the lowerer's state, so that a lowering rule that declines leaves no trace.

The lowerer keeps what it builds in the containers of this module (``JournaledDict``,
``JournaledList``, ``JournaledSet``, ``JournaledCount``), which share one ``Journal``.
While a node's rule runs, the journal is open: every change to those containers writes
the step that undoes it.  A rule that returns a value commits (the records are
dropped); one that declines (``fxwrap.DECLINE``, ``Unsupported``) is undone, newest step
first, back to the journal's mark::

    journal = Journal()
    buffers = JournaledDict(journal)
    journal.open()                     # the rule of node ``sin`` starts
    buffers["buf3"] = Buffer(...)      # it realizes an operand ...
    journal.undo_to(0)                 # ... and declines: buffers is {} again
    journal.close()

A chain of rules (``core.lowering.DeclinableRule``) undoes each declining rule back to the
mark taken before it (``LoweringContext.rollback``).  Outside an open journal nothing is
recorded.  Order is kept: an entry deleted and then restored returns to its place.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

_MISSING = object()


class Journal:
    """``steps``: the undo steps of the open transaction (a list), or None when none is open
    (the containers read it before each change: nothing is recorded then)."""

    def __init__(self) -> None:
        self.steps: list[Callable[[], None]] | None = None

    def open(self) -> None:
        if self.steps is not None:
            raise RuntimeError("a journal transaction is open already")
        self.steps = []

    def close(self) -> None:
        """Keep every change (commit) and stop recording."""
        self.steps = None

    def mark(self) -> int:
        """A point to undo back to (``undo_to``)."""
        return len(self.steps) if self.steps is not None else 0

    def record(self, undo: Callable[[], None]) -> None:
        if self.steps is not None:
            self.steps.append(undo)

    def undo_to(self, mark: int) -> None:
        """Undo every change made after ``mark``, newest first."""
        steps = self.steps
        if steps is None:
            return
        while len(steps) > mark:
            steps.pop()()


class JournaledDict(dict):
    """A dict whose changes ``journal`` can undo::

        d = JournaledDict(journal, {"a": 1}); journal.open(); d["b"] = 2; journal.undo_to(0)
        d == {"a": 1}
    """

    def __init__(self, journal: Journal, items: Iterable = ()):
        super().__init__(items)
        self._journal = journal

    def _record_key(self, key) -> None:
        if not self._journal.steps is not None:
            return
        old = dict.get(self, key, _MISSING)
        if old is _MISSING:
            self._journal.record(lambda: dict.pop(self, key, None))
        else:
            self._journal.record(lambda: dict.__setitem__(self, key, old))

    def _record_removal(self, key) -> None:
        if not self._journal.steps is not None or not dict.__contains__(self, key):
            return
        position, old = list(dict.keys(self)).index(key), dict.__getitem__(self, key)

        def restore():
            entries = list(dict.items(self))
            entries.insert(position, (key, old))
            dict.clear(self)
            dict.update(self, entries)
        self._journal.record(restore)

    def __setitem__(self, key, value) -> None:
        self._record_key(key)
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self._record_removal(key)
        super().__delitem__(key)

    def pop(self, key, *default):
        self._record_removal(key)
        return super().pop(key, *default)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def clear(self) -> None:
        for key in list(self):
            del self[key]

    def popitem(self):
        raise NotImplementedError("JournaledDict.popitem")


class JournaledList(list):
    """A list whose appends, extends, inserts and slice deletions ``journal`` can undo."""

    def __init__(self, journal: Journal, items: Iterable = ()):
        super().__init__(items)
        self._journal = journal

    def _record_length(self) -> None:
        if self._journal.steps is not None:
            length = len(self)
            self._journal.record(lambda: list.__delitem__(self, slice(length, None)))

    def _record_all(self) -> None:
        if self._journal.steps is not None:
            old = list(self)
            self._journal.record(lambda: list.__setitem__(self, slice(None), old))

    def append(self, item) -> None:
        self._record_length()
        super().append(item)

    def extend(self, items) -> None:
        self._record_length()
        super().extend(items)

    def __iadd__(self, items):
        self.extend(items)
        return self

    def insert(self, index, item) -> None:
        self._record_all()
        super().insert(index, item)

    def __setitem__(self, index, value) -> None:
        self._record_all()
        super().__setitem__(index, value)

    def __delitem__(self, index) -> None:
        self._record_all()
        super().__delitem__(index)

    def pop(self, index=-1):
        self._record_all()
        return super().pop(index)

    def remove(self, item) -> None:
        self._record_all()
        super().remove(item)

    def clear(self) -> None:
        self._record_all()
        super().clear()


class JournaledSet(set):
    """A set whose additions and removals ``journal`` can undo."""

    def __init__(self, journal: Journal, items: Iterable = ()):
        super().__init__(items)
        self._journal = journal

    def add(self, item) -> None:
        if self._journal.steps is not None and item not in self:
            self._journal.record(lambda: set.discard(self, item))
        super().add(item)

    def discard(self, item) -> None:
        if self._journal.steps is not None and item in self:
            self._journal.record(lambda: set.add(self, item))
        super().discard(item)

    def remove(self, item) -> None:
        if item not in self:
            raise KeyError(item)
        self.discard(item)

    def update(self, *others) -> None:
        for other in others:
            for item in other:
                self.add(item)

    def __ior__(self, other):
        self.update(other)
        return self

    def clear(self) -> None:
        for item in list(self):
            self.discard(item)


class JournaledCount:
    """A counter (the next buffer number) whose steps ``journal`` can undo: ``take()`` gives
    the current value and counts on."""

    def __init__(self, journal: Journal, start: int = 0):
        self._journal = journal
        self.value = start

    def take(self) -> int:
        taken = self.value
        self._journal.record(lambda: setattr(self, "value", taken))
        self.value = taken + 1
        return taken
