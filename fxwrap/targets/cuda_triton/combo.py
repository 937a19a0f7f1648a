"""A combo kernel (``fxwrap.ir.combo.ComboKernel``) in Triton: one launch whose programs
are shared out among the members, each member's body a ``@triton.jit`` function of its own
over its own flat range, called with the program id less the blocks of the members before
it.  Two members of 21 and 11 elements, ``XBLOCK`` 32::

    @triton.jit
    def fxwrap_combo_0_m0(in_ptr0, out_ptr0, pid, XBLOCK: tl.constexpr):
        xnumel = 21
        xoffset = pid * XBLOCK
        ...

    @triton.jit
    def fxwrap_combo_0_m1(in_ptr0, out_ptr0, pid, XBLOCK: tl.constexpr):
        ...

    @triton.jit
    def fxwrap_combo_0(in_ptr0, in_ptr1, out_ptr0, out_ptr1, XBLOCK: tl.constexpr):
        pid = tl.program_id(0)
        end0 = (21 + XBLOCK - 1) // XBLOCK
        end1 = end0 + (11 + XBLOCK - 1) // XBLOCK
        if pid < end0:
            fxwrap_combo_0_m0(in_ptr0, out_ptr0, pid, XBLOCK)
        elif pid < end1:
            fxwrap_combo_0_m1(in_ptr1, out_ptr1, pid - end0, XBLOCK)

launched over the sum of the members' blocks (``TritonLaunch.grid_extra``, an expression of
``XBLOCK``), plan ``combo``.  The block counts are compile-time arithmetic on ``XBLOCK``, so
that one source serves every config (``combo_configs``): on a GPU the emitter times them
(``TritonEmitter._tune``), as it does a reduction's.  Members are 1-D pointwise kernels (plan
``pointwise1d``) with static element counts; anything else is rendered as kernels of its own
(``render_triton_combo`` returns None).  The member bodies are the ``KernelWriter``'s
(``MemberWriter`` only reads the program id from its parameter); a member of one element or
of many buffers is called with a narrower block (``member_blocks``).
"""
from __future__ import annotations

import sympy
import torch

from fxwrap.ir.combo import ComboKernel
from fxwrap.runtime.launch import TritonLaunch
from fxwrap.targets.base import KernelSource, kernel_function_name, kernel_header, kernel_signature
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.codegen import KernelWriter
from fxwrap.targets.cuda_triton.tiling import Planner


class MemberWriter(KernelWriter):
    """A ``KernelWriter`` for one member of a combo kernel: its program id is the ``pid``
    parameter of the member's function (the combo's program id less the blocks before it)."""

    def pid(self) -> str:
        return super().pid().replace("tl.program_id(0)", "pid")  # ``pid.to(tl.int64)`` with int64 indices


def _numel(member) -> int | None:
    n = sympy.Mul(*[sympy.sympify(r) for r in (*member.ranges, *member.reduction_ranges)])
    return int(n) if n.is_Integer else None


#: a combo of fewer elements is launch-bound: its first config, untimed
COMBO_TUNE_MIN_ELEMENTS = 1 << 18
#: the configs timed beside the first (the largest member's): a streaming update of several
#: tensors, as Inductor's foreach kernels run it (1024 elements, 8 warps), and wider blocks
#: (each config is one more compile of a kernel of every member: three in all)
COMBO_TUNE_CONFIGS = ((1024, 4), (1024, 8), (2048, 8))


def combo_configs(plans, numels: list[int], interpret: bool) -> list[tuple]:
    """The launch configs of a combo kernel, the first one the members' widest (the largest
    ``XBLOCK`` and ``num_warps`` of their plans' first configs); on a GPU, for a combo of at
    least ``COMBO_TUNE_MIN_ELEMENTS`` elements, ``COMBO_TUNE_CONFIGS`` after it (timed)."""
    first = (("XBLOCK", max(int(p.configs[0]["XBLOCK"]) for p in plans)),
             ("num_warps", max(int(p.configs[0]["num_warps"]) for p in plans)))
    configs = [first]
    if not interpret and sum(numels) >= COMBO_TUNE_MIN_ELEMENTS:
        configs += [(("XBLOCK", x), ("num_warps", w)) for x, w in COMBO_TUNE_CONFIGS
                    if (("XBLOCK", x), ("num_warps", w)) != first]
    return configs


