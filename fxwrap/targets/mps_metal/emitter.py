"""The Metal Shading Language emitter: ``ScheduledKernel`` -> ``kernel void`` -> launcher.

A pointwise kernel runs one thread per element; ``relu(x) * 2`` over a contiguous
``(s0, 64)`` float tensor renders as::

    kernel void fxwrap_pointwise_0(device const float* in_ptr0 [[buffer(0)]],
        device float* out_ptr0 [[buffer(1)]], constant long& s0 [[buffer(2)]],
        uint fx_gid [[thread_position_in_grid]])
    {
      const float tmp1 = 0.0f;
      const float tmp3 = 2.0f;
      const long xindex = fx_gid;
      if (xindex >= 64*s0) return;
      ...
      out_ptr0[64*x0 + x1] = tmp4;
    }

Reductions run one threadgroup per output row (see ``reduction.MetalReduction``).
Where the kernel runs is the target's option ``execute``: ``"mps"`` (default,
``torch.mps.compile_shader``) or ``"shim"`` (the same source compiled as C++ against
``shim/fxwrap_metal_shim.h`` and executed on the CPU; the ``mps_shim`` target).

Metal has no double: float64 buffers are not renderable (the kernel builder keeps
such ops as ATen extern calls, see ``supported_dtypes``); float64 *scalars* inside a
float kernel (Python constants) are computed in float, as Metal can only do: the
session's ``numerics`` lacks float64, so ``fxwrap.core.numerics.legalize`` turns them
into float32 values before this emitter sees them.
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.capabilities import Capabilities, as_capabilities
from fxwrap.ir.loops import ScheduledKernel
from fxwrap.ir.symbolic import python_source
from fxwrap.runtime.launch import MetalLaunch
from fxwrap.targets.cstyle import CStyleEmitter, c_ops, EmitError, Scope, LocalNames
from fxwrap.targets.mps_metal.prelude import PRELUDE
from fxwrap.targets.mps_metal.scan import MetalScan
from fxwrap.runtime.provenance import describe


def _metal_ops() -> dict:
    ops = c_ops("fx_", "metal::", "{f}")
    for name in ("expm1", "log1p", "erf", "erfc"):  # the prelude's, where metal:: has none
        ops[name] = (lambda fn: lambda *args, dtype: f"{fn}({', '.join(args)})")(f"fx_{name}")
    return ops


METAL_OPS = _metal_ops()

# Metal position attributes the shim's driver and Metal itself supply, by name.
POINTWISE_THREAD_ARGS = (("fx_gid", "thread_position_in_grid"),)
REDUCTION_THREAD_ARGS = (("fx_group", "threadgroup_position_in_grid"),
                         ("fx_tid", "thread_position_in_threadgroup"),
                         ("fx_tgsize", "threads_per_threadgroup"))


class MetalEmitter(CStyleEmitter):
    """``MetalEmitter(target).render(kernel) -> KernelSource`` (Metal source text);
    ``.load(source) -> launcher(in0, ..., out0, ..., s0, ...)``.

    The launcher runs through ``torch.mps.compile_shader`` or, when the target's
    ``options["execute"] == "shim"``, through the C++ shim on CPU tensors.
    """

    language = "metal"
    # the Metal dialect's spellings (CStyleEmitter's attributes): Metal Shading Language is C++
    cast = "static_cast<{t}>({x})"
    typed_value = "{t}({v})"
    generic = "{f}<{t}>"
    overload = "{f}"
    out_arg = "{x}"
    out_param = "thread {t}& {x}"           # of the prelude's helpers (mps_metal/prelude.py METAL)
    math = "metal::"
    helper_inline = "inline"
    helper_cast = "{t}({x})"
    kernel_qualifier = "kernel"
    buffer_qualifier = "device "
    restrict_qualifier = ""
    size_param_type = "constant long&"
    index_type = "long"
    thread_index = "fx_gid"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    simd_width = 32
    prelude = PRELUDE
    code_for_op = METAL_OPS
    renders_scans = True
    type_names = {
        torch.float32: "float", torch.bfloat16: "bfloat", torch.float16: "half",
        torch.int64: "long", torch.int32: "int", torch.int16: "short", torch.int8: "char",
        torch.uint8: "uchar", torch.bool: "bool", torch.uint16: "ushort",
        torch.uint32: "uint", torch.uint64: "ulong",
    }
    half_types = {
        torch.bfloat16: ("float", "bfloat", "fx_bf16_round"),
        torch.float16: ("float", "half", "fx_half_round"),
    }
    # what a buffer may hold; anything else stays an ATen extern (no double on Metal)
    supported_dtypes = frozenset(type_names)
    # indexed writes: plain ones, one thread per element; no accumulating ones (they stay
    # the ATen op: Metal's atomics cover 32-bit types only, and not the shim)
    indexed_stores = {"set": supported_dtypes}
    reserved_names = frozenset({"xindex", "rindex", "c"})
    default_threadgroup_size = {"mps": 256, "shim": 32}  # shim: OS threads per team
    # scans (mps_metal/scan.py): one threadgroup per row when there are fewer rows than
    # scan_split_max_rows, of at least scan_split_min_length elements, cut into at most
    # scan_max_chunks chunks of at least scan_min_chunk elements (a guess: not timed on a GPU)
    scan_split_max_rows = 256
    scan_split_min_length = 4096
    scan_max_chunks = 1024
    scan_min_chunk = 256

    # ------------------------------------------------------------------ names
    def symbol_name(self, sym: sympy.Symbol) -> str:
        if sym.name in self.reserved_names:
            raise EmitError(f"size symbol {sym.name!r} clashes with a local of the Metal emitter "
                            f"(target {self.target_name})")
        return super().symbol_name(sym)

    # ------------------------------------------------------------------ signature
    def grouped(self, kernel: ScheduledKernel) -> bool:
        """One threadgroup per row (reductions, split scans), not one thread per element."""
        return bool(kernel.reductions) and (not kernel.is_scan or MetalScan(self, kernel).splits())

    def thread_args(self, kernel: ScheduledKernel) -> tuple[tuple[str, str], ...]:
        return REDUCTION_THREAD_ARGS if self.grouped(kernel) else POINTWISE_THREAD_ARGS

    def params(self, kernel: ScheduledKernel) -> list[str]:
        params = super().params(kernel)
        params += [f"uint {name} [[{attr}]]" for name, attr in self.thread_args(kernel)]
        return params

    def pointer_param(self, name, dtype, const, restrict, index) -> str:
        return f"{super().pointer_param(name, dtype, const, restrict, index)} [[buffer({index})]]"

    def size_param(self, name: str, index: int) -> str:
        return f"{super().size_param(name, index)} [[buffer({index})]]"

    # ------------------------------------------------------------------ body
    def render_body(self, kernel: ScheduledKernel, names: LocalNames) -> list[str]:
        if kernel.is_scan:  # one thread per row, or one threadgroup per long row (MetalScan)
            return MetalScan(self, kernel, names).render()
        if kernel.reductions:
            from fxwrap.targets.mps_metal.reduction import MetalReduction
            return MetalReduction(self, kernel, names).render()
        # one thread per element; without reductions the r vars are more pointwise dims
        vars_ = self.xvars(kernel) + self.rvars(kernel)
        ranges = self.grid_ranges(kernel)
        fn = Scope(self, names, None, kernel=kernel)
        out = [f"const {self.index_type} xindex = {self.thread_index};",
               f"if (xindex >= {self.numel(ranges)}) return;"]
        out += self.decompose("xindex", vars_, ranges, names)
        stores = self.render_stores(kernel, kernel.stores,
                                    Scope(self, names, fn, declares=[v.name for v in vars_]))
        return fn.lines + out + stores

    def grid_ranges(self, kernel: ScheduledKernel) -> tuple:
        return tuple(kernel.ranges) if kernel.reductions else tuple(kernel.ranges) + tuple(kernel.reduction_ranges)

    def launch_record(self, kernel: ScheduledKernel, **common) -> MetalLaunch:
        execute = self.execute
        grid = kernel.ranges if kernel.reductions else self.grid_ranges(kernel)
        numel = sympy.Mul(*[sympy.sympify(r) for r in grid]) if grid else sympy.Integer(1)
        tg = int(self.target_options.get(
            "threadgroup_size", self.default_threadgroup_size[execute]))
        if kernel.reductions and not kernel.is_scan and (tg < self.simd_width or tg % self.simd_width):
            raise EmitError(f"threadgroup_size {tg} of target {self.target_name} must be a multiple "
                            f"of the SIMD width {self.simd_width}")
        limit = self.device_capabilities.max_threads_per_threadgroup
        if limit is not None and tg > limit:
            origins = describe(kernel.origins)
            raise EmitError(f"kernel {kernel.name} ({origins}): threadgroup_size {tg} of target "
                            f"{self.target_name} exceeds its device's "
                            f"max_threads_per_threadgroup {limit} (DeviceInterface.capabilities()); "
                            f"set Target.options['threadgroup_size'] to at most {limit}")
        grouped = self.grouped(kernel)
        return MetalLaunch(**common, kind="reduction" if grouped else "pointwise",
                           grid=python_expr(numel), threadgroup_size=tg,
                           thread_args=tuple(attr for _, attr in self.thread_args(kernel)),
                           sync=grouped, execute=execute)

    @property
    def device_capabilities(self) -> Capabilities:
        """The target device's ``capabilities()`` (asked once per emitter); launch limits
        such as ``max_threads_per_threadgroup`` come from here."""
        caps = self.__dict__.get("_device_capabilities")
        if caps is None:
            device = self.target_device
            caps = self.__dict__["_device_capabilities"] = (
                as_capabilities(device.capabilities(), device) if device else Capabilities())
        return caps

    @property
    def execute(self) -> str:
        execute = self.target_options.get("execute", "mps")
        if execute not in ("mps", "shim"):
            raise EmitError(f"target {self.target_name}: execute={execute!r} is not 'mps' or 'shim'")
        return execute

    # ------------------------------------------------------------------ load
    def load(self, source):
        """A launcher taking the signature's tensors and sizes, bound once."""
        if (source.launch.execute or self.execute) == "shim":
            from fxwrap.targets.mps_metal.shim_runner import shim_launcher
            return shim_launcher(source.text, source.launch)
        from fxwrap.targets.mps_metal.launcher import mps_launcher
        return mps_launcher(source.text, source.launch)

    def saved_loader(self, kernel):
        """Shim kernels: their shared object (``host.saved.SharedObjectLoader``).  MPS
        kernels: their Metal source, which ``torch.mps.compile_shader`` (the Metal driver,
        no fxwrap compiler) builds when the loaded program first launches them."""
        from fxwrap.targets.mps_metal import shim_runner
        if (kernel.launch.execute or self.execute) == "shim":
            from fxwrap.targets.host.saved import SharedObjectLoader
            return SharedObjectLoader.of(kernel.launcher().shim.library, shim_runner.bind_shim_kernel,
                                         shim_runner.kernel_loader)
        from fxwrap.targets.mps_metal.launcher import kernel_loader
        return kernel_loader


def python_expr(expr) -> str:
    """A sympy size expression as Python source over the size symbols' names (the grid
    the launcher computes at run time)."""
    try:
        return python_source(expr)
    except NotImplementedError as exc:
        raise EmitError(f"grid size {expr} cannot be computed by the Metal launcher ({exc}); "
                        "the kernel's nodes run as ATen extern calls") from exc
