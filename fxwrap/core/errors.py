"""Errors shared by the compiler's layers and the targets."""
from __future__ import annotations


class EmitError(NotImplementedError):
    """A kernel an emitter cannot render; names the op, the target and a way out.

    The kernel builder catches it and keeps the kernel's ATen nodes as extern calls, so
    an emitter raises it for anything it does not render rather than emit wrong code::

        raise EmitError("op 'erf' has no rendering on target 'arena': add it to "
                        "ArenaEmitter.code_for_op or leave aten.erf an extern")
    """


class KernelCompilerCrash(EmitError):
    """The host compiler crashed on one kernel's source (an internal compiler error, or a
    compiler killed by a signal): a bug of the compiler, not of the source.  The kernel
    builder runs that kernel's ATen nodes as extern calls instead (logged), as it does for a
    kernel an emitter cannot render; a compiler that fails on every source (missing, or a
    source it rejects) is not this error and still fails the compile."""


class UnsupportedUserKernel(RuntimeError):
    """A user-written Triton kernel (``kernel[grid](...)``, ``torch.library.triton_op``) that a
    program cannot launch: names the kernel, the target and what to do.  Not an ``EmitError``:
    there is no extern call to fall back to."""
