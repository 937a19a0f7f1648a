"""Re-inplacing: may a functional indexed write store into its ``self``'s storage?

AOTAutograd hands a mutation of a graph input over as a functional op and a write-back
at the end.  ``self.cache.index_copy_(1, pos, v)`` on a module buffer arrives as::

    index_put = aten.index_put.default(arg0_1, [None, arg1_1], arg2_1)
    sum_1 = aten.sum.dim_IntList(index_put, [1])
    copy_ = aten.copy_.default(arg0_1, index_put)        # the write-back

Eager would clone ``arg0_1``, write the row and copy the clone back: two passes over the
whole cache for one row.  Nothing reads ``arg0_1``'s old value after ``index_put``, and
the write-back puts ``index_put``'s value into ``arg0_1`` anyway, so the write may go
straight into ``arg0_1``: the program writes the row in place and the ``copy_`` has
nothing left to do (its source is its destination).

``refusal(node, order)`` says why not, or None when the write may go in place, from the
ATen graph alone (in program order, as the builders lower it):

* no node after ``node`` reads ``self``'s old value: no user of ``self`` or of a view of
  it (transitively) comes later, a graph output included, except the write-back;
* a graph input is written in place only where the graph writes it back anyway: a
  ``copy_(self, x)`` where ``x`` is ``node`` or made from it by further indexed writes
  each on the one before (``cache.index_copy_(...); cache.index_copy_(...)``), and none
  of those intermediate values is read after the write-back (it would read the final one).

What the storage is (an input of the program, a buffer the program allocated, or not its
own to write: a view, a constant, an extern's result) is the builder's to check
(``wrapper_ir.realization.Realizer.in_place_refusal``): this module sees only the graph.  This is the
decision Inductor's ``reinplace`` pass makes over its graph; fxwrap makes it where a
rule lowers the write (``core/rules/indexed_writes.py``).
"""
from __future__ import annotations

import torch
import torch.fx

from fxwrap.core import extern

aten = torch.ops.aten


def views_of(base: torch.fx.Node) -> list[torch.fx.Node]:
    """``base`` and every node that is a view of it, through chains of view ops, in
    discovery order (``base`` first)."""
    found = [base]
    seen = {base}
    for node in found:
        for user in node.users:
            if user not in seen and extern.is_view(user.target) and user.args and user.args[0] is node:
                seen.add(user)
                found.append(user)
    return found


def write_chain(node: torch.fx.Node, value) -> list[torch.fx.Node] | None:
    """The indexed writes from ``node`` to ``value`` (each one's ``self`` the one before;
    ``[node]`` when ``value`` is ``node``), or None when ``value`` is not made so."""
    chain = []
    while isinstance(value, torch.fx.Node):
        chain.append(value)
        if value is node:
            return list(reversed(chain))
        if extern.in_place_write(value.target) is None or not value.args:
            return None
        value = value.args[0]
    return None


def is_write_back(user: torch.fx.Node, base: torch.fx.Node, node: torch.fx.Node, order: dict) -> bool:
    """``user`` is ``copy_(base, x)`` with ``x`` made from ``node`` by indexed writes
    (``write_chain``), none of whose values before ``x`` is read after ``user``."""
    if user.target is not aten.copy_.default or len(user.args) < 2 or user.args[0] is not base:
        return False
    chain = write_chain(node, user.args[1])
    if chain is None:
        return False
    for link in chain[:-1]:
        if any(order[u] > order[user] for u in link.users):
            return False
    return True


def refusal(node: torch.fx.Node, order: dict) -> str | None:
    """Why indexed write ``node`` may not store into its ``self`` (``node.args[0]``) in
    place; None when it may.  ``order``: node -> position in the graph."""
    base = node.args[0] if node.args else None
    if not isinstance(base, torch.fx.Node):
        return "its self is not a value of the graph"
    at = order[node]
    written_back = False
    aliases = views_of(base)
    for alias in aliases:
        for user in alias.users:
            if user is node or order.get(user, -1) < at or user in aliases:  # a view reads nothing itself
                continue
            if is_write_back(user, base, node, order):
                written_back = True
                continue
            if user.op == "output":
                return f"{alias.name} (its old value) is a result of the program"
            return f"{user.name} reads {alias.name} (its old value) after the write"
    if base.op == "placeholder" and not written_back:
        return f"{base.name} is an input of the program that the program does not write"
    return None