#: a member of more buffers than this runs narrower blocks (``member_blocks``)
COMBO_MEMBER_BUFFERS = 8


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def member_blocks(kernel: ComboKernel, numels: list[int], xblock: int) -> list[str]:
    """Each member's block size, an expression of the combo's ``XBLOCK`` (``xblock`` under the
    first config): ``XBLOCK`` itself, or ``XBLOCK / d`` (at least 1) for a member of fewer elements than a
    block (a 0-d step count: one element) or of more than ``COMBO_MEMBER_BUFFERS`` buffers (the
    parameters of one size fused side by side): one kernel holds the registers of its widest
    member, and a member of 28 buffers at the width of one of 7 would hold four times the
    values a thread, lowering the occupancy every member runs at."""
    out = []
    for member, n in zip(kernel.members, numels):
        buffers = len(member.inputs) + len(member.outputs)
        width = min(xblock, 1 << max(n - 1, 0).bit_length(), _floor_pow2(xblock * COMBO_MEMBER_BUFFERS // max(buffers, 1)))
        divisor = xblock // max(width, 1)
        # at least 1 (a config narrower than the first): ceil(XBLOCK / divisor), a power of 2
        out.append("XBLOCK" if divisor == 1 else f"((XBLOCK + {divisor - 1}) // {divisor})")
    return out


def render_triton_combo(emitter, kernel: ComboKernel) -> KernelSource | None:
    """``kernel`` as one Triton launch (the module docstring); None where a member is not a
    1-D pointwise kernel of a static element count."""
    planner = Planner(emitter.interpret, emitter.size_hints, emitter.max_autotune)
    plans = [planner.plan(m) for m in kernel.members]
    numels = [_numel(m) for m in kernel.members]
    if any(p.kind != "pointwise1d" for p in plans) or any(n is None for n in numels):
        return None
    for buf in (*kernel.inputs, *kernel.outputs):
        O.tl_type(buf.dtype, emitter.target_name)
    configs = combo_configs(plans, numels, emitter.interpret)
    fname = kernel_function_name(kernel)
    inputs = [b.name for b in kernel.inputs]
    outputs = [b.name for b in kernel.outputs]
    helpers: set[str] = set()
    functions: list[list[str]] = []
    blocks = member_blocks(kernel, numels, dict(configs[0])["XBLOCK"])
    dispatch = ["pid = tl.program_id(0)"]
    dispatch += [f"end{i} = {f'end{i - 1} + ' if i else ''}({n} + {b} - 1) // {b}" for i, (n, b) in
                 enumerate(zip(numels, blocks))]
    for i, (member, plan) in enumerate(zip(kernel.members, plans)):
        writer = MemberWriter(member, plan, emitter.target_name, emitter.intrinsics)
        body = writer.write_pointwise()
        helpers |= writer.helpers | writer.printer.helpers | writer.ops.helpers
        params = [f"in_ptr{j}" for j in range(len(member.inputs))]
        params += [f"out_ptr{j}" for j in range(len(member.outputs))]
        params += [s.name for s in member.size_symbols]
        name = f"{fname}_m{i}"
        functions.append(["@triton.jit", f"def {name}({', '.join([*params, 'pid', 'XBLOCK: tl.constexpr'])}):",
                          *("    " + line for line in body)])
        args = [f"in_ptr{inputs.index(b.name)}" for b in member.inputs]
        args += [f"out_ptr{outputs.index(b.name)}" for b in member.outputs]
        args += [s.name for s in member.size_symbols]
        local = f"pid - end{i - 1}" if i else "pid"
        dispatch += [f"{'elif' if i else 'if'} pid < end{i}:", f"    {name}({', '.join([*args, local, blocks[i]])})"]
    sizes = [s.name for s in kernel.size_symbols]
    deco = f"@triton.jit(do_not_specialize={sizes!r})" if sizes else "@triton.jit"
    params = [f"in_ptr{j}" for j in range(len(inputs))] + [f"out_ptr{j}" for j in range(len(outputs))]
    lines = kernel_header(kernel, "#", " (triton)")
    lines += [f"# plan: combo of {len(kernel.members)} pointwise kernels of {', '.join(map(str, numels))} elements",
              "import triton", "import triton.language as tl", "",
              "from fxwrap.targets.cuda_triton.libm import fx_round_bf16, libdevice", "", ""]
    if helpers:
        lines += [*O.helper_source(helpers), ""]
    for function in functions:
        lines += [*function, "", ""]
    lines += [deco, f"def {fname}({', '.join([*params, *sizes, 'XBLOCK: tl.constexpr'])}):"]
    lines += ["    " + line for line in dispatch]
    if "_fx_index_check" in helpers:  # a member's gather checks its indices: the asserts compiled in
        configs = [c + O.INDEX_CHECK_OPTIONS for c in configs]
    grid = " + ".join(f"({n} + {b} - 1) // {b}" for n, b in zip(numels, blocks))
    launch = TritonLaunch(symbol=fname, language=emitter.language, plan="combo",
                          index_dtype="tl.int64" if any(p.index_dtype == "tl.int64" for p in plans) else "tl.int32",
                          pointers=len(params), size_symbols=tuple(sizes), numels=(), grid_extra=grid,
                          configs=tuple(configs), config=configs[0], interpret=emitter.interpret, autotuned=False,
                          pointer_dtypes=tuple(str(b.dtype) for b in (*kernel.inputs, *kernel.outputs)),
                          in_place=kernel.in_place_pairs(emitter.in_place_pairs))
    devices = [torch.device(b.device) for b in (*kernel.inputs, *kernel.outputs) if getattr(b, "device", None)]
    index = next((d.index for d in devices if d.type == "cuda"), None)
    if index is not None:
        launch.device_index = index  # loaded into, and launched on, this device
    source = KernelSource(kernel.name, "\n".join(lines) + "\n", emitter.language, kernel_signature(kernel), launch, ())
    if emitter.autotune and len(configs) > 1:
        emitter._tune(source, kernel, configs)  # each config timed; the fastest kept
    return source
