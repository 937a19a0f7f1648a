"""The renderer: a ``LoweredProgram`` (``lowered.py``) -> the program's lines.  The fused
groups become kernels (``KernelLines``), every kernel of the program is compiled at once,
each template group's candidate is chosen (``template_choice``) and the launchers are bound.
The pipeline's ``render`` stage (``stages.py``) runs it; the Wrapper-IR passes follow."""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging

import sympy

from fxwrap.core import logs
from fxwrap.core.combo import ComboGroup, combine
from fxwrap.core.errors import EmitError, compiler_crashed
from fxwrap.core.numerics import legalize
from fxwrap.core.progress import Progress
from fxwrap.core.scheduler import Group, fuse, referenced_outside, to_kernel
from fxwrap.ir.lines import Allocate, Buffer, CallKernel, DefineKernel, Line, ZeroFill, buffers_read
from fxwrap.ir.combo import ComboKernel, format_loop_ir
from fxwrap.ir.loops import ScheduledKernel
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.provenance import describe
from fxwrap.wrapper_ir import template_choice
from fxwrap.wrapper_ir.built import BuiltProgram
from fxwrap.wrapper_ir.lowered import LoweredProgram
from fxwrap.wrapper_ir.origins import in_program_order

log = logging.getLogger("fxwrap.schedule")


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    """One kernel the renderer made: its loop IR, its source, the ATen nodes whose values
    it stores (``roots``) and why it did not join the kernel before it (``started_because``)."""

    scheduled: ScheduledKernel
    source: object  # targets.base.KernelSource
    roots: tuple[str, ...]
    started_because: str


@dataclasses.dataclass
class KernelLines:
    """A rendered kernel and the lines that allocate its outputs, define and launch it."""

    scheduled: ScheduledKernel
    source: object  # targets.base.KernelSource
    kernel: Kernel
    lines: list
    roots: tuple = ()  # the ATen nodes whose values it stores (extern calls if it cannot be built)


