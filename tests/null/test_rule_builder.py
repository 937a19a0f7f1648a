"""A lowering rule reaches the lowerer through a declared interface only
(``fxwrap.core.building.RuleBuilder``), and the lowerer is split by concern into classes
composed into it."""
import ast
import re
from pathlib import Path

import torch

import fxwrap
from fxwrap.core.building import RuleBuilder
from fxwrap.core.lowering import LoweringContext, Loops, Stored
from fxwrap.wrapper_ir.lowerer import Lowerer
from fxwrap.wrapper_ir.origins import Origins
from fxwrap.wrapper_ir.realization import Realizer
from fxwrap.wrapper_ir.render import Renderer
from fxwrap.wrapper_ir.rule_lowering import RuleLowering
from fxwrap.wrapper_ir.template_recognition import TemplateRecognizer

PACKAGE = Path(fxwrap.__file__).parent
PROTOCOL = {name for name in vars(RuleBuilder) if not name.startswith("_")}


def _builder_members_read(path: Path) -> set[str]:
    """``x`` of every ``builder.x`` / ``self._builder().x`` / ``ctx.builder.x`` in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id == "builder") or \
                (isinstance(owner, ast.Call) and ast.unparse(owner.func).endswith("_builder")) or \
                (isinstance(owner, ast.Attribute) and owner.attr == "builder"):
            found.add(node.attr)
    return found


def test_core_reaches_the_builder_through_the_protocol_only():
    assert PROTOCOL == {"in_memory", "new_buffer", "realize", "pointwise_job", "emit", "write_barrier",
                        "indexed_stores", "in_place_refusal", "indexed_write_target", "indexed_job",
                        "reads_storage", "same_storage", "value_of"}
    for path in sorted((PACKAGE / "core").rglob("*.py")):
        stray = _builder_members_read(path) - PROTOCOL
        assert not stray, f"{path.relative_to(PACKAGE)} reaches the builder's {sorted(stray)} outside RuleBuilder"


# the builder's own modules (a builder may call its own kind's private members)
BUILDER_MODULES = {"build.py", "lowerer.py", "rule_lowering.py", "realization.py", "render.py",
                   "template_recognition.py", "origins.py"}


def test_no_module_calls_a_private_member_of_the_builder():
    """(``build_user_kernels`` called ``builder._materialize_before_write``: now the public
    ``write_barrier``, the one a rule's context calls too.)"""
    pattern = re.compile(r"\bbuilder\(?\)?\._[a-z]\w*\(")
    bad = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in sorted(PACKAGE.rglob("*.py"))
           if not (p.parent.name == "wrapper_ir" and p.name in BUILDER_MODULES)
           for m in pattern.finditer(p.read_text())]
    assert not bad, bad


def test_the_realizer_implements_the_protocol_and_each_concern_is_a_class_of_its_own():
    for name in PROTOCOL:
        assert callable(getattr(Realizer, name)), name
    homes = {(Realizer, "realize"): "realization", (Realizer, "pointwise_job"): "realization",
             (Realizer, "in_memory"): "realization", (Realizer, "reduction"): "realization",
             (Origins, "computed_by"): "origins", (Origins, "job_origins"): "origins",
             (TemplateRecognizer, "lower"): "template_recognition", (Renderer, "render"): "render",
             (Renderer, "kernel_lines"): "render", (RuleLowering, "lower"): "rule_lowering",
             (Lowerer, "call_function"): "lowerer"}
    for (cls, name), module in homes.items():
        assert getattr(cls, name).__module__ == f"fxwrap.wrapper_ir.{module}", name
    for cls in (Lowerer, RuleLowering, Realizer, TemplateRecognizer, Origins, Renderer):
        assert cls.__bases__ == (object,), f"{cls.__name__} is composed, not mixed: bases {cls.__bases__}"


class _StubBuilder:
    """Only the protocol: what a context needs to store an operand and emit a job."""

    def __init__(self, buffer):
        self.buffer, self.jobs = buffer, []

    def in_memory(self, node, value):
        return self.buffer if value == "lazy x" else None

    def new_buffer(self, fake):
        return self.buffer

    def realize(self, node, loops):
        return self.buffer

    def pointwise_job(self, buffer, loops, origins):
        self.jobs.append((buffer, tuple(origins)))

    def emit(self, line):
        raise AssertionError("not called")

    def write_barrier(self, node):
        raise AssertionError("not called")


def test_a_context_runs_on_any_rule_builder():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4, 3)
    node = graph.call_function(torch.ops.aten.sin.default, (x,))
    node.meta["val"] = torch.empty(4, 3)
    from fxwrap.ir.lines import Buffer
    from fxwrap.ir.symbolic import to_exprs
    buf = Buffer("buf0", to_exprs((4, 3)), to_exprs((3, 1)), torch.float32, torch.device("cpu"))
    ctx = LoweringContext(node, torch.device("cpu"))
    ctx.builder = _StubBuilder(buf)
    assert ctx.stored("lazy x") == Stored(buf)
    ctx.store_into(buf, Loops((4, 3), torch.float32, torch.device("cpu"), lambda i: None))
    assert ctx.builder.jobs == [(buf, (node.name,))]
