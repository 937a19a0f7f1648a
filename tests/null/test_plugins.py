"""Plugin loading and validation (fxwrap.plugins), with plugins from tests/null/fxwrap_plugin_fixtures.

Every broken plugin must fail at load time with a ``PluginError`` naming its entry
point and what is wrong; the combining rules must not depend on load order.
"""
import importlib.metadata
import inspect
import itertools
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.plugins import hookspecs
from fxwrap.plugins.manager import (
    HOOKS, PluginError, PluginManager, get_plugin_manager, installed_entry_points, use_plugin_manager,
)
from fxwrap.ir.lines import Comment

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def ep(module: str, name: str | None = None) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name or module, f"fxwrap_plugin_fixtures.{module}", group="fxwrap")


def load(*modules: str) -> PluginManager:
    return PluginManager([ep(m) for m in modules]).load()


def named(module: str) -> str:
    return f"plugin {module!r} (entry point 'fxwrap_plugin_fixtures.{module}' in group 'fxwrap')"


BROKEN = {
    "import_fails": ["failed to import", "ModuleNotFoundError", "fxwrap_plugin_fixtures_missing_dependency"],
    "does_not_exist": ["failed to import", "ModuleNotFoundError", "fxwrap_plugin_fixtures.does_not_exist"],
    "misspelled": ["hook specifications", "unknown hook 'fxwrap_target'",
                   "'fxwrap_target' is not a hook: did you mean 'fxwrap_targets'?"],
    "wrong_argument": ["hook specifications", "fxwrap_decompositions", "device"],
    "undecorated": ["'fxwrap_targets' without @fxwrap.hookimpl"],
    "no_hooks": ["implements no fxwrap hook", "fxwrap_targets", "fxwrap_wrapper_passes"],
    "hook_wrapper": ["['fxwrap_wrapper_passes'] are hook wrappers"],
    "no_device": ["target 'no_device' lacks a device interface (Target.device: a DeviceInterface"],
    "mismatched_device": ["target 'mismatched' lacks a device interface for its device type",
                          "Target.device.device_type is 'testdev', Target.device_type is 'cpu'"],
    "no_emitter": ["target 'no_emitter' lacks a kernel emitter (Target.emitter: a KernelEmitter subclass)"],
    "no_wrapper": ["target 'no_wrapper' lacks a wrapper (Target.wrapper: a WrapperCodegen subclass)"],
    "raises": ["its fxwrap_targets() raised RuntimeError: no licence for the simulator"],
    "not_a_list": ["fxwrap_targets() must return a list of fxwrap.Target, got Target"],
    "not_a_target": ["fxwrap_targets() returned {'name': 'dict'", "not an fxwrap.Target"],
}
PARTS = ("a device interface", "a kernel emitter", "a wrapper")


@pytest.mark.parametrize("module", sorted(BROKEN))
def test_broken_plugin_fails_at_load_naming_it(module):
    manager = PluginManager([ep("alpha"), ep(module)])
    with pytest.raises(PluginError) as info:
        manager.load()
    message = str(info.value)
    assert message.startswith(named(module)), message
    for part in BROKEN[module]:
        assert part in message, (part, message)
    assert sum(part in message for part in PARTS) <= 1  # each missing piece reported on its own
    with pytest.raises(PluginError) as again:  # a failed manager keeps failing the same way
        manager.target("alpha")
    assert again.value is info.value


@pytest.mark.parametrize("order", [("alpha", "alpha_again"), ("alpha_again", "alpha")])
def test_two_plugins_one_target_name(order):
    with pytest.raises(PluginError) as info:
        load(*order)
    assert str(info.value) == (f"{named(order[1])} registers target 'alpha', already registered by "
                               f"{named(order[0])}; rename one of them")


