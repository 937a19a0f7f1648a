"""Every fxwrap hook, in one file.

A plugin is a module (or any object) that implements some of these hooks with
``@fxwrap.hookimpl`` and is named by an entry point of group ``fxwrap``::

    # pyproject.toml of a plugin package
    [project.entry-points.fxwrap]
    arena = "fxwrap_arena.plugin"

    # fxwrap_arena/plugin.py
    import fxwrap

    @fxwrap.hookimpl
    def fxwrap_targets():
        return [fxwrap.Target("arena", "cpu", fxwrap.CpuDevice(), ArenaEmitter, ArenaWrapper)]

The built-in targets (``cpu``, ``cuda``, ``mps``) register the same way.  No hook
is ``firstresult``: fxwrap collects every plugin's answer and combines them by the
rules in ``fxwrap.plugins.manager``.  An implementation may take fewer arguments
than its spec (``def fxwrap_decompositions():``), never others; a name starting
with ``fxwrap_`` that is not below, or a hook without ``@fxwrap.hookimpl``, is a
load-time ``PluginError``.
"""
from __future__ import annotations

import pluggy

from fxwrap.targets.marker import PROJECT, hookimpl  # noqa: F401  (fxwrap.hookimpl; targets import it there)

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def fxwrap_targets():
    """The targets this plugin provides.

    When: once per plugin, when the plugin manager loads (the first compile, or
    ``fxwrap targets``).
    Arguments: none.
    Returns: a list of ``fxwrap.Target``; each needs a ``DeviceInterface`` instance
    of its ``device_type``, a ``KernelEmitter`` subclass and a ``WrapperCodegen``
    subclass.  A plugin may register several targets for one device type (variants,
    picked by name: ``options={"target": name}``); target names are unique across plugins.
    firstresult: no, every plugin's targets are registered.  Of several targets for
    one device type the default is the highest ``Target.priority``, then the
    alphabetically first name; any target is selectable by name.

    Example::

        @hookimpl
        def fxwrap_targets():
            # priority below the built-in cpu target (0): used only when named
            return [Target("arena", "cpu", CpuDevice(), KernelEmitter, ArenaWrapper, priority=-10)]
    """


@hookspec
def fxwrap_lowerings(registry, target):
    """Add or override lowerings (ATen op -> loop IR) for ``target``.

    When: once per target per plugin manager, when fxwrap builds the compile
    session for ``target`` (``PluginManager.session(target)``), before the first
    graph for it is lowered; every graph for ``target`` then uses that table.
    Arguments: ``registry``, a ``fxwrap.core.lowering.LoweringRegistry`` of this
    plugin's own; ``target``, the ``Target`` the table is for.
    Returns: nothing; register into ``registry``: ``registry.register(op, rule)``
    (for every target the hook is called for) or ``registry.register(op, rule,
    target=name)`` (that target only).  ``op`` is an ``OpOverload`` or an
    ``OpOverloadPacket`` (``aten.gelu``: every overload).  A ``target=`` name that
    no plugin registered raises ``LoweringError`` (with the closest registered
    name), reported as a ``PluginError`` naming this plugin.  The rules override
    fxwrap's own rules for that op; of two plugins, the later in load order wins.
    A rule is ``rule(ctx, *args, **kwargs) -> value | None`` (see
    ``fxwrap.core.lowering``); None or ``Unsupported`` keeps the op an ATen extern call;
    ``fxwrap.DECLINE`` hands the case to the rule this one overrides (an earlier plugin's,
    the target's or fxwrap's own; none: an extern call), with what the rule did through
    ``ctx`` undone.
    firstresult: no, every plugin is called, in load order.

    Example::

        @hookimpl
        def fxwrap_lowerings(registry, target):
            if target.name == "arena":
                registry.register(aten.gelu.default, my_gelu_rule, target="arena")
    """


@hookspec
def fxwrap_decompositions(target):
    """Extra decompositions applied while capturing a graph for ``target``.

    When: once per target per plugin manager, when fxwrap builds the compile session
    for ``target``; the table is applied to every graph captured for ``target``,
    before AOTAutograd traces it to ATen.
    Arguments: ``target``, the ``Target`` the graph compiles for.
    Returns: a dict ``{OpOverload: callable}`` (empty or None for none); it is
    applied on top of fxwrap's default table.
    firstresult: no, the dicts of all plugins are merged.  When two plugins map
    one op differently, the plugin that registered ``target`` wins; when neither
    did, that is a ``PluginError``.

    Example::

        @hookimpl
        def fxwrap_decompositions(target):
            if target.name != "arena":
                return {}
            return {aten.tanh.default: lambda x: 2 * torch.sigmoid(2 * x) - 1}
    """


