"""The debug modes ``check_nan`` and ``print_values``: a plugin built on the public
``fxwrap_pipeline`` hook, the way a vendor would write one.

    >>> prog = fxwrap.lower(torch.log1p, torch.zeros(8, 16), options={"check_nan": True})
    >>> print(prog.code())
    def forward(arg0):
        buf0 = empty_strided((8, 16), (16, 1), dtype=torch.float32, device='cpu')
        # kernel fxwrap_pointwise_0 (cpu): arg0:input, buf0:output
        # log1p
        fxwrap_pointwise_0(arg0, buf0)
        check_finite(buf0)  # after kernel fxwrap_pointwise_0: log1p
        return (buf0,)
    >>> prog.run(torch.full((8, 16), -2.0))       # log1p(-2) is NaN
    Traceback (most recent call last):
    fxwrap.runtime.debug.NonFiniteValueError: fxwrap check_nan: kernel fxwrap_pointwise_0 (target cpu) wrote 128 NaN into its output buf0 ...

Each mode is a pass ``lines -> lines`` that inserts one line (``wrapper_ir.debug_lines``)
right after each kernel or extern launch: ``CheckFinite`` over the floating buffers the
launch wrote, ``PrintValues`` over the chosen ones.  The passes run after memory
planning, so the buffers a launch wrote are still alive there (the planner puts every
``Free`` and ``Reuse`` after a buffer's last use, and the launch is a use).  With both
modes on, the values are printed before the check raises.

The ``PluginManager`` registers this module after every installed plugin, so its passes
see the program the other plugins' passes made.  Options absent or false: the hook
adds no pass and the program is what it would be without this module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fxwrap.core.passes import LinesPass
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.provenance import describe
from fxwrap.wrapper_ir.debug_lines import CheckFinite, PrintValues
from fxwrap.ir.lines import Buffer, Line

#: The name the plugin manager registers this module under.
PLUGIN_NAME = "fxwrap-debug-modes"


# -- provenance: the one place the debug modes and fxwrap.profile read it ----------------

def _kernel_header_origins(kernel) -> str:
    """The ``from: ...`` line of a rendered kernel's header (``targets.base.kernel_header``)."""
    for line in str(getattr(kernel, "source", "")).splitlines()[:4]:
        found = re.search(r"\bfrom:? (.+)$", line)
        if found:
            return "from: " + found.group(1).strip()
    return ""


def provenance(launch) -> str:
    """What a launch computes, as one line: ``"log1p: aten.log1p.default at model.py:12 in forward"``.

    ``launch`` is a ``CallKernel`` / ``CallExtern`` line or the FX node it became.  It reads
    the line's ``origins`` (or the node's ``meta["fxwrap_origins"]``) where the compiler
    recorded them; otherwise what the line itself knows: a kernel's ``from:`` header (the
    ATen node names it was fused from); nothing for an extern (its label names its op)."""
    meta = getattr(launch, "meta", None)
    origins = meta.get("fxwrap_origins", ()) if isinstance(meta, dict) else getattr(launch, "origins", ())
    if origins:
        return describe(origins)
    kernel = getattr(launch, "kernel", None)
    if kernel is None and isinstance(getattr(launch, "target", None), Kernel):
        kernel = launch.target
    return _kernel_header_origins(kernel) if kernel is not None else ""


# -- the passes ---------------------------------------------------------------------------

def _is_launch(line: Line) -> bool:
    """A kernel or extern launch: a line that computes (writes a buffer or produces values)."""
    if line.issues_collective:  # its buffers are ready at its wait, checked there
        return False
    return not line.is_device_check and bool(line.writes() or line.defines_values())


def _results_after(lines: list[Line], index: int) -> tuple[list[Buffer], int]:
    """The buffers launch ``lines[index]`` produces through the ``GetItem`` lines right after
    it (a tuple result), and the index after the last of them."""
    values = set(lines[index].defines_values())
    found, end = [], index + 1
    while values and end < len(lines) and lines[end].src in values:
        found += lines[end].defines()
        end += 1
    return found, end


