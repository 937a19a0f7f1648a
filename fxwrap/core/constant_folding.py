"""Values that depend on no input are computed once, when the program is built, not on every call.

A model's tensor constants (``torch.tensor([...])`` in its code: a ``get_attr`` of the lifted
constant and an ``aten.lift_fresh_copy`` of it) and what it computes from them and from
factory calls alone are the same on every call.  Swin's shifted-window attention mask is
``new_zeros((H, W))``, nine slice assignments of a ``torch.tensor`` count, a view, a
difference and two ``masked_fill``s: written by kernels and copies on every call (45
``lift_fresh_copy`` a call in swin_t).  ``fold_constants(gm)`` evaluates such a subgraph
once with real tensors and makes the values its other nodes read constants of the program::

    full = aten.full([8, 8], 0)
    _tensor_constant0 = self._tensor_constant0
    lift_fresh_copy = aten.lift_fresh_copy(_tensor_constant0)
    copy = aten.copy(aten.slice(aten.slice(full, 0, 0, -4), 1, 0, -4), lift_fresh_copy)
    ...
    where_1 = aten.where(eq, scalar_tensor_1, where)        # [4, 16, 16]
    add_2 = aten.add(view_9, aten.unsqueeze(where_1, 0))

becomes::

    _fxwrap_folded0 = self._fxwrap_folded0                    # where_1's value, computed once
    add_2 = aten.add(view_9, aten.unsqueeze(_fxwrap_folded0, 0))

What stays as it was:

* a subgraph of index generators and pointwise math alone (``arange``, ``full``, ``add``,
  ``fmod``: a roll's indices): a kernel computes it from its index for free, and the
  index expression is what proves a gather in range (``core/rules/indexing.py``);
* a value the program returns, or a view of one: the caller may write into its result;
* symbolic sizes, random or in-place ops, ``empty``, and values above ``MAX_BYTES``.
"""
from __future__ import annotations

import logging

import torch
import torch.fx
from torch.utils._python_dispatch import _disable_current_modes

from fxwrap.core.extern import is_mutating, is_view
from fxwrap.runtime.layout import is_non_overlapping_and_dense

log = logging.getLogger("fxwrap.layout")
aten = torch.ops.aten

MAX_BYTES = 16 << 20  # a folded value above this is computed per call (program constants are kept alive)

# factory calls a kernel computes from its index alone
_GENERATORS = {aten.arange.default, aten.arange.start, aten.arange.start_step, aten.full.default,
               aten.scalar_tensor.default, aten.zeros.default, aten.ones.default, torch.ops.prims.iota.default,
               aten.full_like.default, aten.zeros_like.default, aten.ones_like.default}
_NEVER = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
          aten.empty_permuted.default}


def _static_tensor(val) -> bool:
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in (*val.shape, *val.stride())) \
        and isinstance(val.storage_offset(), int)


def _pure(node: torch.fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target in _NEVER or is_mutating(target):
        return False
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded not in tags and torch.Tag.dynamic_output_shape not in tags \
        and torch.Tag.data_dependent_output not in tags


def _cheap(node: torch.fx.Node) -> bool:
    """A node a kernel computes from its index as cheaply as it reads a constant."""
    target = node.target
    return target in _GENERATORS or is_view(target) or target is aten.expand.default \
        or torch.Tag.pointwise in getattr(target, "tags", ())


def _returned_aliases(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The graph's outputs and every node they are views of."""
    output = next(n for n in graph.nodes if n.op == "output")
    todo = [a for a in output.all_input_nodes]
    seen: set[torch.fx.Node] = set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_function" and (is_view(node.target) or node.target is aten.lift_fresh_copy.default):
            todo.extend(node.all_input_nodes)
    return seen


def fold_constants(gm: torch.fx.GraphModule) -> int:
    """Rewrite ``gm`` in place as the module docstring says; the number of values folded."""
    graph = gm.graph
    returned = _returned_aliases(graph)
    constant: dict[torch.fx.Node, bool] = {}  # foldable node -> whether its subgraph is worth folding
    for node in graph.nodes:
        if node.op == "get_attr":
            if isinstance(getattr(gm, node.target, None), torch.Tensor) and node not in returned:
                constant[node] = True
            continue
        if node.op != "call_function" or node in returned or not _pure(node):
            continue
        if not _static_tensor(node.meta.get("val")) or not all(n in constant for n in node.all_input_nodes):
            continue
        constant[node] = not _cheap(node) or any(constant[n] for n in node.all_input_nodes)
    frontier = [n for n in constant if n.op == "call_function" and constant[n]
                and any(user not in constant for user in n.users)]
    if not frontier:
        return 0
    values: dict[torch.fx.Node, torch.Tensor] = {}
    folded = 0
    with _disable_current_modes(), torch.no_grad():
        for node in constant:  # program order
            if node.op == "get_attr":
                values[node] = getattr(gm, node.target)
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
            values[node] = node.target(*args, **kwargs)
        for node in frontier:
            value, val = values[node], node.meta["val"]
            if value.nbytes > MAX_BYTES or value.stride() != val.stride() or value.dtype != val.dtype:
                continue
            name = f"_fxwrap_folded{folded}"
            while hasattr(gm, name):
                name += "_"
            if value._base is not None:  # a view: a storage of its own, in the value's layout
                if not is_non_overlapping_and_dense(value.shape, value.stride()):
                    continue
                value = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                            device=value.device).copy_(value)
            gm.register_buffer(name, value, persistent=False)
            with graph.inserting_before(node):
                attr = graph.get_attr(name)
            attr.meta.update({k: v for k, v in node.meta.items()})
            node.replace_all_uses_with(attr, delete_user_cb=lambda user: user not in constant)
            folded += 1
    if folded:
        graph.eliminate_dead_code()
        graph.lint()
        gm.recompile()
        log.info("constant folding: %d value(s) computed once, when the program is built", folded)
    return folded
