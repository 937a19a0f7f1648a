"""Provenance: which ATen nodes, source lines and modules a kernel or extern call computes.

Every ``CallKernel`` and ``CallExtern`` line carries ``origins``, a tuple of ``Origin``
(all the ATen nodes a fused kernel computes, in program order), and every FX node such
a line produces has the same tuple in ``node.meta["fxwrap_origins"]``.  For::

    class Block(nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(self.fc1(x)) * 2      # model.py:41

the fused GELU kernel's origins are ``mul, mul_1, erf, add, mul_2, mul_3``, each an
``Origin("mul_1", "aten.mul.Tensor", "model.py:41", "forward", "fc1")``, and
``describe(origins)`` reads ``mul, mul_1, erf, add, mul_2, mul_3 (model.py:41 in forward, fc1)``.

``origin_of(node)`` reads an ATen FX node's ``stack_trace`` (the innermost user frame,
which dynamo records and AOTAutograd keeps on every ATen node it traces, forward and
backward) and ``nn_module_stack`` (a backward node has ``fwd_nn_module_stack`` instead:
AOTAutograd copies the forward node's stack and trace to the backward nodes it derives
from it through ``seq_nr``, so a gradient kernel names the forward line it differentiates).

Plain data in the runtime layer (a saved GraphModule carries it in its nodes' meta, and
loading one must import no compiler module): it imports no other fxwrap module.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Origin:
    """One ATen node a line computes, and where in the user's program it came from.

    ``Origin(node="mul_3", target="aten.mul.Tensor", location="model.py:41",
    function="forward", module_path="layers.0.mlp.fc1", file="/home/me/model.py")``;
    ``location``/``function``/``file`` are None without a ``stack_trace``,
    ``module_path`` is None outside any ``nn.Module`` (and "" for the root module);
    ``file`` is the full path of ``location``'s file, ``stack_trace`` the node's own.
    """

    node: str
    target: str
    location: str | None = None
    function: str | None = None
    module_path: str | None = None
    file: str | None = None
    stack_trace: str | None = field(default=None, compare=False, repr=False)  # the node's own, as recorded

    def __str__(self) -> str:
        return f"{self.node}: {self.target}"


_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<function>.+)$')


def user_frame(stack_trace: str | None) -> tuple[str, int, str] | None:
    """``(file, line, function)`` of the innermost frame of a ``stack_trace``."""
    if not stack_trace:
        return None
    for line in reversed(stack_trace.splitlines()):
        found = _FRAME.match(line)
        if found:
            return found["file"], int(found["line"]), found["function"].strip()
    return None


_ROOT = re.compile(r"^[LG]\[['\"][^'\"]*['\"]\]")
_MODULES_ITEM = re.compile(r"\._modules\[['\"]([^'\"]*)['\"]\]")
_ITEM = re.compile(r"\[['\"]?([^'\"\]]*)['\"]?\]")


def module_path(nn_module_stack) -> str | None:
    """The innermost module of an ``nn_module_stack`` as a dotted path from the root
    module: ``"L['self'].layers[0]._modules['mlp'].fc1"`` -> ``"layers.0.mlp.fc1"``."""
    if not nn_module_stack:
        return None
    entry = list(nn_module_stack.values())[-1]
    path = entry[0] if isinstance(entry, tuple) else str(entry)
    path = _ROOT.sub("", str(path))
    path = _MODULES_ITEM.sub(lambda m: "." + m[1], path)
    path = _ITEM.sub(lambda m: "." + m[1], path)
    return path.lstrip(".")


def op_text(target) -> str:
    """``aten.mul.Tensor`` for an ATen overload, the function's name for anything else."""
    if hasattr(target, "_schema") and hasattr(target, "_overloadname"):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    return getattr(target, "__name__", None) or str(target)


def origin_of(node) -> Origin:
    """The ``Origin`` of an ATen ``torch.fx.Node`` (from its ``meta``)."""
    meta = node.meta
    frame = user_frame(meta.get("stack_trace"))
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    location = function = file = None
    if frame is not None:
        file, line, function = frame
        location = f"{os.path.basename(file)}:{line}"
    return Origin(node.name, op_text(node.target), location, function, module_path(stack), file,
                  meta.get("stack_trace"))


def as_origin(item) -> Origin:
    """An ``Origin``, or one made from the text ``"mul_3: aten.mul.Tensor"`` (a hand-made
    ``ScheduledKernel``'s origins)."""
    if isinstance(item, Origin):
        return item
    node, _, target = str(item).partition(":")
    return Origin(node.strip(), target.strip())


def _unique(items: Iterable) -> list:
    return list(dict.fromkeys(i for i in items if i is not None))


def describe(origins: tuple[Origin, ...]) -> str:
    """One short line: ``mul_3, add_2 (model.py:41 in forward, layers.0.mlp)``.

    The node names, then each distinct source location and module path (at most three
    of each; ``+N`` says how many more)."""
    if not origins:
        return "(no ATen origin recorded)"
    origins = tuple(as_origin(o) for o in origins)
    names = ", ".join(_unique(o.node for o in origins))
    places = _unique(f"{o.location} in {o.function}" if o.function else o.location for o in origins)
    modules = _unique(o.module_path or None for o in origins)
    where = _at_most(places, 3) + _at_most(modules, 3)
    return f"{names} ({', '.join(where)})" if where else names


def _at_most(items: list[str], n: int) -> list[str]:
    return items if len(items) <= n else [*items[:n], f"+{len(items) - n}"]


def header_lines(origins: tuple[Origin, ...]) -> list[str]:
    """The provenance lines of a kernel's source header: the nodes and their ops, then
    each source place (location, function, module), with the nodes from it when there
    is more than one place::

        from: mul, erf, add, mul_1 (aten.mul.Tensor, aten.erf.default, aten.add.Tensor)
          mul, erf, add: model.py:41 in forward [layers.0.mlp.act]
          mul_1: model.py:42 in forward
    """
    if not origins:
        return ["from: (no ATen origin recorded)"]
    origins = tuple(as_origin(o) for o in origins)
    ops = ", ".join(_unique(o.target or None for o in origins))
    lines = [f"from: {', '.join(_unique(o.node for o in origins))}" + (f" ({ops})" if ops else "")]
    places: dict[tuple, list[str]] = {}
    for o in origins:
        if o.location or o.module_path:
            places.setdefault((o.location, o.function, o.module_path), []).append(o.node)
    for (location, function, module), nodes in places.items():
        text = (location or "") + (f" in {function}" if location and function else "")
        text += f" [{module}]" if module else ""
        lines.append(f"  {', '.join(nodes)}: {text.strip()}" if len(places) > 1 else f"  {text.strip()}")
    return lines