class Renderer:
    """A ``LoweredProgram`` -> the program's lines, through the steps fuse -> combine ->
    kernels -> legalize -> emit -> compile -> choose.  Given the items::

        Job((64, 128), stores=[Store('buf2', 128*x0 + x1, ...)], reductions=[...], roots=['softmax'])
        return (buf2,)

    ``render()`` returns a ``BuiltProgram`` whose lines are::

        buf2 = empty_strided((64, 128), (128, 1), dtype=torch.float32, device='cpu')
        # kernel fxwrap_reduction_0 (cpu): in_ptr0:input, out_ptr0:output
        fxwrap_reduction_0(arg0, buf2)
        return (buf2,)

    A kernel the emitter rejects (or the host compiler crashes on) raises ``RenderFailed``
    naming its ATen nodes; ``build.build_kernel_program`` lowers the graph again with them as
    extern calls.  Template choice (``template_choice``) reads the renderer's ``kernel_prefix``,
    ``session``, ``target``, ``hints``, ``buffers``, ``template_externs``, ``template_mode`` and
    ``template_timings`` and calls its ``kernel_lines`` and ``load_kernel``.
    """

    def __init__(self, lowered: LoweredProgram, session, timer: logs.PhaseTimer, label: str = "program"):
        self.lowered = lowered
        self.session = session
        self.target = session.target
        self.timer = timer
        self.label = label
        self.kernel_prefix = lowered.settings.kernel_prefix
        self.template_mode = session.template_mode
        self.template_externs = lowered.template_externs
        self.hints = lowered.hints
        self.buffers = dict(lowered.buffers)  # and the workspaces the kernels declare
        self._names = itertools.count(lowered.next_name)
        # template groups' candidate times of this program, by group key (template_choice.time_candidates)
        self.template_timings: dict[str, dict[str, float]] = {}
        self._launchers: dict[int, object] = {}  # id(KernelSource) -> its launcher, loaded once
        self._emitter = session.new_emitter(self.hints)  # example sizes (autotuning of symbolic kernels)
        self.built = BuiltProgram(list(lowered.inputs), [], dict(lowered.constants), dict(lowered.fake_values),
                                  dict(lowered.symbol_hints), size_assumptions=list(lowered.size_assumptions))

    def fresh(self, prefix: str) -> str:
        """A buffer name the lowerer did not give (it numbers on from the lowerer's)."""
        return f"{prefix}{next(self._names)}"

    def in_program_order(self, origins):
        return in_program_order(origins, self.lowered.positions)

    def render(self) -> BuiltProgram:
        """The program's lines and kernels (``BuiltProgram``)."""
        built = self.built
        with self.timer.phase("schedule"):
            limits = self._emitter.combo_kernels
            items = fuse(list(self.lowered.items), limits.max_arguments if limits is not None else None)
            needed = referenced_outside(items, buffers_read)
            inputs = {b.name for b in built.inputs if isinstance(b, Buffer)}
            # what each kernel stores for good: what others read, and the program's inputs
            kept = {id(g): needed[id(g)] | {s.buffer for s in g.stores if s.buffer in inputs}
                    for g in items if isinstance(g, Group)}
            # independent pointwise kernels of other sizes as one launch (core/combo.py)
            items = combine(items, limits, kept)
        with self.timer.phase("render"):
            rendered = self._render(items, needed, built)
        with self.timer.phase("compile kernels"):
            # every kernel known now at once: the plain kernels and the template candidates
            # that will be timed (their compiles overlap; timing then runs on a quiet machine)
            self._load_each([entry[1] for entry in rendered if isinstance(entry, tuple) and entry[1] is not None]
                            + [made for entry in rendered if isinstance(entry, template_choice.Candidates)
                               for made in entry.kernels_to_time()])
        with self.timer.phase("template choice"):
            lines, loads = self._choose(rendered, built)
        with self.timer.phase("compile kernels"):
            self._load_each([made for made, _ in loads])
            for made, _ in loads:
                made.kernel.bind(self._launchers[id(made.source)])
        built.lines = lines
        return built

    def _render(self, items, needed, built) -> list:
        """Each item rendered, in program order: a line as it is, a group as ``(group,
        KernelLines or None when it stores nothing)``, a template group as its
        ``template_choice.Candidates``."""
        inputs = {b.name for b in built.inputs if isinstance(b, Buffer)}
        emitter = self._emitter
        rendered: list = []
        count = 0
        for item in items:
            if isinstance(item, ComboGroup):
                made = self.combo_lines(item, count, needed, inputs)
                rendered += made if made is not None else [
                    (member, self.kernel_lines(member, f"{self.kernel_prefix}_pointwise_{count}_{i}",
                                               needed[id(member)], inputs, emitter.render))
                    for i, member in enumerate(item.members)]
                count += 1
                continue
            if not isinstance(item, Group):
                rendered.append(item)
                continue
            keep = needed[id(item)]
            if item.template is not None:
                rendered.append(template_choice.candidates(self, item, keep, inputs, count, emitter))
                count += 1
                continue
            kind = "scan" if any(r.is_scan for r in item.reductions) else \
                "reduction" if item.reductions else "pointwise"
            rendered.append((item, self.kernel_lines(item, f"{self.kernel_prefix}_{kind}_{count}", keep, inputs,
                                                     emitter.render)))
            count += 1
        return rendered

    def _choose(self, rendered: list, built) -> tuple[list, list]:
        """The program's lines from the rendered items (each template group's candidate
        chosen, ``template_choice.decide``) and the ``(KernelLines, group)`` to bind."""
        lines: list[Line] = []
        loads: list = []
        for entry in rendered:
            if isinstance(entry, template_choice.Candidates):
                for made in template_choice.decide(self, entry, self._emitter):
                    self._add_kernel(made, entry.group, lines, loads, built)
            elif isinstance(entry, tuple):
                group, made = entry
                if made is not None:
                    self._add_kernel(made, group, lines, loads, built)
            else:
                lines.append(entry)
        return lines, loads

    def load_kernel(self, source):
        """``source``'s launcher (``KernelSource``), loaded once per program."""
        launcher = self._launchers.get(id(source))
        if launcher is None:
            self._launchers[id(source)] = launcher = self._emitter.load(source)
        return launcher

    def _load_each(self, kernels: list) -> None:
        """Load (compile) the launchers of ``kernels`` (``KernelLines``) not loaded yet,
        ``emitter.load_threads`` at once (see ``_load_all``)."""
        todo, seen = [], set()
        for made in kernels:
            if id(made.source) not in self._launchers and id(made.source) not in seen:
                seen.add(id(made.source))
                todo.append(made.source)
        try:
            launchers = _load_all(self._emitter, todo, self.label)
        except Exception as crash:  # noqa: BLE001  (a compiler crash: which kernel, each alone)
            if not compiler_crashed(crash):
                raise
            for made in kernels:
                try:
                    self._emitter.load(made.source)
                except Exception as error:  # noqa: BLE001
                    if compiler_crashed(error):
                        raise RenderFailed(made.roots, error) from crash
                    raise
            raise
        for source, launcher in zip(todo, launchers):
            self._launchers[id(source)] = launcher

    def combo_lines(self, combo: ComboGroup, count: int, needed: dict, inputs: set) -> "list | None":
        """A combo group -> its members' legalized ``ScheduledKernel``s -> the emitter's
        ``render_combo`` -> ``[(combo, KernelLines)]`` (one member storing something:
        ``[(member, KernelLines)]``); None where the emitter renders no kernel of them."""
        name = f"{self.kernel_prefix}_combo_{count}"
        members, groups = [], []
        for i, group in enumerate(combo.members):
            sk = self.scheduled(group, f"{name}_m{i}", needed[id(group)], inputs)
            if sk.stores:
                members.append(sk)
                groups.append(group)
        if len(members) < 2:
            return [(g, self.kernel_lines(g, f"{self.kernel_prefix}_pointwise_{count}", needed[id(g)], inputs,
                                          self._emitter.render)) for g in groups]
        kernel = ComboKernel(name, tuple(members))
        try:
            source = self._emitter.render_combo(kernel)
        except EmitError as exc:
            raise RenderFailed(combo.roots, exc) from exc
        if source is None:
            return None
        return [(combo, self._lines(kernel, source, inputs, tuple(combo.roots)))]

    def scheduled(self, group: Group, name: str, keep: set, inputs: set) -> ScheduledKernel:
        """Group -> its legalized ``ScheduledKernel`` (no stores: nothing to compute)."""
        sk = to_kernel(group, name, keep, self.buffers, inputs)
        sk = dataclasses.replace(sk, origins=self.in_program_order(sk.origins))
        sk = legalize(sk, self.session.numerics)  # explicit compute dtypes, casts and 16-bit rounding
        roots = self.lowered.roots
        root = {b.name: roots.get(b.name, b).name for b in (*sk.inputs, *sk.outputs)}
        sharing = collections.Counter(root.values())
        written = {root[b.name] for b in sk.outputs}
        shared = tuple(sorted(name for name, r in root.items() if sharing[r] > 1 and r in written))
        if shared:  # a view of a buffer it writes, read as an input: its pointers alias
            sk = dataclasses.replace(sk, shared_storage=shared)
        return sk

    def kernel_lines(self, group: Group, name: str, keep: set, inputs: set, render) -> "KernelLines | None":
        """Group -> legalized ``ScheduledKernel`` -> ``render(sk)`` (a ``KernelSource``) -> its
        ``Allocate`` / ``DefineKernel`` / ``CallKernel`` lines; None when it stores nothing."""
        sk = self.scheduled(group, name, keep, inputs)
        if not sk.stores:
            return None
        try:
            source = render(sk)
        except EmitError as exc:
            raise RenderFailed(group.roots, exc) from exc
        return self._lines(sk, source, inputs, tuple(group.roots))

    def _lines(self, sk, source, inputs: set, roots: tuple) -> KernelLines:
        """A rendered kernel (a ``ScheduledKernel`` or ``ComboKernel``) -> its ``Allocate`` /
        ``DefineKernel`` / ``CallKernel`` lines."""
        # an indexed store's buffer holds its values already (it writes only some elements)
        written = {st.buffer for st in sk.stores if st.indexed}
        new = [Allocate(out) for out in sk.outputs if out.name not in inputs and out.name not in written]
        workspaces = self._workspaces(sk, source, new)
        signature = tuple([KernelArg(b.name, "input") for b in sk.inputs]
                          + [KernelArg(b.name, "output") for b in sk.outputs]
                          + [KernelArg(b.name, "workspace") for b in workspaces]
                          + [KernelArg(s.name, "size") for s in sk.size_symbols])
        kernel = Kernel(sk.name, source.text, self.target.name, signature, source.launch,
                        loader=self.session.kernel_loader)
        new += [DefineKernel(kernel),
                CallKernel(kernel, (*sk.inputs, *sk.outputs, *workspaces, *sk.size_symbols), origins=sk.origins)]
        return KernelLines(sk, source, kernel, new, roots)

    def _workspaces(self, sk: ScheduledKernel, source, lines: list) -> list[Buffer]:
        """The scratch buffers ``source`` declares (``targets.base.Workspace``), each a
        buffer of its own allocated by an ``Allocate`` line (a zero fill after it where
        the kernel needs zeros) appended to ``lines``; the memory planner frees it after
        the launch, its last use."""
        out = []
        device = (sk.outputs or sk.inputs)[0].device
        for ws in getattr(source, "workspaces", ()):
            size = sympy.sympify(ws.numel)
            stray = size.free_symbols - set(sk.size_symbols)
            if stray:
                raise EmitError(f"kernel {sk.name}: its workspace size {size} uses {sorted(map(str, stray))}, "
                                f"which are not size arguments of the kernel (target {self.target.name})")
            buf = Buffer(self.fresh("ws"), (size,), (sympy.Integer(1),), ws.dtype, device)
            self.buffers[buf.name] = buf
            lines.append(Allocate(buf))
            if ws.zeroed:
                lines.append(ZeroFill(buf))
            out.append(buf)
        return out

    def _add_kernel(self, made, group: Group, lines: list, loads: list, built) -> None:
        """Append a candidate's lines; a kernel's launcher is bound with the others at the end."""
        if not isinstance(made, KernelLines):  # lines without a kernel (an extern call, a choice)
            lines.extend(made)
            return
        lines.extend(made.lines)
        loads.append((made, group))
        built.kernels.append(KernelRecord(made.scheduled, made.source, tuple(group.roots), group.started_because))
        _log_kernel(made.scheduled, made.source, group)



