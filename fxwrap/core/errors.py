"""Errors shared by the compiler's layers and the targets."""
from __future__ import annotations


class EmitError(NotImplementedError):
    """A kernel an emitter cannot render; names the op, the target and a way out.

    The kernel builder catches it and keeps the kernel's ATen nodes as extern calls, so
    an emitter raises it for anything it does not render rather than emit wrong code::

        raise EmitError("op 'erf' has no rendering on target 'arena': add it to "
                        "ArenaEmitter.code_for_op or leave aten.erf an extern")
    """
