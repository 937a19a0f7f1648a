"""The compile as one declared list (``fxwrap.core.pipeline``): ``repr(session.pipeline)``
names every stage in order with its passes, a plugin extends it at named points through
the one hook ``fxwrap_pipeline``, and the old ``fxwrap_wrapper_passes`` is an adapter onto it."""
from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.core.passes import GraphPass, LinesPass
from fxwrap.core.pipeline import Stage
from fxwrap.ir.lines import Comment, Return
from fxwrap.plugins.manager import PluginError, PluginManager, installed_entry_points, use_plugin_manager
from fxwrap.wrapper_ir.stages import default_pipeline

STAGES = ["capture", "aten passes", "program cache", "lowering", "render", "wrapper passes", "fx", "program"]


@pytest.fixture(autouse=True)
def fixtures_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def ep(module: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(module, f"fxwrap_plugin_fixtures.{module}", group="fxwrap")


def stage_lines(pipeline) -> list[str]:
    text = repr(pipeline)
    print(text)
    lines = text.splitlines()
    assert lines[0] == "Pipeline(" and lines[-1] == ")"
    return lines[1:-1]


def test_the_session_pipeline_prints_every_stage_in_order_with_its_passes():
    manager = PluginManager().load()
    lines = stage_lines(manager.session(manager.target("cpu")).pipeline)
    assert [re.match(r"  (\S+(?: \S+)?)\s{2,}", line).group(1) for line in lines] == STAGES
    by_stage = dict(zip(STAGES, lines))
    assert by_stage["aten passes"].endswith(
        "graph -> graph: [follow input layouts, constant folding, channels-last convolutions, matmul padding, "
        "convolution bias, patterns, grouped attention]")
    # the cpu target's plugin puts its attention pass before the memory plan
    assert by_stage["wrapper passes"].endswith(
        "built -> lines, memory: [overlap collectives, cpu attention, memory plan]")
    assert by_stage["render"].endswith("lowered -> built: fuse, combine, kernels, legalize, emit, compile, choose")


def test_the_options_edit_the_pipeline_through_the_same_hook():
    """fxwrap's debug modes are a plugin on ``fxwrap_pipeline``: ``check_nan`` adds its pass
    last, to the session configured with it only."""
    manager = PluginManager().load()
    session = manager.session(manager.target("cpu"))
    checked = session.configured(fxwrap.plugins.session.CompileOptions(check_nan=True))
    assert checked.pipeline.wrapper.names() == ["overlap collectives", "cpu attention", "memory plan", "check nan"]
    assert session.pipeline.wrapper.names() == ["overlap collectives", "cpu attention", "memory plan"]


def _mm_relu(a, b):
    return torch.relu(a @ b) * 2


def test_a_plugin_extends_the_pipeline_at_named_points_and_each_runs_there():
    from fxwrap_plugin_fixtures import stage_at_named_points as plugin
    manager = PluginManager([*installed_entry_points(), ep("stage_at_named_points")])
    pipeline = manager.session(manager.target("cpu")).pipeline
    assert [s.name for s in pipeline.stages] == [*STAGES[:5], "count kernels", *STAGES[5:], "after program"]
    assert pipeline.aten.names().index("after padding") == pipeline.aten.names().index("matmul padding") + 1
    assert pipeline.wrapper.names()[-2:] == ["before plan", "memory plan"]
    plugin.seen.clear()
    a, b = torch.randn(12, 7), torch.randn(7, 9)
    with use_plugin_manager(manager):
        torch._dynamo.reset()
        program = fxwrap.lower(_mm_relu, a, b, target="cpu", options={"cache": False, "templates": "off"})
    torch.testing.assert_close(program.run(a, b), _mm_relu(a, b))
    # each ran once, in pipeline order, and saw what the stages before it gave and no more
    assert plugin.seen == [("after padding", "inference"),
                           ("count kernels", True, True, True),
                           ("before plan", 0, True),
                           ("fx replaced", True),
                           ("after program", "inference")], plugin.seen


def test_a_broken_pipeline_names_the_stage_and_the_plugin_edit():
    pipeline = default_pipeline()
    pipeline.insert_before("lowering", Stage("too early", lambda c, s: None, ("lines",), ("lines",)))
    with pytest.raises(ValueError, match=r"stage 'too early' takes \['lines'\], which no stage before it gives"):
        pipeline.check("cpu")
    pipeline = default_pipeline()
    with pytest.raises(KeyError, match=r"no pass named 'no such pass'"):
        pipeline.insert_after("no such pass", GraphPass("x", lambda graph: None))
    pipeline.insert_after("patterns", LinesPass("lines pass among graph passes", lambda lines, program: lines))
    with pytest.raises(TypeError, match=r"stage 'aten passes' holds LinesPass"):
        pipeline.check("cpu")
    pipeline = default_pipeline()
    pipeline.insert_after("fx", Stage("memory plan", lambda c, s: None, ("graph",), ("graph",)))
    with pytest.raises(ValueError, match=r"names 'memory plan' twice"):
        pipeline.check("cpu")


def test_the_old_wrapper_passes_hook_is_an_adapter_onto_the_pipeline():
    """``fxwrap_wrapper_passes`` (deprecated) still runs: its passes are appended to the
    ``wrapper passes`` stage, after the memory plan, with a DeprecationWarning naming the plugin."""
    from fxwrap_plugin_fixtures import drop_comments
    manager = PluginManager([*installed_entry_points(), ep("drop_comments")])
    with pytest.warns(DeprecationWarning, match=r"plugin 'drop_comments' .*fxwrap_wrapper_passes is deprecated"):
        pipeline = manager.session(manager.target("cpu")).pipeline
    assert pipeline.wrapper.names() == ["overlap collectives", "cpu attention", "memory plan", "drop_comments"]
    lines = [Comment("dropped"), Return(())]
    assert pipeline.wrapper[-1].run(lines, None) == drop_comments.drop_comments(lines) == [Return(())]


def test_the_pipeline_shown_in_adding_a_device_is_the_cpu_targets():
    doc = (Path(fxwrap.__file__).resolve().parent.parent / "docs" / "adding-a-device.md").read_text()
    shown = re.search(r"```\n(Pipeline\(\n.*?\n\))\n```", doc, flags=re.S).group(1)
    manager = PluginManager().load()
    assert shown == repr(manager.session(manager.target("cpu")).pipeline)
