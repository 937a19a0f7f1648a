"""An OpenCL C dialect of fxwrap's C-family engine (docs/adding-a-device.md, section 10):
every line of it is spelling.  The engine writes the kernel; the dialect names OpenCL C's
qualifiers, its 64-bit ``long``, its work-item index and its types, and fxwrap derives the
op table (``DialectOps``) and the prelude (``fxwrap/targets/c_helpers.py``: PyTorch's
semantics, one function per type, ``cl_max_float``) from those spellings.  A kernel::

    __kernel void fxwrap_pointwise_0(__global const float* restrict in_ptr0,
                                     __global float* restrict out_ptr0, const long s0)
    {
      const long xindex = get_global_id(0);
      if (xindex < 8*s0) {
        ...

One work item per row (``work_item_index``): the launch record's ``grid`` is the number of
work items, a Python expression of the size symbols.  How the kernels reach a device is the
loader's business (``clBuildProgram``, ``clEnqueueNDRangeKernel``); tests/cpu/test_opencl_dialect.py
runs them on the CPU by compiling them with gcc behind a small shim and passes the
conformance kit.  (A real device takes ``bool`` buffers as ``uchar``: OpenCL C does not allow
``bool`` kernel arguments; the shim does.)
"""
from __future__ import annotations

import torch

import fxwrap
from fxwrap.targets.c_helpers import HelperPrelude

OPENCL_TYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "long", torch.int32: "int",
    torch.int16: "short", torch.int8: "char", torch.uint8: "uchar", torch.bool: "bool",
    torch.uint16: "ushort", torch.uint32: "uint", torch.uint64: "ulong",
}


class OpenCLEmitter(fxwrap.CStyleEmitter):
    """``OpenCLEmitter(target).render(kernel) -> KernelSource`` (OpenCL C); a target adds
    ``load(source) -> launcher``, which runs ``launch.grid`` work items."""

    language = "opencl"
    prefix = "cl_"                              # cl_floordiv_float(a, b), cl_sum_upd_float(&acc, v)
    kernel_qualifier = "__kernel"
    buffer_qualifier = "__global "              # the address space of every buffer
    size_param_type = "const long"
    index_type = "long"                         # OpenCL C's long is 64 bits: no <stdint.h>
    long_suffix, unsigned_long_suffix = "L", "UL"
    helper_inline = "inline"
    work_item_index = "get_global_id(0)"        # one row per work item: the engine's over_rows
    type_names = OPENCL_TYPES
    supported_dtypes = frozenset(OPENCL_TYPES)  # no half: bf16/fp16 ops stay ATen externs
    prelude = HelperPrelude("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
