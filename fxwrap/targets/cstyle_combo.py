"""A combo kernel (``fxwrap.ir.combo.ComboKernel``) in a C-family dialect: one function
whose body is each member's loop nest in a block of its own, one after another, each
with the dialect's schedule (C++: its OpenMP ``parallel for`` split, as for the member
alone).  A member's pointers are renamed to the combo's parameters (``in_ptr0`` of the
second member may be the combo's ``in_ptr3``); size symbols keep their names::

    extern "C" void fxwrap_combo_0(const float* __restrict__ in_ptr0, const float* __restrict__ in_ptr1,
                                   float* __restrict__ out_ptr0, float* __restrict__ out_ptr1)
    {
      {  // fxwrap_combo_0_m0: ranges (7, 3)
        for (int64_t x0 = 0; x0 < 21; ++x0) { ... out_ptr0[x0] = tmp1; }
      }
      {  // fxwrap_combo_0_m1: ranges (11,)
        for (int64_t x0 = 0; x0 < 11; ++x0) { ... out_ptr1[x0] = tmp1; }
      }
    }

A dialect opts in with ``combo_kernels = ComboLimits(...)`` and ``render_combo`` calling
``render_c_combo`` (the C++ dialect does); one that launches a grid of work items
(``work_item_index``: OpenCL, Metal) renders none.
"""
from __future__ import annotations

import re

from fxwrap.ir.combo import ComboKernel
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cstyle import CStyleEmitter, LocalNames

_POINTER = re.compile(r"\b(in_ptr|out_ptr)(\d+)\b")


def render_c_combo(emitter: CStyleEmitter, kernel: ComboKernel) -> KernelSource | None:
    """``kernel`` as one function of ``emitter``'s dialect; None where the dialect launches
    a grid of work items or a member needs a workspace."""
    if emitter.work_item_index is not None:
        return None
    inputs = [b.name for b in kernel.inputs]
    outputs = [b.name for b in kernel.outputs]
    blocks: list[str] = []
    marks = {"_unrolled": False, "_masked_loads": False, "_selects": False}  # C++: read by function_head
    for member in kernel.members:
        emitter.check(member)
        emitter.workspaces = []
        body = emitter.render_body(member, LocalNames())
        if emitter.workspaces:
            return None
        for flag in marks:
            marks[flag] = marks[flag] or bool(getattr(emitter, flag, False))
        own = {"in_ptr": [inputs.index(b.name) for b in member.inputs],
               "out_ptr": [outputs.index(b.name) for b in member.outputs]}

        def renamed(match: re.Match, own=own) -> str:
            return f"{match.group(1)}{own[match.group(1)][int(match.group(2))]}"

        blocks.append(f"{{  {emitter.comment} {member.name}: ranges {tuple(member.ranges)}")
        blocks += ["  " + _POINTER.sub(renamed, line) if line else "" for line in body]
        blocks.append("}")
    for flag, value in marks.items():
        if hasattr(emitter, flag):
            setattr(emitter, flag, value)
    return emitter.template_source(kernel, blocks, in_place=kernel.in_place_pairs(emitter.in_place_pairs))