@pytest.mark.parametrize("plugin_first", [True, False], ids=["plugin first", "built-in first"])
def test_a_plugin_target_named_like_a_builtin_one_blames_the_plugin(plugin_first):
    builtin = importlib.metadata.EntryPoint("cpu", "fxwrap.targets.cpu_cpp.plugin", group="fxwrap")
    order = [ep("named_cpu"), builtin] if plugin_first else [builtin, ep("named_cpu")]
    with pytest.raises(PluginError) as info:
        PluginManager(order).load()
    assert str(info.value) == (
        f"{named('named_cpu')} registers target 'cpu', the name of a built-in fxwrap target (registered by "
        "plugin 'cpu' (entry point 'fxwrap.targets.cpu_cpp.plugin' in group 'fxwrap')); a plugin cannot "
        "replace a built-in target: give the plugin's target another name")


def test_one_entry_point_name_twice():
    with pytest.raises(PluginError, match=r"plugin 'alpha' \(entry point 'fxwrap_plugin_fixtures.beta'.*"
                                          r"registered twice"):
        PluginManager([ep("alpha"), ep("beta", name="alpha")]).load()


@pytest.mark.parametrize("order", list(itertools.permutations(["alpha", "beta", "gamma"])))
def test_default_target_is_highest_priority_in_any_load_order(order):
    manager = load(*order)
    assert manager.target_for_device("testdev").name == "gamma"  # priority 2 over 1, 1
    for name in order:  # every target stays selectable by name
        assert manager.target(name).name == name
    assert [name for name, _ in manager.plugins] == list(order)


@pytest.mark.parametrize("order", [("alpha", "beta"), ("beta", "alpha")])
def test_priority_tie_goes_to_first_name_in_either_load_order(order):
    manager = load(*order)
    assert manager.target_for_device("testdev").name == "alpha"
    assert manager.target("beta").priority == manager.target("alpha").priority == 1
    with pytest.raises(KeyError, match="no fxwrap target for device type 'nodev'"):
        manager.target_for_device("nodev")
    with pytest.raises(KeyError, match=r"no fxwrap target named 'delta'; registered: \['alpha', 'beta'\]"):
        manager.target("delta")


@pytest.mark.parametrize("order", [("decomp_alpha", "decomp_beta"), ("decomp_beta", "decomp_alpha")])
def test_decompositions_merge_and_the_target_owner_wins(order):
    from fxwrap_plugin_fixtures import decomp_alpha as a, decomp_beta as b
    manager = load(*order)
    assert manager.decompositions(manager.target("alpha")) == {
        aten.sin.default: a.alpha_sin, aten.cos.default: a.alpha_cos, aten.exp.default: b.beta_exp}
    assert manager.decompositions(manager.target("beta")) == {
        aten.sin.default: b.beta_sin, aten.cos.default: a.alpha_cos, aten.exp.default: b.beta_exp}


@pytest.mark.parametrize("order", [("decomp_beta", "decomp_gamma"), ("decomp_gamma", "decomp_beta")])
def test_decomposition_conflict_without_the_owner_is_an_error(order):
    from fxwrap_plugin_fixtures import decomp_beta as b
    manager = load("alpha", *order)
    with pytest.raises(PluginError) as info:
        manager.decompositions(manager.target("alpha"))
    message = str(info.value)
    assert named("decomp_beta") in message and named("decomp_gamma") in message
    assert "both decompose aten.sin.default for target 'alpha'" in message
    # beta's own target: its table wins; the identical exp entry is no conflict
    assert manager.decompositions(manager.target("beta")) == {aten.sin.default: b.beta_sin,
                                                              aten.exp.default: b.beta_exp}


def test_decompositions_must_be_a_dict():
    manager = load("alpha", "bad_decompositions")
    with pytest.raises(PluginError, match=r"plugin 'bad_decompositions' .*must return a dict"):
        manager.decompositions(manager.target("alpha"))


def test_plugin_decompositions_reach_capture():
    torch._dynamo.reset()
    x = torch.randn(64)
    with use_plugin_manager(PluginManager([*installed_entry_points(), ep("decomp_tanh")])):
        program = fxwrap.lower(lambda t: torch.tanh(t) * 3, x, target="externs_cpu")
        untouched = fxwrap.lower(lambda t: torch.tanh(t) * 3, x, target="cpu")  # decomposes for its target only
    code = program.code()
    assert "aten.sigmoid.out" in code and "aten.tanh" not in code, code
    assert "sigmoid" not in untouched.code()
    (out,) = program(x)
    torch.testing.assert_close(out, torch.tanh(x) * 3)


