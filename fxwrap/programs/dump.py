"""The debug dump: one folder per compiled program, for a person to look through.

``FXWRAP_DEBUG_DIR=dir`` (or ``options={"debug_dir": dir}``) writes, for every program
fxwrap compiles (inference, forward, backward)::

    dir/
      index.md, index.html, index.json     every program in the folder, with links
      000-inference-forward/               <counter>-<kind>-<the user function>
        aten_graph.py        the ATen graph fxwrap was given (with the user's source lines)
        loop_ir.txt          each kernel's loop IR
        schedule.md          which ATen nodes each kernel computes, why it is a kernel of its
                             own (the fusion refused), and each extern call's ATen node
        wrapper_ir.py        the Wrapper IR (Program.code())
        fx_code.py           the GraphModule's code, with provenance comments
        kernels/<name>.<ext> every kernel's source
        memory_plan.txt      the memory plan: peaks, each storage's buffers, bytes, lines
        memory.svg           the memory plan: storage lifetimes (x: lines) by bytes (y), the peak
        timings.json         the compile phases, in milliseconds
        program.json         a summary (kind, target, kernels, peak bytes, files)

Folder names are the process's program counter, the kind and the user function's
name: the same run writes the same names.  Nothing is read or written when neither
is set (``ProgramDump.start`` returns None).
"""
from __future__ import annotations

import json
import os
import re
import threading
from html import escape
from pathlib import Path

from fxwrap.core.capture import aten_graph_text
from fxwrap.ir.lines import DefineKernel
from fxwrap.ir.combo import format_loop_ir
from fxwrap.core.memory import describe_plan, storage_lifetimes
from fxwrap.wrapper_ir.fx import annotated_code
from fxwrap.runtime.provenance import describe, origin_of

ENV = "FXWRAP_DEBUG_DIR"
_EXTENSIONS = {"c++": "cpp", "cpp": "cpp", "metal": "metal", "triton": "py", "python": "py", "loop-ir": "txt"}
_counters: dict[str, int] = {}
_lock = threading.Lock()


class DebugDirError(ValueError):
    """The debug dump's folder cannot be written (a file of that name, no permission)::

        fxwrap: cannot write the debug dump to /tmp/notes.txt (FXWRAP_DEBUG_DIR)
        (NotADirectoryError: ...); point FXWRAP_DEBUG_DIR at a folder you can write, or unset it
    """

    def __init__(self, root: Path, option, exc: OSError):
        source = "the debug_dir option" if option is not None else ENV
        how = "give debug_dir a folder you can write" if option is not None else \
            f"point {ENV} at a folder you can write, or unset it"
        super().__init__(f"fxwrap: cannot write the debug dump to {root} ({source}) "
                         f"({type(exc).__name__}: {exc}); {how}")


def debug_dir(option: str | os.PathLike | None) -> Path | None:
    """The dump folder: the ``debug_dir`` option, else ``$FXWRAP_DEBUG_DIR``, else None."""
    chosen = option if option is not None else os.environ.get(ENV) or None
    return Path(chosen) if chosen is not None else None


def _function_name(gm) -> str:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.meta.get("stack_trace"):
            function = origin_of(node).function
            if function:
                return re.sub(r"[^A-Za-z0-9_]+", "", function) or "graph"
    return "graph"


