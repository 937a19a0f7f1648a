"""The C99 dialect of fxwrap's C-family renderer, with its own calling convention.

The engine (``fxwrap.CStyleEmitter``) writes the kernel; this dialect only spells it: the
``c99_`` helper prefix, from which fxwrap derives the op table (``<tgmath.h>`` math, per-type
helpers ``c99_abs_float``) and the prelude (``fxwrap/targets/c_helpers.py``'s helpers, one
function per C type), and a calling convention of two arrays, the buffers' pointers and the
sizes::

    void fxwrap_pointwise_0(void *const *buffers, const int64_t *sizes)
    {
      const float* restrict in_ptr0 = (const float*)buffers[0];
      float* restrict out_ptr0 = (float*)buffers[1];
      const int64_t s0 = sizes[0];
      ...

Kernels compile with ``cc -std=c99`` into shared objects (cached like the C++ target's)
and run through ``ctypes``.
"""
from __future__ import annotations

import ctypes

import fxwrap
from fxwrap.targets.cstyle import C_TYPES
from fxwrap.targets.host.compiler import CCompiler
from fxwrap.targets.host.loader import load_library

FLAGS = ("-std=c99", "-O2", "-shared", "-fPIC", "-fwrapv", "-ffp-contract=off", "-fno-math-errno")


class C99Emitter(fxwrap.CStyleEmitter):
    """``C99Emitter(target).render(kernel) -> KernelSource``; ``.load(source) -> launcher``,
    called as every fxwrap launcher is: ``launcher(in0, ..., out0, ..., s0, ...)``."""

    language = "c"
    prefix = "c99_"  # the prelude and op table follow: c99_abs_float(x), c99_sum_upd_float(&acc, v)
    supported_dtypes = frozenset(C_TYPES)  # C has no 16-bit float: bf16/fp16 ops stay ATen externs

    def function_head(self, kernel, cname: str) -> str:
        return f"void {cname}(void *const *buffers, const int64_t *sizes)"

    def render_body(self, kernel, names) -> list[str]:
        """The engine's serial body, after the arguments unpacked from the two arrays."""
        body = super().render_body(kernel, names)
        params = self.params(kernel)
        pointers = len(kernel.inputs) + len(kernel.outputs)
        unpack = [f"{p} = ({p.rsplit(' ', 1)[0].replace(' restrict', '')})buffers[{i}];"
                  for i, p in enumerate(params[:pointers])]
        unpack += [f"{p} = sizes[{i}];" for i, p in enumerate(params[pointers:])]
        return unpack + body

    def load(self, source: fxwrap.KernelSource):
        """Compile (or fetch from fxwrap's kernel cache) and bind a launcher; a compiler error
        raises here, which aborts the compile (``render`` errors fall back to ATen instead)."""
        path = _compiler().compile(source.text)
        fn = getattr(load_library(path), source.launch.symbol)
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], None
        pointers, sizes = source.launch.pointers, len(source.launch.size_symbols)

        def launch(*args):
            bufs = (ctypes.c_void_p * pointers)(*[t.data_ptr() for t in args[:pointers]])
            dims = (ctypes.c_int64 * max(sizes, 1))(*[int(s) for s in args[pointers:]])
            fn(bufs, dims)
        return launch


_COMPILERS: list[CCompiler] = []


def _compiler() -> CCompiler:
    if not _COMPILERS:
        _COMPILERS.append(CCompiler(flags=FLAGS))
    return _COMPILERS[0]