@pytest.mark.filterwarnings("ignore:.*fxwrap_wrapper_passes is deprecated:DeprecationWarning")
def test_wrapper_passes_are_applied_in_load_order():
    """The deprecated ``fxwrap_wrapper_passes`` (an adapter onto ``fxwrap_pipeline``; its
    warning: tests/null/test_pipeline.py) still runs every plugin's passes in load order."""
    from fxwrap_plugin_fixtures import drop_comments, tag_passes

    def matmul_relu(a, b):
        return torch.relu(a @ b) + 1

    x, w = torch.randn(16, 8), torch.randn(8, 4)
    torch._dynamo.reset()
    plain = fxwrap.lower(matmul_relu, x, w, target="cpu")
    assert any(line.origins for line in plain.lines)  # there is something to drop
    torch._dynamo.reset()
    tag_passes.ran.clear()
    manager = PluginManager([*installed_entry_points(), ep("drop_comments"), ep("tag_passes")])
    with use_plugin_manager(manager) as active:
        assert get_plugin_manager() is active
        program = fxwrap.lower(matmul_relu, x, w, target="cpu")
    assert get_plugin_manager() is not manager  # restored
    assert drop_comments.calls[-1] == "cpu" and tag_passes.ran == ["tag.first", "tag.second"]
    assert not any(isinstance(line, Comment) or line.origins for line in program.lines)
    assert not any("comment" in node.meta or "fxwrap_origins" in node.meta
                   for node in program.graph_module.graph.nodes)
    assert len(program.lines) == len(plain.lines) - sum(isinstance(line, Comment) for line in plain.lines)
    (out,) = program(x, w)
    torch.testing.assert_close(out, matmul_relu(x, w))
    assert manager.wrapper_passes(manager.target("cpu")) == [
        drop_comments.drop_comments, tag_passes.first, tag_passes.second]
    reverse = PluginManager([ep("tag_passes"), ep("drop_comments"), ep("alpha")]).load()
    assert reverse.wrapper_passes(reverse.target("alpha")) == [
        tag_passes.first, tag_passes.second, drop_comments.drop_comments]


def test_hook_raising_at_compile_time_names_the_plugin():
    manager = load("alpha", "pass_raises")
    with pytest.raises(PluginError, match=r"plugin 'pass_raises' .*: its fxwrap_wrapper_passes\(\) raised "
                                          r"ValueError: passes for alpha are not ready"):
        manager.wrapper_passes(manager.target("alpha"))


def _sin_times_two(t):
    return torch.sin(t) * 2