def _log_kernel(sk: ScheduledKernel, source, group: Group) -> None:
    """The schedule, lowering and kernels stages' records of one kernel (when enabled)."""
    if logs.enabled("schedule"):
        logs.logger("schedule").debug("%s <- %s\n  stores the values of %s\n  a new kernel: %s", sk.name,
                                      describe(sk.origins), ", ".join(group.roots), group.started_because)
    if logs.enabled("lowering"):
        logs.logger("lowering").debug("%s", format_loop_ir(sk))
    if logs.enabled("kernels"):
        logs.logger("kernels").debug("%s (%s):\n%s", sk.name, source.language, source.text)


def _load_all(emitter, sources: list, label: str = "program") -> list:
    """The launchers of ``sources`` (``KernelSource``), ``emitter.load_threads`` of them at once
    (loading waits on compiler subprocesses: Triton's ptxas, g++), with a progress bar on a
    terminal when there are more than a handful."""
    if not sources:
        return []
    threads = min(int(getattr(emitter, "load_threads", 1) or 1), len(sources))
    if len(sources) > 1:
        emitter.load_ahead(sources)  # e.g. the C++ kernels in a few translation units
    with Progress(len(sources), label) as progress:
        def load(source):
            launcher = emitter.load(source)
            progress.advance()
            return launcher

        if threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(threads, thread_name_prefix="fxwrap-load") as pool:
                return list(pool.map(load, sources))
        return [load(source) for source in sources]


class RenderFailed(Exception):
    """The emitter rejected (or the host compiler crashed on) the kernel fused from ``nodes``
    (ATen node names)."""

    def __init__(self, nodes, error):
        super().__init__(str(error))
        self.nodes, self.error = tuple(nodes), error