class ProgramDump:
    """The dump folder of one program: ``start`` before compiling (the ATen graph as given),
    ``write`` once the Program exists."""

    def __init__(self, root: Path, folder: str, aten_graph: str, option=None):
        self.root, self.folder, self.aten_graph = root, folder, aten_graph
        self.option = option  # the debug_dir option the root came from (None: FXWRAP_DEBUG_DIR)

    @classmethod
    def start(cls, option, gm, kind: str, aten_graph: str | None = None) -> "ProgramDump | None":
        """``aten_graph``: the graph's text as captured (before the ATen passes), else ``gm``'s."""
        root = debug_dir(option)
        if root is None:
            return None
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DebugDirError(root, option, exc) from exc
        key = str(root.resolve())
        with _lock:
            number = _counters.get(key, 0)
            _counters[key] = number + 1
        return cls(root, f"{number:03d}-{kind}-{_function_name(gm)}",
                   aten_graph if aten_graph is not None else aten_graph_text(gm), option)

    @property
    def path(self) -> Path:
        return self.root / self.folder

    def write(self, program, built, timer) -> Path:
        """Write every artifact of ``program`` (``built``: its ``BuiltProgram``; ``timer``:
        its ``PhaseTimer``) and refresh the index."""
        try:
            return self._write(program, built, timer)
        except OSError as exc:
            raise DebugDirError(self.root, self.option, exc) from exc

    def _write(self, program, built, timer) -> Path:
        out = self.path
        (out / "kernels").mkdir(parents=True, exist_ok=True)
        files = {}

        def put(name: str, text: str) -> None:
            (out / name).write_text(text if text.endswith("\n") else text + "\n")
            files[name] = name

        put("aten_graph.py", self.aten_graph)
        put("loop_ir.txt", "\n\n".join(format_loop_ir(k.scheduled) for k in built.kernels) or "(no kernels)")
        put("schedule.md", schedule_text(program, built))
        put("wrapper_ir.py", program.code())
        put("fx_code.py", annotated_code(program.graph_module))
        for record in built.kernels:
            ext = _EXTENSIONS.get(str(record.source.language).lower(), "txt")
            put(f"kernels/{record.scheduled.name}.{ext}", record.source.text)
        built_names = {record.scheduled.name for record in built.kernels}
        for kernel in _pass_kernels(program.lines, built_names):  # kernels a Wrapper-IR pass defined
            ext = _EXTENSIONS.get(str(kernel.launch.language).lower(), "txt")
            put(f"kernels/{kernel.name}.{ext}", kernel.source)
        put("memory_plan.txt", describe_plan(program.memory, program.hints))
        put("memory.svg", memory_svg(program.memory, program.hints, f"{self.folder}: memory plan"))
        phases = {k: round(v * 1e3, 3) for k, v in timer.phases.items()}
        put("timings.json", json.dumps({"unit": "ms", "phases": phases,
                                        "total": round(sum(phases.values()), 3)}, indent=2))
        summary = {"folder": self.folder, "kind": program.kind, "target": program.target.name,
                   "kernels": len(built.kernels), "lines": len(program.lines),
                   "peak_bytes": program.peak_bytes, "compile_ms": round(sum(phases.values()), 3),
                   "files": sorted(files)}
        (out / "program.json").write_text(json.dumps(summary, indent=2) + "\n")
        write_index(self.root)
        return out


def _pass_kernels(lines, built_names: set) -> list:
    """The kernels ``lines`` define (``DefineKernel``) that the kernel builder did not render
    (named outside ``built_names``: a Wrapper-IR pass's, such as the cpu target's attention
    kernel), in program order, each once."""
    found = {}
    for line in lines:
        if isinstance(line, DefineKernel) and line.kernel.name not in built_names:
            found.setdefault(line.kernel.name, line.kernel)
    return list(found.values())


def schedule_text(program, built) -> str:
    """``schedule.md``: each kernel's ATen nodes and the fusion it was refused; each extern's node."""
    records = {r.scheduled.name: r for r in built.kernels}
    out = [f"# Schedule of the {program.kind} program (target {program.target.name})", ""]
    for line in program.lines:
        kernel = line.kernel
        if not line.origins:
            continue
        if kernel is not None and kernel.name in records:
            record = records[kernel.name]
            out += [f"## kernel {kernel.name}", "",
                    f"- computes: {describe(line.origins)}",
                    f"- stores the values of: {', '.join(record.roots)}",
                    f"- a kernel of its own: {record.started_because}", "", "```"]
            out += [f"{o.node} {o.target}  {o.location} in {o.function}  [{o.module_path or ''}]"
                    for o in line.origins] + ["```", ""]
        else:
            out += [f"## extern {line.label}", "", f"- computes: {describe(line.origins)}", ""]
    return "\n".join(out)


_COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#bab0ac")


