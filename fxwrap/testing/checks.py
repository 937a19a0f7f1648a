"""The checks of the conformance kit, as plain functions over compiled ``Program``s.

Each raises ``AssertionError`` with a message that names the op (or program), the
target and what to do; none needs pytest, so a vendor can also call them from any
test of their own::

    program = fxwrap.lower(lambda x: torch.sin(x), torch.randn(8, 8), target="npu")
    check_ran_in_kernels(program, ops=[torch.ops.aten.sin], kernels=1, what="sin[float32]")
    check_memory_plan(program)
"""
from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence

import sympy
import torch

import fxwrap
from fxwrap.ir.lines import (
    Allocate, Buffer, CallExtern, Free, GetItem, Return, Reuse, View, buffers_in, buffers_read,
)

# Size, stride and offset reads are how a program learns sizes, not computation.
_METADATA_READS = ("aten::sym_",)


def kernel_nodes(program) -> list[torch.fx.Node]:
    """The launches of generated kernels: FX nodes whose target is an ``fxwrap.Kernel``."""
    return [n for n in program.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, fxwrap.Kernel)]


def extern_nodes(program) -> list[torch.fx.Node]:
    """FX nodes that call an ATen op (an ``OpOverload``: ``aten.sin.out``, ``aten.mm.default``)
    to compute something; size, stride and offset reads are not counted."""
    return [n for n in program.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and not n.target._schema.name.startswith(_METADATA_READS)]


def _packet_name(packet) -> str:
    return f"aten.{packet.__name__}" if hasattr(packet, "__name__") else str(packet)


def check_ran_in_kernels(program, ops: Sequence, kernels: int, what: str) -> None:
    """``program`` computed ``ops`` inside generated kernels, not through ATen.

    ``ops`` are ATen op packets (``torch.ops.aten.sin``); ``kernels`` is how many kernel
    launches the op needs.  Fails when an FX node calls one of ``ops`` (any overload: the
    functional op or its ``out=`` form) or any other computing ATen op, or when the
    program launches a different number of kernels.  ``what`` names the op case.
    """
    target = program.target.name
    packets = {getattr(op, "overloadpacket", op) for op in ops}
    externs = extern_nodes(program)
    own = sorted({str(n.target) for n in externs if n.target.overloadpacket in packets})
    if own:
        raise AssertionError(
            f"{what} on target {target!r}: the op ran as an ATen extern call ({', '.join(own)}), not inside "
            "a generated kernel. Give the target a lowering for it (fxwrap_lowerings, or an emitter "
            "rendering), or declare it in the suite's `unsupported` list with the reason.")
    others = sorted({str(n.target) for n in externs})
    if others:
        raise AssertionError(
            f"{what} on target {target!r}: the program calls ATen ops as externs ({', '.join(others)}); "
            f"the op ({', '.join(sorted(_packet_name(p) for p in packets))}) needs nothing but generated "
            "kernels. Give the target lowerings for those ops, or declare the case unsupported with the "
            "reason.")
    launched = kernel_nodes(program)
    if len(launched) != kernels:
        names = [n.target.name for n in launched]
        raise AssertionError(
            f"{what} on target {target!r}: {len(launched)} generated kernel launches {names}, the op needs "
            f"{kernels}. The op must run inside a kernel (a node whose target is an fxwrap.Kernel in "
            "program.graph_module); check that the target's emitter renders it.")


def intrinsic_calls(text: str, intrinsic) -> int:
    """How many times ``text`` (a kernel's source) writes a call of ``intrinsic`` (an
    ``fxwrap.Intrinsic``) as its ``spelling`` gives it, any operands: ``my_gelu(tmp1)``."""
    pattern = "".join(re.escape(literal) + ("" if field is None else r"[^\n]*?")
                      for literal, field, _, _ in string.Formatter().parse(intrinsic.spelling))
    return len(re.findall(pattern, text))


