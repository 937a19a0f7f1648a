"""``libdevice`` for generated kernels: Triton's on the GPU, a torch-backed shim under
Triton's CPU interpreter (which cannot call libdevice).

A kernel module does ``from fxwrap.targets.cuda_triton.libm import libdevice,
fx_round_bf16`` and calls ``libdevice.tanh(x)``.  On the GPU that is ``triton.language.extra.libdevice``
(the backend dispatching module; ``triton.language.extra.cuda.libdevice`` where the
former is missing).  Under ``TRITON_INTERPRET=1`` each function runs the same math
with torch's CPU kernels on the interpreter's numpy blocks, so interpreted kernels
give eager's numbers for these functions.
"""
from __future__ import annotations

import os

import numpy as np
import torch


def interpreting() -> bool:
    """True when Triton kernels made now would run under the CPU interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except Exception:  # older triton: only the environment variable
        return False


def _real_libdevice():
    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - triton without the dispatching module
        from triton.language.extra.cuda import libdevice
    return libdevice


_TORCH_FNS = {
    "exp": torch.exp, "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "log10": torch.log10,
    "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "nearbyint": torch.round, "rint": torch.round,
    "fmod": torch.fmod, "pow": torch.pow, "atan2": torch.atan2, "copysign": torch.copysign,
    "hypot": torch.hypot,
}
_INT_RESULT = {"signbit": torch.signbit, "isinf": torch.isinf, "isnan": torch.isnan}


class InterpreterLibdevice:
    """The libdevice functions fxwrap kernels use, for Triton's interpreter."""

    def __getattr__(self, name):
        fn = _TORCH_FNS.get(name) or _INT_RESULT.get(name)
        if fn is None:
            raise AttributeError(f"libdevice.{name} has no interpreter shim in fxwrap "
                                 "(fxwrap.targets.cuda_triton.libm); add it there")
        int_result = name in _INT_RESULT

        def call(*args):
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle

            tensors = [a for a in args if isinstance(a, tl.core.tensor)]
            ref = tensors[0]
            block_shapes = [list(a.type.shape) for a in tensors if a.type.is_block()]
            datas = [torch.from_numpy(np.ascontiguousarray(a.handle.data)) if isinstance(a, tl.core.tensor)
                     else a for a in args]
            out = fn(*datas)
            scalar = ref.dtype
            if int_result:
                out = out.to(torch.int32)
                scalar = tl.int32
            arr = np.ascontiguousarray(out.numpy())
            if block_shapes:
                shape = list(np.broadcast_shapes(*[tuple(s) for s in block_shapes]))
                arr = np.broadcast_to(arr, shape).copy() if list(arr.shape) != shape else arr
                ty = tl.core.block_type(scalar, shape)
            else:
                arr = arr.reshape(-1)[:1]
                ty = scalar
            return tl.core.tensor(TensorHandle(arr, scalar), ty)

        call.__name__ = name
        return call


_SHIM = InterpreterLibdevice()


def _interp_round_bf16(x):
    """float32 -> nearest-even bf16 -> float32, on an interpreter block."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    data = torch.from_numpy(np.ascontiguousarray(x.handle.data)).to(torch.bfloat16).to(torch.float32)
    return tl.core.tensor(TensorHandle(data.numpy(), tl.float32), x.type)


_GPU: dict[str, object] = {}


def _gpu_round_bf16():
    if "round_bf16" not in _GPU:
        import triton
        import triton.language as tl

        @triton.jit
        def fx_round_bf16(x):
            return x.to(tl.bfloat16).to(tl.float32)

        _GPU["round_bf16"] = fx_round_bf16
    return _GPU["round_bf16"]


def __getattr__(name):
    if name == "libdevice":
        return _SHIM if interpreting() else _real_libdevice()
    if name == "fx_round_bf16":
        return _interp_round_bf16 if interpreting() else _gpu_round_bf16()
    raise AttributeError(name)