def test_lowerings_hook_rule_runs_in_a_compile():
    """A plugin's fxwrap_lowerings rule (aten.sin -> cos, on cpu only) is what a real
    compile lowers sin with: the numbers are cos's, computed inside a generated kernel."""
    from fxwrap_plugin_fixtures import sin_to_cos
    x = torch.randn(33, 17)
    sin_to_cos.calls.clear()
    manager = PluginManager([*installed_entry_points(), ep("sin_to_cos")])
    with use_plugin_manager(manager):
        torch._dynamo.reset()
        on_cpu = fxwrap.lower(_sin_times_two, x, target="cpu")
        torch._dynamo.reset()
        on_reference = fxwrap.lower(_sin_times_two, x, target="reference")  # not the plugin's target
        torch._dynamo.reset()
        again = fxwrap.lower(_sin_times_two, x, target="cpu")
    torch.testing.assert_close(on_cpu.run(x), torch.cos(x) * 2)
    torch.testing.assert_close(again.run(x), torch.cos(x) * 2)
    torch.testing.assert_close(on_reference.run(x), torch.sin(x) * 2)
    (kernel,) = [n.target for n in on_cpu.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert "std::cos" in kernel.source and "std::sin" not in kernel.source, kernel.source
    assert "aten.sin" not in on_cpu.code() and "aten.cos" not in on_cpu.code()
    # one session per target per manager: the hook ran once for cpu, once for reference
    assert sorted(sin_to_cos.calls) == ["cpu", "reference"], sin_to_cos.calls
    table = manager.session(manager.target("cpu")).lowerings
    for overload in (aten.sin.default, aten.sin.out):  # the packet key stands for every overload
        assert table.lookup(overload) is sin_to_cos.sin_as_cos


def test_lowerings_hook_builds_each_targets_table():
    from fxwrap.core.lowering import REGISTRY
    from fxwrap_plugin_fixtures import lowerings
    manager = load("alpha", "lowerings")
    lowered, alpha = (manager.session(manager.target(name)).lowerings for name in ("lowered", "alpha"))
    assert lowered.lookup(aten.relu.default) is lowerings.relu_rule
    assert alpha.lookup(aten.relu.default) is REGISTRY.default[aten.relu.default]
    assert lowerings.seen[-2:] == ["lowered", "alpha"]
    assert manager.session(manager.target("alpha")).lowerings is alpha  # built once, then kept


def test_lowerings_hook_calls_go_through_pluggys_hook_relay():
    manager = load("alpha", "lowerings")
    called = []
    undo = manager.pm.add_hookcall_monitoring(
        lambda hook_name, impls, kwargs: called.append((hook_name, [i.plugin_name for i in impls])),
        lambda outcome, hook_name, impls, kwargs: None)
    try:
        manager.session(manager.target("lowered"))
    finally:
        undo()
    assert ("fxwrap_lowerings", ["lowerings"]) in called, called
    assert ("fxwrap_wrapper_passes", []) not in called  # a plugin without the hook is not called


def test_lowering_for_a_misspelled_target_names_the_plugin_and_the_closest_target():
    manager = PluginManager([*installed_entry_points(), ep("lowering_typo")])
    with pytest.raises(PluginError) as info:
        manager.session(manager.target("cpu"))
    message = str(info.value)
    assert message.startswith(named("lowering_typo") + ": its fxwrap_lowerings() raised LoweringError"), message
    assert "no fxwrap target named 'cpuu' for the lowering of aten.relu.default; did you mean 'cpu'?" in message


def test_a_rule_that_gives_up_leaves_the_builder_as_it_found_it():
    """The rule realizes its operand (a kernel job, a buffer name, an environment entry)
    and raises Unsupported: the program is exactly the one without that rule."""
    from fxwrap_plugin_fixtures import lowering_gives_up

    def fn(t):
        return torch.sin(t * 3 + 1) * 2

    x = torch.randn(16, 8)
    torch._dynamo.reset()
    plain = fxwrap.lower(fn, x, target="cpu")
    lowering_gives_up.attempts.clear()
    with use_plugin_manager(PluginManager([*installed_entry_points(), ep("lowering_gives_up")])):
        torch._dynamo.reset()
        program = fxwrap.lower(fn, x, target="cpu")
    assert lowering_gives_up.attempts, "the rule did not run"
    assert "aten.sin.out" in program.code() and "aten.sin" not in plain.code()
    torch.testing.assert_close(program.run(x), fn(x))
    # t * 3 + 1 is realized once, by the extern's own request, into the first buffer name
    # (the rule's realization left no kernel, no buffer, no name behind); sin reads it
    code = program.code()
    assert "fxwrap_pointwise_0(arg0, buf0)" in code and "aten.sin.out(buf0, " in code, code
    assert sum(isinstance(line, fxwrap.lines.DefineKernel) for line in program.lines) == 2, code


def test_builtin_targets_load_through_the_installed_entry_points():
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="fxwrap")}
    manager = get_plugin_manager()
    for name, module in (("cpu", "cpu_cpp"), ("cuda", "cuda_triton"), ("mps", "mps_metal")):
        assert installed[name] == f"fxwrap.targets.{module}.plugin"
        target = manager.target(name)
        assert (target.device_type, target.priority) == (name, 0)
        assert manager.owner[name] == f"plugin {name!r} (entry point {installed[name]!r} in group 'fxwrap')"
        assert manager.target_for_device(name) is target  # built-ins are their device's default
    assert set(PluginManager().load().targets) == set(manager.targets) >= {"cpu", "cuda", "mps"}


