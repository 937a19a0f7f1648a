"""The op-to-code walk every kernel emitter shares: loop-IR values -> declared locals.

``ValueWalker.value(scope, op)`` returns the local holding ``op``, declaring first every
node of ``op`` not yet declared (operands first, each distinct ``Op`` once: CSE for free),
each in its *home*: the outermost enclosing scope where every loop variable and reduction
result it uses exists, so loop invariants are hoisted out of inner loops.  A target says,
through the ``value_*`` hooks, where a value's home is, how each kind of node renders and
how a declaration reads.  ``relu(x) * 2`` in C (``targets/cstyle.py``) and in Triton
(``targets/cuda_triton/codegen.py``)::

    const float tmp0 = in_ptr0[x0];          tmp0 = tl.load(in_ptr0 + (x0), xmask)
    const float tmp2 = fx_max(tmp0, tmp1);   tmp2 = _fx_max(tmp0, tmp1)
    const float tmp4 = tmp2 * tmp3;          tmp4 = (tmp2 * tmp3)

A scope is any object with ``lookup(op) -> (local, dtype) | None``, a dict ``env`` (op ->
``(local, dtype)``) and a list ``lines`` of the declarations made in it.
"""
from __future__ import annotations

import torch

from fxwrap.ir.loops import Op, OpCode, walk


class ValueWalker:
    """The shared walk (``value``) over a target's hooks (``value_*``)."""

    def value(self, scope, op: Op) -> str:
        """The local holding ``op`` (declared on first use, operands first)."""
        for node in walk(op):
            if scope.lookup(node) is None:
                self._declare_value(scope, node)
        return scope.lookup(op)[0]

    def _declare_value(self, scope, op: Op) -> None:
        home = self.value_home(scope, op)
        if op.op == OpCode.ACC:
            text, is_local = self.value_acc(home, op)
            if is_local:  # already a local of the op's dtype: no copy
                home.env[op] = (text, op.dtype)
                return
            expr = text
        elif op.op == OpCode.LOAD:
            expr = self.value_load(home, op)
        elif op.op == OpCode.CONST:
            expr = self.value_const(op)
        elif op.op == OpCode.INDEX:
            expr = self.value_index(op)
        else:
            kids = [home.lookup(c) for c in op.src]
            expr = self.value_op(op, [k[0] for k in kids], [k[1] for k in kids])
        name = self.value_local(home)
        home.lines.append(self.value_declaration(name, op.dtype, expr))
        home.env[op] = (name, op.dtype)

    # ------------------------------------------------------------------ hooks
    def value_home(self, scope, op: Op):
        """The outermost scope of ``scope``'s chain where everything ``op`` needs exists."""
        raise NotImplementedError

    def value_acc(self, home, op: Op) -> tuple[str, bool]:
        """A reduction result read by ``op``: ``(local, True)`` where its bound local already
        has ``op``'s dtype, else ``(expression converting it, False)``."""
        raise NotImplementedError

    def value_load(self, home, op: Op) -> str:
        raise NotImplementedError

    def value_const(self, op: Op) -> str:
        raise NotImplementedError

    def value_index(self, op: Op) -> str:
        raise NotImplementedError

    def value_op(self, op: Op, args: list[str], arg_dtypes: list[torch.dtype]) -> str:
        raise NotImplementedError

    def value_local(self, home) -> str:
        """A fresh local name."""
        raise NotImplementedError

    def value_declaration(self, name: str, dtype: torch.dtype, expr: str) -> str:
        raise NotImplementedError
