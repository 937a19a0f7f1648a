"""The mark of a hook implementation, ``@fxwrap.hookimpl`` (``fxwrap.hookimpl`` is this object).

It lives with the targets, the lowest layer that implements hooks, so a built-in target's
``plugin.py`` imports nothing of ``fxwrap.plugins`` (the layer above, which loads the
targets).  ``fxwrap.plugins.hookspecs`` holds the specs and hands this marker on.
"""
from __future__ import annotations

import pluggy

PROJECT = "fxwrap"  # the pluggy project name: entry-point group, marker attributes

hookimpl = pluggy.HookimplMarker(PROJECT)
