"""Lines the debug modes insert after a kernel or extern launch (``fxwrap.plugins.debug_modes``).

``options={"check_nan": True}`` puts a ``CheckFinite`` after every launch, and
``options={"print_values": ...}`` a ``PrintValues`` after those whose buffers were chosen::

    fxwrap_pointwise_0(arg0, buf0)
    check_finite(buf0)  # after kernel fxwrap_pointwise_0: log1p: aten.log1p.default
    print_values(buf0)  # after kernel fxwrap_pointwise_0: log1p: aten.log1p.default

Each becomes one FX node calling ``fxwrap.runtime.debug.check_finite`` /
``print_values`` with the launch's name, its provenance and the buffers.  The lines
read the buffers and write nothing; they sit right after the launch, before any
``Free`` or ``Reuse`` of what it wrote.
"""
from __future__ import annotations

from dataclasses import dataclass

from fxwrap.runtime import debug
from fxwrap.ir.lines import Buffer, Line


@dataclass(frozen=True)
class CheckFinite(Line):
    """``check_finite(buf0, buf1)``: raise if a buffer that ``launch`` wrote holds NaN
    (or Inf, with ``check_inf``).  ``launch`` is the launch's label (``"kernel
    fxwrap_pointwise_0"``, ``"aten.mm.default"``), ``described`` what it computes
    (ATen nodes and source lines), ``target`` the target's name."""

    buffers: tuple[Buffer, ...]
    launch: str
    described: str
    target: str
    check_inf: bool = True
    inputs: tuple[str, ...] = ()  # the buffers the launch read (named in the error)

    fusion_barrier = True

    @property
    def label(self):
        return f"check_finite after {self.launch}"

    def reads(self):
        return list(self.buffers)

    def host_readback(self):
        return f"check_nan reads a flag of {self.launch}'s outputs back to the CPU"

    def to_source(self, printer):
        names = ", ".join(b.name for b in self.buffers)
        return f"check_finite({names})  # after {self.launch}" + (f": {self.described}" if self.described else "")

    def to_fx(self, converter):
        converter.add(debug.check_finite,
                      (self.launch, self.described, self.target, self.check_inf,
                       tuple(b.name for b in self.buffers), self.inputs,
                       *(converter.node(b) for b in self.buffers)),
                      name="check_finite")


@dataclass(frozen=True)
class PrintValues(Line):
    """``print_values(buf0)``: print a summary of each buffer (shape, dtype, min/max/mean/norm,
    NaN/Inf counts) that ``launch`` wrote, with its provenance ``described``."""

    buffers: tuple[Buffer, ...]
    launch: str
    described: str

    fusion_barrier = True

    @property
    def label(self):
        return f"print_values after {self.launch}"

    def reads(self):
        return list(self.buffers)

    def host_readback(self):
        return f"print_values reads {self.launch}'s outputs back to the CPU"

    def to_source(self, printer):
        names = ", ".join(b.name for b in self.buffers)
        return f"print_values({names})  # after {self.launch}" + (f": {self.described}" if self.described else "")

    def to_fx(self, converter):
        converter.add(debug.print_values,
                      (self.launch, self.described, tuple(b.name for b in self.buffers),
                       *(converter.node(b) for b in self.buffers)),
                      name="print_values")