def memory_svg(plan, hints, title: str) -> str:
    """The memory plan as an SVG: each storage a band from the line that allocates it to its
    last use (x), its height its bytes (y); at every line the storages live there are
    stacked in order of allocation, so the stack's top is the live bytes of that line and
    no storage is ever drawn above the peak (a band steps down where an older storage under
    it dies).  The live bytes per line as a line, and the peak marked."""
    lives = storage_lifetimes(plan.lines, hints)
    n = max(len(plan.lines), 1)
    live = [0] * n
    segments: list[list[int]] = []  # [life index, first line, last line, offset]: one band's piece
    open_piece: dict[int, list[int]] = {}  # life index -> its piece being drawn
    for i in range(n):
        for k, life in enumerate(lives):  # in order of allocation: older storages lower
            if not life.start <= i <= min(life.end, n - 1):
                continue
            piece = open_piece.get(k)
            if piece is not None and piece[3] == live[i]:
                piece[2] = i  # same offset as on the line before: the piece grows
            else:
                open_piece[k] = piece = [k, i, i, live[i]]
                segments.append(piece)
            live[i] += life.nbytes
    peak = max(live, default=0)
    top = peak or 1
    width, height, left, bottom, head = 900, 420, 70, 40, 40
    plot_w, plot_h = width - left - 20, height - bottom - head
    x = lambda i: left + plot_w * i / n  # noqa: E731
    y = lambda b: head + plot_h * (1 - b / top)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="16" font-size="13">{escape(title)}</text>',
             f'<text x="{left}" y="31">peak {peak} B at line {live.index(peak) if lives else 0}; '
             f'{len(lives)} storages; x: program lines, y: bytes</text>',
             f'<line x1="{left}" y1="{head + plot_h}" x2="{left + plot_w}" y2="{head + plot_h}" stroke="black"/>',
             f'<line x1="{left}" y1="{head}" x2="{left}" y2="{head + plot_h}" stroke="black"/>',
             f'<text x="{left - 4}" y="{head + 4}" text-anchor="end">{top}</text>',
             f'<text x="{left - 4}" y="{head + plot_h}" text-anchor="end">0</text>',
             f'<text x="{left + plot_w}" y="{head + plot_h + 15}" text-anchor="end">line {n}</text>']
    labelled: set[int] = set()
    for k, first, last, at in segments:
        life = lives[k]
        x0, x1 = x(first), x(last + 1)
        y0, y1 = y(at + life.nbytes), y(at)
        label = f"{' -> '.join(life.names)}: {life.nbytes} B, lines {life.start}..{life.end}"
        parts.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{max(x1 - x0, 1):.1f}" height="{max(y1 - y0, 1):.1f}" '
                     f'fill="{_COLORS[k % len(_COLORS)]}" fill-opacity="0.75" stroke="white">'
                     f'<title>{escape(label)}</title></rect>')
        if k not in labelled and x1 - x0 > 40 and y1 - y0 > 12:
            labelled.add(k)
            parts.append(f'<text x="{x0 + 3:.1f}" y="{y1 - 3:.1f}" fill="white">{escape(life.names[0])}</text>')
    points = " ".join(f"{x(i):.1f},{y(b):.1f} {x(i + 1):.1f},{y(b):.1f}" for i, b in enumerate(live))
    parts.append(f'<polyline points="{points}" fill="none" stroke="black" stroke-width="1.5"/>')
    parts.append(f'<line x1="{left}" y1="{y(peak):.1f}" x2="{left + plot_w}" y2="{y(peak):.1f}" stroke="red" '
                 f'stroke-dasharray="5,3"/>')
    parts.append(f'<text x="{left + plot_w}" y="{y(peak) - 3:.1f}" text-anchor="end" fill="red">peak {peak} B</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_index(root: Path) -> None:
    """``index.json``, ``index.md`` and ``index.html`` listing every program folder under ``root``."""
    programs = []
    for summary in sorted(root.glob("*/program.json")):
        try:
            programs.append(json.loads(summary.read_text()))
        except (OSError, ValueError):
            continue
    (root / "index.json").write_text(json.dumps({"programs": programs}, indent=2) + "\n")
    md = ["# fxwrap debug dump", "", "| program | kind | target | kernels | peak bytes | compile ms | files |",
          "|---|---|---|---|---|---|---|"]
    html = ["<!doctype html><html><head><meta charset='utf-8'><title>fxwrap debug dump</title></head><body>",
            "<h1>fxwrap debug dump</h1><table border='1' cellpadding='4'>",
            "<tr><th>program</th><th>kind</th><th>target</th><th>kernels</th><th>peak bytes</th>"
            "<th>compile ms</th><th>files</th></tr>"]
    for p in programs:
        folder = p["folder"]
        links = ", ".join(f"[{f}]({folder}/{f})" for f in p["files"] if "/" not in f)
        md.append(f"| {folder} | {p['kind']} | {p['target']} | {p['kernels']} | {p['peak_bytes']} | "
                  f"{p['compile_ms']} | {links}, [kernels]({folder}/kernels) |")
        hlinks = " ".join(f"<a href='{escape(folder)}/{escape(f)}'>{escape(f)}</a>" for f in p["files"])
        html.append(f"<tr><td>{escape(folder)}</td><td>{escape(p['kind'])}</td><td>{escape(p['target'])}</td>"
                    f"<td>{p['kernels']}</td><td>{p['peak_bytes']}</td><td>{p['compile_ms']}</td>"
                    f"<td>{hlinks}</td></tr>")
    html.append("</table></body></html>")
    (root / "index.md").write_text("\n".join(md) + "\n")
    (root / "index.html").write_text("\n".join(html) + "\n")


__all__ = ["DebugDirError", "ProgramDump", "debug_dir", "memory_svg", "schedule_text", "write_index"]
