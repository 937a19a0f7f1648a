"""A progress bar for long compiles, on stderr when it is a terminal.

``Progress(total, "forward")`` shows, when ``total > Progress.MIN_ITEMS`` and stderr is
a TTY (nothing at all otherwise: logs, CI, pytest's captured output)::

    fxwrap forward: kernels 12/40 [#########...........................]

``advance()`` may be called from the loader's threads; ``close()`` clears the line.
A module of its own beside ``core.logs``: it imports nothing of fxwrap.
"""
from __future__ import annotations

import sys
import threading


class Progress:
    """A one-line bar of ``done/total`` kernels (see module docstring)."""

    MIN_ITEMS = 8  # a handful of kernels compile too fast for a bar to help
    WIDTH = 32

    def __init__(self, total: int, label: str, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.label, self.done = total, label, 0
        isatty = getattr(self.stream, "isatty", None)
        self.active = total > self.MIN_ITEMS and callable(isatty) and bool(isatty())
        self._lock = threading.Lock()
        if self.active:
            self._draw()

    def _draw(self) -> None:
        filled = self.WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\rfxwrap {self.label}: kernels {self.done}/{self.total} [{bar}]")
        self.stream.flush()

    def advance(self, n: int = 1) -> None:
        if not self.active:
            return
        with self._lock:
            self.done = min(self.done + n, self.total)
            self._draw()

    def close(self) -> None:
        if not self.active:
            return
        with self._lock:
            self.stream.write("\r" + " " * (len(self.label) + self.WIDTH + 40) + "\r")
            self.stream.flush()
            self.active = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
