"""The OpenCL C dialect of docs/adding-a-device.md (``examples/opencl_dialect.py``) on CPU
tensors: each kernel is OpenCL C, compiled by gcc behind a shim (``__kernel``, ``__global``
and ``inline`` defined away, OpenCL's type names typedef'd, ``get_global_id(0)`` a variable
the driver sets) and run over its ``launch.grid`` work items; then the conformance kit."""
from __future__ import annotations

import ctypes
import re
import sys
from pathlib import Path

import pytest
import sympy
import torch

import fxwrap
from shared_helpers import defined_kernels, target_registered
from fxwrap.targets.host.compiler import CCompiler
from fxwrap.targets.host.loader import load_library
from fxwrap.testing import ConformanceSuite, Unsupported

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from opencl_dialect import OpenCLEmitter  # noqa: E402

SHIM = r"""
#include <stdbool.h>
#include <stdint.h>
#include <tgmath.h>
typedef unsigned char uchar; typedef unsigned short ushort; typedef unsigned int uint; typedef unsigned long ulong;
#define __kernel static
#define __global
#define inline static inline
static long fx_item;
#define get_global_id(dim) fx_item
"""
COMPILER = CCompiler(flags=("-std=c99", "-O2", "-shared", "-fPIC", "-fwrapv", "-ffp-contract=off", "-fno-math-errno"))


class ShimOpenCLEmitter(OpenCLEmitter):
    """The dialect, its kernels run on the CPU: the shim, the kernel, a driver over the work items."""

    def load(self, source: fxwrap.KernelSource):
        launch = source.launch
        pointers, names = launch.pointers, launch.size_symbols
        args = [f"buffers[{i}]" for i in range(pointers)] + [f"sizes[{i}]" for i in range(len(names))]
        driver = (f"void fx_run(void *const *buffers, const long *sizes, long items) {{\n"
                  f"  for (fx_item = 0; fx_item < items; ++fx_item) {launch.symbol}({', '.join(args)});\n}}\n")
        fn = load_library(COMPILER.compile(SHIM + source.text + driver)).fx_run
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long], None
        grid = sympy.sympify(launch.grid)

        def launcher(*call_args):
            bufs = (ctypes.c_void_p * max(pointers, 1))(*[t.data_ptr() for t in call_args[:pointers]])
            sizes = [int(s) for s in call_args[pointers:]]
            items = int(grid.xreplace({s: sizes[names.index(s.name)] for s in grid.free_symbols}))
            fn(bufs, (ctypes.c_long * max(len(sizes), 1))(*sizes), items)
        return launcher


TARGET = fxwrap.Target("opencl-shim", "cpu", fxwrap.CpuDevice(), ShimOpenCLEmitter, fxwrap.WrapperCodegen,
                       priority=-10)


@pytest.fixture(autouse=True, scope="module")
def opencl_target():
    with target_registered(TARGET):
        yield


def test_kernels_are_opencl_c_and_give_eagers_numbers():
    x, i = torch.randn(5, 9), torch.randint(-20, 20, (5, 9))
    x[1, 3] = float("nan")

    def f(x, i):
        return (x.relu() * 2).sum(-1), x.softmax(-1), x.argmin(1), torch.var_mean(x, 1), x.cummax(1), (i // 3) % 4

    program = fxwrap.lower(f, x, i, target=TARGET.name)
    for got, expected in zip(torch.utils._pytree.tree_leaves(program(x, i)),
                             torch.utils._pytree.tree_leaves(f(x, i)), strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True)
    kernels = defined_kernels(program)
    assert len(kernels) >= 2  # a reduction kernel (sum, softmax, argmin, var_mean, floor/mod) and a scan
    for k in kernels:
        head = re.search(r"\n__kernel void \w+\((.*)\)\n\{\n", k.source)
        assert head and "__global " in head.group(1), k.source[-2000:]
        assert "const long xindex = get_global_id(0);" in k.source
        assert not re.search(r"int64_t|#include|static_cast|std::|\bfx_", k.source)


class TestOpenCLConformance(ConformanceSuite):
    target = TARGET.name
    unsupported = [Unsupported("no half in the dialect: bf16 runs as ATen externs", dtype=torch.bfloat16),
                   Unsupported("no half in the dialect: fp16 runs as ATen externs", dtype=torch.float16)]