def test_every_hook_is_specified_and_documented():
    assert HOOKS == ("fxwrap_decompositions", "fxwrap_lowerings", "fxwrap_pipeline", "fxwrap_targets",
                     "fxwrap_templates", "fxwrap_wrapper_passes")
    params = {name: list(inspect.signature(getattr(hookspecs, name)).parameters) for name in HOOKS}
    assert params == {"fxwrap_decompositions": ["target"], "fxwrap_lowerings": ["registry", "target"],
                      "fxwrap_pipeline": ["pipeline", "target", "options"],
                      "fxwrap_targets": [], "fxwrap_templates": ["target"],
                      "fxwrap_wrapper_passes": ["target", "options"]}
    for name in HOOKS:
        doc = getattr(hookspecs, name).__doc__
        for heading in ("When:", "Arguments:", "Returns:", "firstresult: no", "Example::", "@hookimpl"):
            assert heading in doc, (name, heading)
        assert getattr(hookspecs, name).fxwrap_spec["firstresult"] is False


def test_builtin_entry_points_match_pyproject():
    """Running from a source tree (no installed metadata) registers the same built-in targets."""
    import pathlib
    import tomllib

    from fxwrap.plugins.manager import BUILTIN_ENTRY_POINTS
    pyproject = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert dict(BUILTIN_ENTRY_POINTS) == pyproject["project"]["entry-points"]["fxwrap"]


def test_builtin_targets_load_without_installed_metadata(monkeypatch):
    import importlib.metadata

    from fxwrap.plugins.manager import BUILTIN_ENTRY_POINTS, PluginManager, installed_entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    eps = installed_entry_points()
    assert [(ep.name, ep.value) for ep in eps] == sorted(BUILTIN_ENTRY_POINTS)
    manager = PluginManager(eps).load()
    assert {"cpu", "cuda", "mps", "reference"} <= set(manager.targets)


def _sin_of_triple_times_two(t):
    return torch.sin(t * 3) * 2  # sin's operand is lazy: realizing it makes a kernel and a buffer