@hookspec
def fxwrap_wrapper_passes(target, options):
    """Deprecated (goes in the next release): passes over the Wrapper IR line list of every
    program compiled for ``target``.  A thin adapter onto ``fxwrap_pipeline``: the manager
    appends each returned callable, as ``LinesPass.of(fn)``, to the ``wrapper passes`` stage
    after every installed plugin's ``fxwrap_pipeline`` edits, and warns
    (``DeprecationWarning``) once per plugin.

    When: as ``fxwrap_pipeline``, once per target and set of options per plugin manager; the
    passes then run on every compiled graph, after the memory plan and before the lines
    become a GraphModule.
    Arguments: ``target``, the ``Target`` being compiled for; ``options``, the
    ``CompileOptions`` (an implementation may leave it out of its signature).
    Returns: a list of callables ``pass(lines: list[Line]) -> list[Line]`` (empty or None
    for none).  A pass must return a valid program: every buffer it uses defined before,
    ``Free`` after the last use, the ``Return`` last.
    firstresult: no, passes of all plugins run, in plugin load order, each plugin's in its
    list's order.

    The same pass on the old hook and on ``fxwrap_pipeline``. Example::

        @hookimpl
        def fxwrap_wrapper_passes(target):
            return [drop_comments]

        @hookimpl
        def fxwrap_pipeline(pipeline, target, options):
            pipeline.wrapper.append(LinesPass.of(drop_comments))
    """


@hookspec
def fxwrap_pipeline(pipeline, target, options):
    """Insert, replace or remove the stages and passes ``target`` compiles with, at named points.

    When: once per target and set of options per plugin manager, when fxwrap builds the
    compile session for them (``PluginManager.session(target)``, then
    ``session.configured(options)`` for each other set of options); every graph then runs
    the edited pipeline (``api.compile_aten_graph``, ``session.pipeline``).
    Arguments: ``pipeline``, a ``fxwrap.core.pipeline.Pipeline`` as the plugins before
    this one left it: its stages (``Stage(name, run, takes, gives, passes, steps)``;
    fxwrap's: ``"capture"``, ``"aten passes"``, ``"program cache"``, ``"lowering"``,
    ``"render"``, ``"wrapper passes"``, ``"fx"``, ``"program"``; ``print(pipeline)`` lists
    them with their passes); ``pipeline.insert_before(name, new)``, ``insert_after``,
    ``replace(name, new)`` and ``remove(name)`` find a stage or a pass by name (a ``Stage``
    goes next to a stage, a pass next to a pass); ``pipeline.aten`` (``GraphPass(name,
    run, phase)``, ``run(graph: AtenGraph)`` rewrites ``graph.gm`` in place) and
    ``pipeline.wrapper`` (``LinesPass(name, run, phase)``, ``run(lines, program:
    WrapperProgram) -> lines``; fxwrap's: ``"overlap collectives"``, ``"memory plan"``,
    which must stay) are the two pass lists, with ``append``, ``insert_after(name, p)``,
    ``move_before(name, other)``, ``move_after`` and ``remove_named(name)``.  ``target``,
    the ``Target``; ``options``, the ``CompileOptions`` (a pass that an option turns on,
    such as fxwrap's own ``check_nan``, reads it here).  An implementation may leave
    ``options`` (or ``target``) out of its signature.
    Returns: nothing; edit ``pipeline`` in place.  A pipeline left broken (a stage taking
    what no stage before it gives, a pass of the wrong kind, a name twice, no ``"memory
    plan"``) is a ``PluginError`` naming this plugin.
    firstresult: no, every plugin edits the pipeline in turn, in load order; fxwrap's
    built-in plugins (the debug modes, graph capture's partitions) edit it last.

    Example::

        def drop_clones(graph):   # graph: fxwrap.core.passes.AtenGraph
            ...

        @hookimpl
        def fxwrap_pipeline(pipeline, target, options):
            if target.name == "arena":
                pipeline.insert_before("patterns", GraphPass("drop clones", drop_clones))
                pipeline.aten.move_before("matmul padding", "channels-last convolutions")
            if options.check_nan:
                pipeline.wrapper.append(LinesPass("my check", my_check))
    """


@hookspec
def fxwrap_templates(target):
    """Templates (hand-written kernels for whole ATen ops, with fused epilogues) for ``target``.

    When: once per target per plugin manager, when fxwrap builds the compile session for
    ``target``; the list is ``session.templates`` for every graph compiled for it.
    Arguments: ``target``, the ``Target`` the graph compiles for.
    Returns: a list of ``fxwrap.Template`` instances (empty or None for none).  Each has a
    ``name``, the ATen overloads it computes (``ops``: ``aten.mm.default``,
    ``aten.addmm.default``, ``aten.bmm.default``), ``refusal(call) -> str | None`` and
    ``render(kernel, emitter) -> KernelSource`` (see ``fxwrap.core.templates`` and
    docs/templates.md: the ``TemplateCall``, the epilogue over ``template_out``).
    firstresult: no.  ``session.templates`` lists the templates of the plugin that
    registered ``target`` first, then every other plugin's, in load order.  Which one
    runs is chosen per op at compile time (``options={"templates": "auto"}``: timed
    against the ATen extern and each other; ``"always"``: the first that applies;
    ``"off"``: none).

    Example::

        @hookimpl
        def fxwrap_templates(target):
            return [BlockedGemm()] if target.name == "arena" else []
    """
