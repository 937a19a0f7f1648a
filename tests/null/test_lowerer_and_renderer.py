"""The compiler's middle is a lowerer and a renderer: the lowerer returns a frozen record, the
renderer reads only that record and the session; the lowerer's parts are composed, not mixed
in; a rule that declines leaves the lowerer as it was (``wrapper_ir.journal``)."""
import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxwrap
from fxwrap.ir.lines import Comment
from fxwrap.plugins.manager import get_plugin_manager
from fxwrap.wrapper_ir.build import build_lines, kernel_lowerer
from fxwrap.wrapper_ir.journal import Journal, JournaledCount, JournaledDict, JournaledList, JournaledSet
from fxwrap.wrapper_ir.lowered import LoweredProgram
from fxwrap.wrapper_ir.render import Renderer

PACKAGE = Path(fxwrap.__file__).parent
aten = torch.ops.aten


def _graph(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def _session():
    manager = get_plugin_manager()
    return manager.session(manager.target("cpu"))


def test_the_lowered_program_is_a_frozen_record_the_renderer_reads():
    gm = _graph(lambda x: (x * 3).sin().sum(0), torch.randn(4, 3))
    lowered = kernel_lowerer(gm, _session()).lower()
    assert isinstance(lowered, LoweredProgram) and isinstance(lowered.items, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lowered.items = ()
    for mapping in (lowered.buffers, lowered.roots, lowered.fake_values, lowered.template_externs):
        with pytest.raises(TypeError):
            mapping["buf99"] = None
    built = Renderer(lowered, _session(), fxwrap.core.logs.PhaseTimer("test")).render()
    assert [k.scheduled.name for k in built.kernels] == ["fxwrap_reduction_0"]


def test_a_declined_rule_leaves_the_lowerer_as_it_was(monkeypatch):
    """A rule that realizes its operand (a job, a buffer, a name) and emits a line, then gives
    up: the lowering is the one with no rule for the op (an extern call), to the buffer names."""
    gm = _graph(lambda x: (x * 3).sin() * 2, torch.randn(4, 3))
    session = _session()
    table = session.lowerings
    original = table.rule
    calls = []

    def stored_then_declined(ctx, x):
        calls.append(ctx.stored(x).buffer.name)
        ctx.emit(Comment("the declining rule ran here"))
        ctx.realized(ctx.map(lambda v: v, x))  # a second buffer and a job of its own
        return None

    def lowered_with(sin_rule):
        monkeypatch.setattr(table, "rule", lambda op: sin_rule if op is aten.sin.default else original(op))
        return kernel_lowerer(gm, session).lower()

    plain, declined = lowered_with(None), lowered_with(stored_then_declined)
    assert calls == ["buf0"]
    assert not any(isinstance(item, Comment) for item in declined.items)
    assert [repr(i) for i in declined.items] == [repr(i) for i in plain.items]
    assert (dict(declined.buffers), declined.next_name) == (dict(plain.buffers), plain.next_name)
    assert "sin" in repr([i for i in declined.items if type(i).__name__ == "CallExtern"])


def test_the_journal_undoes_in_order():
    journal = Journal()
    d, items, names, count = (JournaledDict(journal, {"a": 1, "b": 2}), JournaledList(journal, [1]),
                              JournaledSet(journal, {"x"}), JournaledCount(journal))
    count.take()
    journal.open()
    mark = journal.mark()
    del d["a"]
    d["c"] = 3
    d["b"] = 20
    items.append(2)
    del items[:]
    names.add("y")
    names.discard("x")
    assert count.take() == 1
    journal.undo_to(mark)
    journal.close()
    assert list(d.items()) == [("a", 1), ("b", 2)] and items == [1] and names == {"x"} and count.value == 1
    d["z"] = 0  # nothing recorded with the journal closed
    journal.undo_to(0)
    assert "z" in d


def test_an_extern_only_lowering_is_the_same_lowerer_without_rules():
    gm = _graph(lambda x, w: torch.relu(x @ w), torch.randn(8, 4), torch.randn(4, 16))
    built = build_lines(gm, "cpu")
    assert [type(line).__name__ for line in built.lines] == ["Allocate", "CallExtern", "CallExtern", "Return"]
    assert built.lines[1].op is aten.mm.out and built.kernels == []


def _classes():
    """Every class under fxwrap/: name -> (path, base names, attributes it assigns through
    ``self.x = ...``, attributes it reads through ``self.x``, names its body defines)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            assigned, read, defined = set(), set(), set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else \
                    [item.target] if isinstance(item, ast.AnnAssign) else []
                for target in targets:
                    defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            for sub in ast.walk(node):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    (assigned if isinstance(sub.ctx, ast.Store) else read).add(sub.attr)
            bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                     for b in node.bases]
            found[(path.relative_to(PACKAGE).as_posix(), node.name)] = (bases, assigned, read, defined)
    return found


def _hierarchy_state_reads(where: str) -> list[str]:
    classes = _classes()
    by_name: dict[str, list] = {}
    for (path, name), info in classes.items():
        by_name.setdefault(name, []).append(info)

    def ancestors(name, seen):
        for bases, *_ in by_name.get(name, []):
            for base in bases:
                if base and base not in seen:
                    seen.add(base)
                    ancestors(base, seen)
        return seen

    bad = []
    for (path, name), (bases, assigned, read, defined) in classes.items():
        if not path.startswith(where):
            continue
        descendants = {n for n in by_name if name in ancestors(n, set())}
        family = ancestors(name, set()) | descendants
        for d in descendants:
            family |= ancestors(d, set())
        family.discard(name)
        theirs = {attr for other in family for _, assigns, _, _ in by_name.get(other, []) for attr in assigns}
        stray = sorted(a for a in read if a in theirs and a not in assigned and a not in defined)
        if stray:
            bad.append(f"{path}:{name} reads {stray}")
    return bad


def test_no_class_reads_state_another_class_of_its_hierarchy_sets():
    """(KernelBuilder's mixins read each other's state: RealizationMixin read ``items``,
    ``buffers``, ``env``, ``roots``... that ``_Builder`` and ``KernelBuilder`` set; the emitters
    read the ``target`` that ``KernelEmitter`` sets, ``LookbackScanWriter`` and ``GemvWriter`` the
    ``k``/``plan``/``int64`` of the writers they extended, ``DriverLauncher`` what
    ``CompiledLauncher`` bound, ``MetalRed`` the ``ReductionAccumulator``'s states.)"""
    found = _hierarchy_state_reads("")
    assert not found, found
    mixins = [name for (path, name) in _classes() if "Mixin" in name]
    assert not mixins, mixins


def test_nested_programs_and_user_kernels_reach_the_lowerer_through_its_protocol_only():
    """(``build_control_flow`` and ``build_user_kernels`` read ``builder.out``, ``builder.env``,
    ``builder.roots``, ``builder.foreign``, ``builder.order``: the builder's raw members.)"""
    from fxwrap.wrapper_ir.nesting import NestedLowering
    declared = {name for name in vars(NestedLowering) if not name.startswith("_")} | \
        set(NestedLowering.__annotations__)
    for module in ("build_control_flow.py", "build_user_kernels.py"):
        tree = ast.parse((PACKAGE / "wrapper_ir" / module).read_text())
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "builder"}
        assert used and used <= declared, f"{module} reaches the lowerer's {sorted(used - declared)}"
    from fxwrap.wrapper_ir.lowerer import Lowerer
    lowerer = kernel_lowerer(_graph(lambda x: x.sin(), torch.randn(3)), _session())
    assert isinstance(lowerer, Lowerer) and all(hasattr(lowerer, name) for name in declared)
