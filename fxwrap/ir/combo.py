"""Combo kernels: independent pointwise kernels over different iteration spaces, launched
as one (horizontal fusion; ``core/combo.py`` groups them, an emitter's ``render_combo``
spells the kernel).

A ``ComboKernel`` holds its members, each a whole ``ScheduledKernel`` over its own ranges;
its arguments are the members' buffers, each once, inputs first, then outputs, then the
size symbols.  No member reads or writes what another one writes, so they may run in any
order or at once.  ``format_combo`` prints it::

    fxwrap_combo_0: 2 members; inputs arg0, arg1; outputs buf0, buf1
    fxwrap_combo_0_m0: ranges=(7, 3) reduction_ranges=()
      %0 = load.f32 arg0[3*x0 + x1]
      ...
    fxwrap_combo_0_m1: ranges=(11,) reduction_ranges=()
      ...

``ComboLimits`` is what an emitter declares it renders (``KernelEmitter.combo_kernels``):
the most members, and the most pointer and size arguments, of one combo kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

from fxwrap.ir.loops import ScheduledKernel, format_kernel


@dataclass(frozen=True)
class ComboLimits:
    """The combo kernels an emitter renders: at most ``max_members`` kernels in one, with
    at most ``max_arguments`` pointer and size arguments in all (Triton's compile time and
    register pressure grow with both; a C function's parameter list stays short)."""

    max_members: int = 8
    max_arguments: int = 64

    def __post_init__(self):
        for name in ("max_members", "max_arguments"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise ValueError(f"ComboLimits.{name} must be an int >= 2, not {value!r}")


def _unique(items) -> tuple:
    out: list = []
    for item in items:
        if item not in out:
            out.append(item)
    return tuple(out)


@dataclass(frozen=True)
class ComboKernel:
    """Independent pointwise kernels (``members``) launched as one kernel ``name``.  Its
    arguments: ``inputs`` (every member's, each buffer once), ``outputs``, ``size_symbols``."""

    name: str
    members: tuple[ScheduledKernel, ...]

    @property
    def outputs(self) -> tuple:
        return _unique(b for m in self.members for b in m.outputs)

    @property
    def inputs(self) -> tuple:
        written = {b.name for b in self.outputs}
        return _unique(b for m in self.members for b in m.inputs if b.name not in written)

    @property
    def size_symbols(self) -> tuple:
        return tuple(sorted({s for m in self.members for s in m.size_symbols}, key=lambda s: s.name))

    @property
    def origins(self) -> tuple:
        return _unique(o for m in self.members for o in m.origins)

    @property
    def shared_storage(self) -> tuple[str, ...]:
        """The members' buffers whose pointers may alias (``ScheduledKernel.shared_storage``)."""
        return tuple(sorted({name for m in self.members for name in m.shared_storage}))

    #: no loops of its own: each member has its ranges (read by the kernel headers)
    ranges: tuple = ()
    reduction_ranges: tuple = ()
    reductions: tuple = ()

    @property
    def stores(self) -> tuple:
        return tuple(st for m in self.members for st in m.stores)

    def argument_positions(self, member: ScheduledKernel) -> tuple[int, ...]:
        """Where each argument of ``member`` (its inputs, outputs, size symbols) is among
        this kernel's arguments (inputs, outputs, size symbols)."""
        names = [b.name for b in (*self.inputs, *self.outputs)] + [s.name for s in self.size_symbols]
        own = [b.name for b in (*member.inputs, *member.outputs)] + [s.name for s in member.size_symbols]
        return tuple(names.index(name) for name in own)

    def in_place_pairs(self, pairs_of=ScheduledKernel.in_place_pairs) -> tuple[tuple[str, str], ...]:
        """The members' ``(input, output)`` pairs (``pairs_of(member)``) whose input no
        other member reads: that member alone reads the storage its output then takes."""
        out = []
        for i, member in enumerate(self.members):
            others = {b.name for j, m in enumerate(self.members) if j != i for b in m.inputs}
            out += [pair for pair in pairs_of(member) if pair[0] not in others]
        return tuple(out)


def format_combo(kernel: ComboKernel) -> str:
    """A combo kernel's members' loop IR as text (the ``lowering`` log, the debug dump)."""
    head = (f"{kernel.name}: {len(kernel.members)} members; inputs "
            f"{', '.join(b.name for b in kernel.inputs) or '-'}; outputs {', '.join(b.name for b in kernel.outputs)}")
    return "\n".join([head, *(format_kernel(m) for m in kernel.members)])


def format_loop_ir(kernel: "ScheduledKernel | ComboKernel") -> str:
    """A kernel's loop IR as text: ``format_combo`` or ``loops.format_kernel``."""
    return format_combo(kernel) if isinstance(kernel, ComboKernel) else format_kernel(kernel)
