"""Errors shared by the compiler's layers and the targets."""
from __future__ import annotations


class EmitError(NotImplementedError):
    """A kernel an emitter cannot render; names the op, the target and a way out.

    The renderer turns it into ``wrapper_ir.render.RenderFailed`` and the graph is lowered
    again with the kernel's ATen nodes as extern calls, so an emitter raises it for anything
    it does not render rather than emit wrong code::

        raise EmitError("op 'erf' has no rendering on target 'arena': add it to "
                        "ArenaEmitter.code_for_op or leave aten.erf an extern")
    """


def compiler_crashed(error: BaseException) -> bool:
    """Whether ``error`` says the host compiler crashed on one kernel's source (an internal
    compiler error, or a compiler killed by a signal; a target's error sets
    ``compiler_crashed = True``): a bug of the compiler, not of the source.  The graph is
    lowered again with that kernel's ATen nodes as extern calls (warned); a compiler
    that fails on every source (missing, or a source it rejects) still fails the compile."""
    return bool(getattr(error, "compiler_crashed", False))


class UnsupportedUserKernel(RuntimeError):
    """A user-written Triton kernel (``kernel[grid](...)``, ``torch.library.triton_op``) that a
    program cannot launch: names the kernel, the target and what to do.  Not an ``EmitError``:
    there is no extern call to fall back to."""
