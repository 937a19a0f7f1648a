"""The line of a kernel fxwrap did not write: a user's Triton kernel, launched in the program.

A compiled function that launches a ``@triton.jit`` kernel (``add_kernel[grid](x, y, out, n,
BLOCK=64)``, or a ``torch.library.triton_op`` calling ``wrap_triton(add_kernel)[grid](...)``)
reaches fxwrap as a ``triton_kernel_wrapper_functional`` node (``build_user_kernels`` lowers
it).  The launch is one ``CallUserKernel`` line, after a ``DefineKernel`` of its ``Kernel``;
under ``dynamic=True`` it prints::

    # kernel add_kernel (triton-interpret): x_ptr:inout, y_ptr:inout, out_ptr:inout, n:size, grid0_0:size, ...
    # triton_kernel_wrapper_functional (model.py:19 in f)
    add_kernel[((s77 + 63)//64, 1, 1)](x_ptr=arg1, y_ptr=arg2, out_ptr=buf0, n=s77, BLOCK=64)  # user Triton kernel; writes x_ptr, y_ptr, out_ptr

and in FX it is one node whose target is the ``Kernel`` (``isinstance(node.target,
fxwrap.Kernel)``), with the tensor and scalar arguments, then every grid's values::

    add_kernel = fxwrap_runtime_kernel_add_kernel_3f2a...(arg1, arg2, buf0, s77, floordiv, 1, 1)

The kernel's ``signature`` says which tensors it writes (role ``inout``: what torch's
mutation analysis found, ``tensors_to_clone``) and which it only reads (``input``), so the
memory planner and the scheduler see reads and writes as for any kernel; its ``launch``
holds the constant arguments, the grids and (autotuned kernels) the configs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from fxwrap.ir.line_hosts import LineConverter, LinePrinter
from fxwrap.ir.lines import CallKernel


@dataclass(frozen=True)
class CallUserKernel(CallKernel):
    """``add_kernel[(cdiv(s0, 64), 1, 1)](x_ptr=arg0, ..., BLOCK=64)``: launch of a user's Triton kernel.

    ``args``: the kernel's tensor and scalar arguments, in ``kernel.signature`` order (its
    first ``len(args)`` entries); ``grid``: one grid (a 3-tuple of sizes) per autotuning
    config, in the configs' order (one for a plain ``@triton.jit`` kernel).  The launcher
    takes ``(*args, *grid[0], *grid[1], ...)``.  Reads every buffer argument, writes those
    whose role is ``inout``.
    """

    @property
    def label(self):
        return f"user Triton kernel {self.kernel.name}"

    @property
    def grid_values(self) -> tuple:
        return tuple(v for g in self.grid for v in g)

    def size_exprs(self):
        exprs = super().size_exprs()
        return exprs + [v for v in self.grid_values if isinstance(v, sympy.Expr)]

    def with_origins(self, origins):
        return self if self.origins else replace(self, origins=tuple(origins))

    def to_source(self, printer: LinePrinter):
        names = [a.name for a in self.kernel.signature[:len(self.args)]]
        params = [f"{n}={printer.fmt(v)}" for n, v in zip(names, self.args)]
        params += [f"{n}={v!r}" for n, v in self.kernel.launch.constants]
        grids = ", ".join(printer.fmt(tuple(g)) for g in self.grid)
        grid = grids if len(self.grid) == 1 else f"autotuned: {grids}"
        written = [a.name for a in self.kernel.signature if a.role == "inout"]
        note = f"  # user Triton kernel; writes {', '.join(written)}" if written else "  # user Triton kernel"
        return printer.provenance(self.origins, f"{self.kernel.name}[{grid}]({', '.join(params)}){note}")

    def to_fx(self, converter: LineConverter):
        if self.kernel not in converter.kernels:
            converter.kernels.append(self.kernel)
        node = converter.add(self.kernel, converter.arg((*self.args, *self.grid_values)), name=self.kernel.name)
        converter.provenance(node, self.origins)