def _kernels(program):
    return [n.target for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


@pytest.mark.parametrize("below", [None, "sin_to_cos"])
def test_a_lowering_rule_declines_back_to_the_rule_it_overrides(below):
    """``fxwrap.DECLINE`` from a plugin's rule runs the rule beneath it: another plugin's
    (``sin_to_cos``: cos) or fxwrap's own (sin), inside a generated kernel, with what the
    declining rule realized first undone (one kernel, no extra buffer)."""
    from fxwrap_plugin_fixtures import declines
    x32, x64 = torch.randn(33, 17), torch.randn(33, 17, dtype=torch.float64)
    plugins = [ep(below)] if below else []
    manager = PluginManager([*installed_entry_points(), *plugins, ep("declines")])
    declines.declined.clear()
    with use_plugin_manager(manager):
        torch._dynamo.reset()
        handled = fxwrap.lower(_sin_of_triple_times_two, x64, target="cpu")
        torch._dynamo.reset()
        declined = fxwrap.lower(_sin_of_triple_times_two, x32, target="cpu")
    torch.testing.assert_close(handled.run(x64), (torch.sin(x64 * 3) + 1) * 2)
    beneath = torch.cos if below else torch.sin
    torch.testing.assert_close(declined.run(x32), beneath(x32 * 3) * 2)
    assert declines.declined, "the rule did not run for float32"
    (kernel,) = _kernels(declined)  # the realization before the decline left no kernel
    assert ("std::cos" in kernel.source) == bool(below) and "aten." not in declined.code(), declined.code()
    assert declined.code().count("empty_strided") == 1, declined.code()
    assert "the declining rule ran here" not in declined.code()


def test_a_rule_that_declines_with_nothing_beneath_is_an_extern():
    from fxwrap.core.lowering import DECLINE, DeclinableRule, LoweringTable

    def never(ctx, x):
        return DECLINE

    class Ctx:
        rolled_back = 0

        def rollback(self):
            self.rolled_back += 1
    table = LoweringTable("cpu", {aten.sin.default: never}, {aten.sin.default: never})
    runner = table.rule(aten.sin.default)
    assert isinstance(runner, DeclinableRule) and table.lookup(aten.sin.default) is never
    ctx = Ctx()
    assert runner(ctx, None) is None and ctx.rolled_back == 2
    assert repr(DECLINE) == "fxwrap.DECLINE"


def _mm_sin(a, b):
    return torch.sin(a @ b).sum(0) * 2  # the product: a buffer freed after the kernel that sums it


def test_a_plugin_adds_and_reorders_passes():
    """``fxwrap_pipeline`` edits the declared pass lists: the compile runs them in the edited
    order (an added ATen pass rewrites sin to cos: the numbers are cos's) and the Wrapper-IR
    pass before the memory plan sees no ``Free`` line, the one after it sees them."""
    from fxwrap_plugin_fixtures import reorders_passes as plugin
    a, b = torch.randn(12, 7), torch.randn(7, 9)
    manager = PluginManager([*installed_entry_points(), ep("reorders_passes")])
    pipeline = manager.session(manager.target("cpu")).pipeline
    assert pipeline.aten.names() == [
        "patterns", "follow input layouts", "constant folding", "channels-last convolutions", "matmul padding",
        "convolution bias", "grouped attention", "sin to cos", "after the rewrite"]
    assert pipeline.wrapper.names() == ["overlap collectives", "cpu attention", "before the plan", "memory plan",
                                        "after the plan"]
    reference = manager.session(manager.target("reference")).pipeline
    assert reference.aten.names() == ["follow input layouts", "constant folding", "channels-last convolutions",
                                      "matmul padding", "convolution bias", "patterns", "grouped attention"]
    assert reference.wrapper.names() == ["overlap collectives", "memory plan"]
    plugin.ran.clear()
    plugin.frees.clear()
    with use_plugin_manager(manager):
        torch._dynamo.reset()
        program = fxwrap.lower(_mm_sin, a, b, target="cpu", options={"cache": False, "templates": "off"})
    torch.testing.assert_close(program.run(a, b), torch.cos(a @ b).sum(0) * 2)
    assert plugin.ran == ["sin to cos", "after the rewrite"]
    assert plugin.frees["before the plan"] == 0 and plugin.frees["after the plan"] >= 1, plugin.frees
    assert "free(" in program.code()


def test_a_pass_list_without_the_memory_plan_names_the_plugin():
    manager = PluginManager([*installed_entry_points(), ep("drops_memory_plan")])
    with pytest.raises(PluginError, match=r"drops_memory_plan.*fxwrap_pipeline\(\) left a broken pipeline.*"
                                          r"lacks 'memory plan'"):
        manager.session(manager.target("cpu"))


def test_the_session_is_handed_what_it_needs_not_the_plugin_manager():
    from fxwrap.plugins.session import PluginFacts
    manager = load("alpha")
    session = manager.session(manager.target("alpha"))
    assert isinstance(session.plugins, PluginFacts)
    assert not any(isinstance(value, PluginManager) for value in vars(session).values())
    assert session.kernel_loader is manager.kernel_loader


def test_one_plugin_registers_two_targets_for_one_device_type():
    """Several targets per device type from one plugin (issue 38): both load, the default
    for the device is the highest priority, and either compiles when picked by name."""
    manager = PluginManager([*installed_entry_points(), ep("two_cpu_targets")]).load()
    assert manager.owner["twin_fast"] == manager.owner["twin_variant"] == named("two_cpu_targets")
    assert manager.target_for_device("cpu").name == "cpu"  # the built-in keeps priority 0
    x = torch.randn(6, 7)
    with use_plugin_manager(manager):
        for name in ("twin_fast", "twin_variant"):
            torch._dynamo.reset()
            program = fxwrap.lower(lambda t: (t.sin() * 2).sum(-1), x, target=name)
            assert program.target.name == name
            torch.testing.assert_close(program(x)[0], (x.sin() * 2).sum(-1))