def check_intrinsic_called(program, intrinsic, what: str) -> None:
    """Some kernel of ``program`` calls ``intrinsic`` (beyond what the emitter's prelude
    writes: its definition)."""
    target = program.target
    prelude = str(getattr(target.emitter, "prelude", ""))
    sources = [n.target.source for n in kernel_nodes(program)]
    if not any(intrinsic_calls(s, intrinsic) > intrinsic_calls(prelude, intrinsic) for s in sources):
        raise AssertionError(
            f"{what} on target {target.name!r}: no kernel calls the intrinsic {intrinsic.name!r} "
            f"({intrinsic.spelling!r}) that the target declares for {intrinsic.replaces}; the call lowered "
            "another way. Check the declaration's replaces, when and dtypes against the call, and that the "
            "emitter renders op 'intrinsic' through the spelling.")


def _evaluate(expr, hints) -> int:
    value = sympy.sympify(expr).subs(dict(hints or {}))
    if value.free_symbols:
        raise AssertionError(f"size expression {expr} has symbols without a hint: {value.free_symbols}")
    return int(value)


def _aliases_an_argument(op) -> bool:
    """Whether a result of ``op`` may alias one of its arguments (per its schema)."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def storages(program) -> dict[str, int]:
    """Every storage the program creates, by its first buffer's name, with its bytes at
    the program's size hints: allocations, and the results of functional externs that
    do not alias an argument.  (Views, reuses and aliasing results share a storage.)"""
    return _storage_walk(program)[0]


def _storage_walk(program):
    """(storages: name -> bytes, root of every buffer name, freed roots in order, returned roots,
    problems found on the way)."""
    root_of: dict[str, str] = {}
    created: dict[str, int] = {}
    freed: dict[str, int] = {}  # root -> line index of its Free
    returned: set[str] = set()
    problems: list[str] = []
    aliasing_calls: dict[str, CallExtern] = {}
    hints = program.hints

    def root(buf: Buffer) -> str:
        return root_of.get(buf.name, buf.name)

    def create(buf: Buffer) -> None:
        root_of[buf.name] = buf.name
        created[buf.name] = _evaluate(buf.storage_bytes, hints)

    def alias(buf: Buffer, args) -> None:
        found = buffers_in(args)
        root_of[buf.name] = root(found[0]) if found else buf.name

    for i, line in enumerate(program.lines):
        for buf in buffers_read(line):
            if root(buf) in freed and not isinstance(line, Free):
                problems.append(f"line {i} ({type(line).__name__}) uses {buf.name} after its storage "
                                f"{root(buf)} was freed at line {freed[root(buf)]}")
        if isinstance(line, Allocate):
            create(line.buf)
        elif isinstance(line, Reuse):
            root_of[line.new.name] = root(line.old)
        elif isinstance(line, View):
            root_of[line.buf.name] = root(line.base)
        elif isinstance(line, CallExtern):
            if isinstance(line.out, str) and _aliases_an_argument(line.op):
                aliasing_calls[line.out] = line
            elif isinstance(line.out, Buffer):
                if _aliases_an_argument(line.op):
                    alias(line.out, line.args)
                else:
                    create(line.out)
        elif isinstance(line, GetItem) and isinstance(line.buf, Buffer):
            if line.src in aliasing_calls:
                alias(line.buf, aliasing_calls[line.src].args)
            else:
                create(line.buf)
        elif isinstance(line, Free):
            name = root(line.buf)
            if name in freed:
                problems.append(f"line {i} frees {line.buf.name} (storage {name}) a second time "
                                f"(first at line {freed[name]})")
            freed.setdefault(name, i)
        elif isinstance(line, Return):
            returned |= {root(b) for b in buffers_in(line.values)}
    return created, root_of, freed, returned, problems


def check_memory_plan(program, what: str = "") -> None:
    """The program's memory plan is consistent with its Wrapper IR.

    * every storage the program creates is freed (a ``Free`` line of it or of a view
      of it) or returned, exactly once, and nothing uses it after its ``Free``;
    * ``program.peak_bytes`` is no more than the sum of every storage's bytes, no less
      than the largest storage, and never above the plan without reuse
      (``memory.peak_bytes_frees_only``).

    A target's Wrapper-IR passes after the memory plan (``fxwrap_pipeline``) run after the
    planner, so this also checks that they keep the plan's promises.
    """
    name = f"{what or program.kind + ' program'} on target {program.target.name!r}"
    created, root_of, freed, returned, problems = _storage_walk(program)
    leaked = sorted(set(created) - set(freed) - returned)
    if leaked:
        problems.append(f"storages {leaked} are neither freed nor returned (a Free line is missing: "
                        "check the target's wrapper passes)")
    inputs_freed = sorted(set(freed) - set(created))
    if inputs_freed:
        problems.append(f"{inputs_freed} are freed but the program did not create them (inputs, constants)")
    both = sorted(set(freed) & returned)
    if both:
        problems.append(f"storages {both} are returned but also freed")
    total = sum(created.values())
    largest = max(created.values(), default=0)
    peak = program.peak_bytes
    if peak > total:
        problems.append(f"peak_bytes {peak} is above the sum of all storages, {total} bytes")
    if peak < largest:
        problems.append(f"peak_bytes {peak} is below the largest storage, {largest} bytes")
    if peak > program.memory.peak_bytes_frees_only:
        problems.append(f"peak_bytes {peak} is above the plan without reuse "
                        f"({program.memory.peak_bytes_frees_only}): reuse must never raise the peak")
    if problems:
        raise AssertionError(f"memory plan of the {name}:\n  " + "\n  ".join(problems)
                             + f"\nprogram:\n{program.code()}")


def kernel_sources(programs: Iterable) -> list[str]:
    """The source of every kernel the programs launch, in launch order."""
    return [n.target.source for p in programs for n in kernel_nodes(p)]


def check_same_output(first: Sequence, second: Sequence, what: str) -> None:
    """Two lowerings of one function gave byte-identical ``code()`` and kernel sources."""
    target = first[0].target.name if first else "?"
    if len(first) != len(second):
        raise AssertionError(f"{what} on target {target!r}: {len(first)} programs, then {len(second)}")
    for a, b in zip(first, second):
        if a.code() != b.code():
            raise AssertionError(f"{what} on target {target!r}: program.code() differs between two lowerings "
                                 f"of one function (iteration over a set or dict of unordered keys, an id() "
                                 f"or a counter that is not reset?):\n{_first_difference(a.code(), b.code())}")
    for i, (a, b) in enumerate(zip(kernel_sources(first), kernel_sources(second))):
        if a != b:
            raise AssertionError(f"{what} on target {target!r}: kernel {i}'s source differs between two "
                                 f"lowerings of one function:\n{_first_difference(a, b)}")
    if len(kernel_sources(first)) != len(kernel_sources(second)):
        raise AssertionError(f"{what} on target {target!r}: a different number of kernels in two lowerings")


def _first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            return f"  line {i + 1}: {x!r}\n       then: {y!r}"
    return f"  one is longer ({len(a)} vs {len(b)} characters)"


def check_zero_signs(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Where eager's result is a zero, the target's has its sign (``relu(-0.0)`` is ``0.0``,
    ``-0.0 * 1`` is ``-0.0``): ``assert_close`` counts ``-0.0 == 0.0``."""
    zeros = want == 0
    wrong = zeros & (torch.signbit(got) != torch.signbit(want))
    if bool(wrong.any()):
        at = tuple(int(v) for v in wrong.nonzero()[0])
        raise AssertionError(f"{what}: a zero has the wrong sign at {at}: got {float(got[at])!r}, eager "
                             f"{float(want[at])!r} ({int(wrong.sum())} of {int(zeros.sum())} zeros)")


def check_stream_order(target, device: torch.device, delay_stream) -> None:
    """A program's launches go to the current stream: on a side stream, ``delay_stream(ms)``
    holds the stream, then the input is written on it and the program runs there; a
    launcher that queues its kernels elsewhere reads the input before it is written.  The
    result is read on the host after the side stream's work (an event the default stream
    waits for).  ``target``: a name or a ``fxwrap.Target``."""
    def fn(x):
        return (x * 2 + 1).relu().softmax(-1)

    fresh = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    x = torch.zeros(64, 256, device=device)
    program = fxwrap.lower(fn, x, target=target)
    side = torch.Stream(device=device)
    with side:
        delay_stream(200)
        x.copy_(fresh)
        out = program.run(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        done = torch.Event(device=device)
        done.record()
    torch.accelerator.current_stream(device).wait_event(done)
    got = out.cpu()
    torch.testing.assert_close(got, fn(fresh), msg=lambda m: (
        f"target {target.name if isinstance(target, fxwrap.Target) else target}: the program run on a side stream did not wait for the "
        f"input written on that stream: its launches do not go to the current stream\n{m}"))
