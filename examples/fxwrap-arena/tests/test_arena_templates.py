"""The arena's own GEMM template (``fxwrap_arena.gemm.ArenaBlockedGemm``, registered through
``fxwrap_templates``) against fxwrap's template conformance tests, plus the choice
between it and the ATen call under ``templates="auto"``."""
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.testing.templates import TemplateConformance
from fxwrap.ir.lines import TemplateChoice
from fxwrap.wrapper_ir.template_choice import TEMPLATE_MIN_GAIN


class TestArenaGemmConformance(TemplateConformance):
    target = "arena"
    template = "arena_blocked_gemm"
    dtypes = (torch.float32,)
    ops = ("mm", "addmm")


def test_registered_through_the_hook_for_the_arena_only():
    manager = get_plugin_manager()
    arena = [t.name for t in manager.session(manager.target("arena")).templates]
    cpu = [t.name for t in manager.session(manager.target("cpu")).templates]
    assert arena == ["arena_blocked_gemm"] and "arena_blocked_gemm" not in cpu


def test_auto_keeps_the_faster_and_says_so():
    programs: list = []
    fn = lambda x, w, b: torch.relu(F.linear(x, w, b))  # noqa: E731
    c = torch.compile(fn, backend=fxwrap.Backend("arena", {"templates": "auto", "on_program": programs.append}))
    x, w, b = torch.randn(48, 64), torch.randn(80, 64), torch.randn(80)
    torch.testing.assert_close(c(x, w, b), fn(x, w, b), atol=1e-4, rtol=1e-4)
    (choice,) = [ln for p in programs for ln in p.lines if isinstance(ln, TemplateChoice)]
    times = dict(choice.times)
    assert set(times) == {"arena_blocked_gemm", "extern"}
    faster = times["arena_blocked_gemm"] < times["extern"] * (1 - TEMPLATE_MIN_GAIN)
    assert choice.chosen == ("arena_blocked_gemm" if faster else "extern")