def _insert_after_launches(lines, make) -> list[Line]:
    """``lines`` with ``make(launch, buffers)`` (a line, or None) after each launch: right
    after it for the buffers it writes, after its ``GetItem`` lines for a tuple's items."""
    lines = list(lines)
    out: list[Line] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        if not _is_launch(line):
            i += 1
            continue
        scratch = {b.name for b in line.scratch()}  # workspaces: no results
        written = [b for b in line.writes() if isinstance(b, Buffer) and b.name not in scratch]
        if written and (extra := make(line, written)) is not None:
            out.append(extra)
        items, end = _results_after(lines, i)
        out.extend(lines[i + 1:end])
        if items and (extra := make(line, items)) is not None:
            out.append(extra)
        i = end
    return out


#: ATen ops whose result is uninitialized memory (``torch.empty_like`` before a user kernel fills
#: it): nothing to check after them
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                            "new_empty_strided"})


def _uninitialized_result(launch: Line) -> bool:
    schema = getattr(launch.op, "_schema", None)
    return schema is not None and schema.name.split("::")[-1] in _UNINITIALIZED


def _unique(buffers) -> tuple[Buffer, ...]:
    seen, out = set(), []
    for b in buffers:
        if b.name not in seen:
            seen.add(b.name)
            out.append(b)
    return tuple(out)


@dataclass(frozen=True)
class CheckNanPass:
    """``options={"check_nan": True}`` (NaN and Inf) or ``"nan"`` (NaN only): a ``CheckFinite``
    after every launch over the floating buffers it wrote."""

    target: str
    check_inf: bool = True

    def __call__(self, lines: list[Line]) -> list[Line]:
        def make(launch, buffers):
            floating = _unique(b for b in buffers if b.dtype.is_floating_point or b.dtype.is_complex)
            if not floating or _uninitialized_result(launch):
                return None
            written = {b.name for b in launch.writes()}
            inputs = tuple(dict.fromkeys(b.name for b in launch.reads() if b.name not in written))
            return CheckFinite(floating, launch.label, provenance(launch), self.target, self.check_inf, inputs)
        return _insert_after_launches(lines, make)


@dataclass(frozen=True)
class PrintValuesPass:
    """``options={"print_values": True}`` (every buffer a launch writes) or a list of names: a
    buffer name (``"buf3"``; a view's name prints the buffer it views), a kernel's name (``"fxwrap_pointwise_0"``), an ATen node or op
    name that the launch's provenance mentions (``"exp"``, ``"aten.exp"``,
    ``"aten.exp.default"``), or a user function / file name appearing in it."""

    selection: tuple[str, ...] | None  # None: every buffer

    def selects(self, launch: Line, buffer: Buffer, origins: str) -> bool:
        if self.selection is None:
            return True
        tokens = set(re.findall(r"[A-Za-z_][\w.]*", f"{launch.label} {origins}"))
        for wanted in self.selection:
            if wanted == buffer.name or wanted in tokens:
                return True
            if any(t.startswith(wanted + ".") or wanted in t.split(".") for t in tokens):
                return True
        return False

    def __call__(self, lines: list[Line]) -> list[Line]:
        selector = self
        if self.selection is not None:  # a view chosen by name: print the buffer it views
            bases = {b.name: line.view_base.name for line in lines if line.view_base is not None
                     for b in line.defines()}
            wanted = list(self.selection)
            for name in self.selection:
                while name in bases:
                    name = bases[name]
                    wanted.append(name)
            selector = PrintValuesPass(tuple(dict.fromkeys(wanted)))

        def make(launch, buffers):
            origins = provenance(launch)
            chosen = _unique(b for b in buffers if selector.selects(launch, b, origins))
            return PrintValues(chosen, launch.label, origins) if chosen else None
        return _insert_after_launches(lines, make)


@hookimpl
def fxwrap_pipeline(pipeline, target, options):
    """The debug modes ``options`` turns on, for ``target``, at the end of the Wrapper-IR
    passes: none when both are off."""
    check_nan = getattr(options, "check_nan", False)
    if check_nan:
        pipeline.wrapper.append(LinesPass.of(CheckNanPass(target.name, check_inf=check_nan != "nan"), "check nan"))
    print_values = getattr(options, "print_values", False)
    if print_values:  # after check_nan's pass: it inserts right after the launch, so it prints first
        pipeline.wrapper.append(LinesPass.of(PrintValuesPass(None if print_values is True else tuple(print_values)),
                                             "print values"))
