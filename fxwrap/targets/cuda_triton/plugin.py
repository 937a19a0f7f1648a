"""Registers the built-in Triton targets through the ``fxwrap`` entry point.

* ``cuda``: CUDA tensors, Triton kernels compiled ahead and launched through bound
  launchers (the default target for CUDA tensors);
* ``triton-interpret``: CPU tensors, the same Triton kernels run by Triton's CPU
  interpreter (``TRITON_INTERPRET=1``).  Chosen by name only (priority below ``cpu``
  and ``reference``): it is how CI without a GPU runs the Triton emitter::

      torch.compile(fn, backend="fxwrap", options={"target": "triton-interpret"})

Both compute ``mm``/``addmm``/``bmm`` with the Triton GEMM template (``gemm.TritonGemm``)
where it is faster than cuBLAS (the ATen call) and a separate epilogue kernel, and one-row
products (batch-1 decoding; int8 weight-only ``_weight_int8pack_mm`` too) with the GEMV
template (``gemv.TritonGemv``, in the default mode as well).  ``x.max(dim)`` / ``x.min(dim)``
(values and indices) are one kernel (``rules.reductions.minmax_with_indices``): the emitter
reads the values from the arg-reduction (``reduction.py``).
"""
import torch

from fxwrap.core.rules.reductions import minmax_with_indices
from fxwrap.targets.marker import hookimpl
from fxwrap.targets.base import DirectCallWrapper, Target
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.cuda_triton.device import CudaDevice
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from fxwrap.targets.cuda_triton.gemm import TritonGemm
from fxwrap.targets.cuda_triton.gemv import TritonGemv
from fxwrap.targets.cuda_triton.wrapper import CudaWrapper


@hookimpl
def fxwrap_targets():
    return [Target("cuda", "cuda", CudaDevice(), TritonEmitter, CudaWrapper),
            Target("triton-interpret", "cpu", CpuDevice(), TritonEmitter, DirectCallWrapper,
                   options={"interpret": True}, priority=-2)]


@hookimpl
def fxwrap_templates(target):
    # the one-row kernel first: templates="always" gives a one-row product to it
    return [TritonGemv(), TritonGemm()] if target.name in ("cuda", "triton-interpret") else []


@hookimpl
def fxwrap_lowerings(registry, target):
    if isinstance(target.emitter, type) and issubclass(target.emitter, TritonEmitter):
        registry.register(torch.ops.aten.max.dim, minmax_with_indices("max"), target=target.name)
        registry.register(torch.ops.aten.min.dim, minmax_with_indices("min"), target=target.name)
