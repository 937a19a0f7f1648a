"""Errors shared by the compiler's layers and the targets."""
from __future__ import annotations


class EmitError(NotImplementedError):
    """A kernel an emitter cannot render; names the op, the target and a way out.

    The kernel builder catches it and keeps the kernel's ATen nodes as extern calls, so
    an emitter raises it for anything it does not render rather than emit wrong code::

        raise EmitError("op 'erf' has no rendering on target 'arena': add it to "
                        "ArenaEmitter.code_for_op or leave aten.erf an extern")
    """


class UnsupportedUserKernel(RuntimeError):
    """A user-written Triton kernel (``kernel[grid](...)``, ``torch.library.triton_op``) that a
    program cannot launch: names the kernel, the target and what to do.  Not an ``EmitError``:
    there is no extern call to fall back to."""
