"""Every fxwrap hook, in one file.  A plugin implements any subset with
``@fxwrap.hookimpl`` and is found through the entry-point group ``fxwrap``::

    # pyproject.toml of a plugin package
    [project.entry-points.fxwrap]
    arena = "fxwrap_arena.plugin"
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("fxwrap")
hookimpl = pluggy.HookimplMarker("fxwrap")


@hookspec
def fxwrap_targets():
    """Targets this plugin provides.

    Called once, when the plugin manager loads plugins (the first compile).
    Returns a list of ``fxwrap.Target``.  Not firstresult: every plugin's targets
    are collected.  Two targets with one ``name`` from different plugins are an
    error; several targets for one ``device_type`` are allowed, and the one with
    the highest ``priority`` (then the alphabetically first name) is the default
    for tensors of that device type.

    Example::

        @hookimpl
        def fxwrap_targets():
            return [Target("arena", "cpu", CpuDevice(), ArenaEmitter, ArenaWrapper)]
    """


@hookspec
def fxwrap_lowerings(registry, target):
    """Add or override lowerings for ``target`` (a ``Target``) in ``registry``.

    Called once per target the first time it compiles.  Returns nothing; mutate
    ``registry`` (``registry.register(aten.gelu.default, rule, target="arena")``).
    """


@hookspec
def fxwrap_decompositions(target):
    """Extra decompositions for ``target``: a dict ``{OpOverload: callable}``.

    Called per compile.  Not firstresult: dicts from all plugins are merged in
    plugin-load order, later ones winning.  Example::

        @hookimpl
        def fxwrap_decompositions(target):
            return {aten.silu.default: my_silu} if target.name == "arena" else {}
    """


@hookspec
def fxwrap_wrapper_passes(target):
    """Passes over the Wrapper IR line list for ``target``.

    Called per compile, after memory planning.  Returns a list of callables
    ``pass(lines) -> lines``, applied in order.  Example::

        @hookimpl
        def fxwrap_wrapper_passes(target):
            return [drop_comments]
    """
