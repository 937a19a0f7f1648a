"""A lowering rule reaches the kernel builder through a declared interface only
(``fxwrap.core.building.RuleBuilder``), and the kernel builder is split by concern."""
import ast
import re
from pathlib import Path

import torch

import fxwrap
from fxwrap.core.building import RuleBuilder
from fxwrap.core.lowering import LoweringContext, Loops, Stored
from fxwrap.wrapper_ir.build_kernels import KernelBuilder

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
BUILDER_MODULES = {"build.py", "build_kernels.py", "build_realize.py", "build_render.py", "build_templates.py",
                   "build_provenance.py"}


def test_no_module_calls_a_private_member_of_the_builder():
    """(``build_user_kernels`` called ``builder._materialize_before_write``: now the public
    ``write_barrier``, the one a rule's context calls too.)"""
    pattern = re.compile(r"\bbuilder\(?\)?\._[a-z]\w*\(")
    bad = [f"{p.relative_to(PACKAGE)}: {m.group(0)}" for p in sorted(PACKAGE.rglob("*.py"))
           if not (p.parent.name == "wrapper_ir" and p.name in BUILDER_MODULES)
           for m in pattern.finditer(p.read_text())]
    assert not bad, bad


def test_the_kernel_builder_implements_the_protocol_and_is_split_by_concern():
    for name in PROTOCOL:
        assert callable(getattr(KernelBuilder, name)), name
    homes = {"realize": "build_realize", "pointwise_job": "build_realize", "in_memory": "build_realize",
             "reduction": "build_realize", "computed_by": "build_provenance", "job_origins": "build_provenance",
             "_template_or_extern": "build_templates", "run": "build_render", "kernel_lines": "build_render",
             "call_function": "build_kernels"}
    for name, module in homes.items():
        assert getattr(KernelBuilder, name).__module__ == f"fxwrap.wrapper_ir.{module}", name


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
