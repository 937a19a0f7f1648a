"""Which candidate computes a template group: a template (with the epilogue fused) or
the ATen extern (the op's call, then the epilogue as a pointwise kernel).

``candidates(renderer, group, ...)`` renders every candidate, and ``decide`` under
``templates="auto"`` times them on the size hints with fresh random inputs, interleaved round by round
(the order turning each round), each candidate's time its fastest round (``time_candidates``),
with the group's times cached on disk together (``core.templates.TimingCache``; ``FXWRAP_RETUNE=1``
measures again).
The extern wins ties, and a template is chosen only when it is faster by more than
``TEMPLATE_MIN_GAIN`` (the noise between two timings of one candidate), in a second series of
rounds too (``CONFIRM``: each candidate's time is then its fastest round of both): the ATen call
is what eager runs, and a one-off slow stretch of its rounds on a loaded machine (the CPU's
``addmm`` + epilogue measured 0.259 ms in one process against 0.211 in eight others, the
template 0.240 in all) must not put a slower template into a program, nor into the cache.
The ``autotune`` log (``FXWRAP_LOG=autotune``) says what was chosen and by how much::

    fxwrap: aten.addmm.default (batch=1, m=64, n=512, k=256, float32): template cpp_gemm: 0.242 ms;
    extern aten.addmm.out + epilogue: 0.211 ms (chosen): the fastest template takes 1.147x the
    extern's time (a template needs <= 0.970x); measured now
The lines it returns for ``relu(linear(x, w, b))`` when the template wins::

    buf2 = empty_strided((128, 3072), (3072, 1), dtype=torch.float32, device='cpu')
    # template cpp_gemm: 0.212 ms (chosen); extern aten.addmm + epilogue: 0.251 ms
    # kernel fxwrap_template_0 (cpu): arg0:input, buf0:input, arg2:input, buf2:output
    fxwrap_template_0(arg0, buf0, arg2, buf2)

and when the extern wins::

    buf1 = empty_strided((128, 3072), (3072, 1), dtype=torch.float32, device='cpu')
    # template cpp_gemm: 0.301 ms; extern aten.addmm + epilogue: 0.251 ms (chosen)
    aten.mm.out(arg0, buf0, out=buf1)
    buf2 = ...
    fxwrap_pointwise_0(arg2, buf1, buf2)

(the extern is the op's own call: ``addmm`` stays ``aten.addmm.out`` when its bias is
all the epilogue there is; otherwise ``aten.addmm.out`` and the rest of the epilogue
over its result.)
"""
from __future__ import annotations

import dataclasses
import logging

import sympy
import torch

from fxwrap.core import logs
from fxwrap.ir.loops import Op, OpCode, Store, rewrite, walk
from fxwrap.core.scheduler import Group
from fxwrap.ir.symbolic import contiguous_strides, evaluate, storage_elements
from fxwrap.core.templates import TemplateChoiceRecord, TimingCache
from fxwrap.ir.lines import Buffer, CallExtern, TemplateChoice, View
from fxwrap.wrapper_ir.layouts import buffers_in_values, flatten

log = logging.getLogger("fxwrap")

EXTERN = "extern"

#: a template's time must be below ``(1 - TEMPLATE_MIN_GAIN)`` times the extern's to be
#: chosen: round-to-round timings of one candidate differ by 1-3% on a GPU or a quiet CPU,
#: so a smaller win is as likely a loss at run time (a 1% win at compile time measured
#: 6% slower on the H200).
TEMPLATE_MIN_GAIN = 0.03


@dataclasses.dataclass
class Candidates:
    """One template group's candidates, rendered (``candidates``) and not yet chosen
    (``decide``): each template's ``KernelLines``, the extern's lines and its epilogue
    kernel, and the timing-cache keys of all of them."""

    group: Group
    count: int
    candidates: list  # (template name, KernelLines)
    extern: list      # [extern lines (a list of lines), epilogue KernelLines?]
    extern_lines: list
    extern_label: str
    reasons: dict     # template name -> why it refused the call
    unsafe: dict      # template name -> why the extern must not run
    keys: dict        # candidate name -> its timing-cache key ({} when nothing is timed)

    @property
    def timed(self) -> bool:
        return bool(self.keys)

    def kernels_to_time(self) -> list:
        """The ``KernelLines`` that timing will run (each template's and the epilogue kernel)."""
        if not self.timed:
            return []
        return [made for _, made in self.candidates] + [part for part in self.extern[1:]]


def candidates(renderer, group: Group, keep: set, inputs: set, count: int, emitter) -> Candidates:
    """Render every candidate of template group ``group`` (kernels named from ``count``);
    nothing runs yet: the renderer compiles the kernels of every group's candidates
    at once (``Candidates.kernels_to_time``) before any group is timed (``decide``)."""
    call = group.template
    prefix = renderer.kernel_prefix
    made_templates: list[tuple[str, object]] = []
    reasons: dict[str, str] = {}
    for template in renderer.session.active_templates:
        if call.op not in template.ops:
            continue
        why = template.refusal(call)
        if why is not None:
            reasons[template.name] = why
            continue
        made = renderer.kernel_lines(group, f"{prefix}_template_{count}", keep, inputs,
                                    lambda sk, t=template: t.render(sk, emitter))
        if made is None:  # the group's values are all kept by other lines: no kernel to time
            reasons[template.name] = "its kernel would store nothing"
            continue
        made_templates.append((template.name, made))
    extern_lines = list(renderer.template_externs[call.output.name])
    epilogue = epilogue_group(group)
    views = _copies_as_views(renderer, epilogue, call)  # a reshape of the result: a View, as without templates
    if views:
        epilogue.stores = [st for st in epilogue.stores if st.buffer not in {v.buf.name for v in views}]
        extern_lines = [*extern_lines, *views]
    epi_keep = (keep | {call.output.name}) - {call.output.name}
    epi = renderer.kernel_lines(epilogue, f"{prefix}_pointwise_{count}", epi_keep, inputs, emitter.render) \
        if epilogue.stores else None
    extern = [extern_lines] + ([epi] if epi is not None else [])
    aten_call = next(ln for ln in extern_lines if isinstance(ln, CallExtern))
    extern_label = f"{EXTERN} {aten_call.op}" + (" + epilogue" if epi is not None else "")
    unsafe = {t.name: why for t in renderer.session.active_templates
              if call.op in t.ops and t.name in dict(made_templates) and (why := t.extern_refusal(call)) is not None}
    timed = made_templates and renderer.template_mode != "always" and not unsafe
    keys = timing_keys(renderer, made_templates, extern) if timed else {}
    return Candidates(group, count, made_templates, extern, extern_lines, extern_label, reasons, unsafe, keys)


def decide(renderer, choice: Candidates, emitter) -> list:
    """The lines (``KernelLines`` or plain line lists, in order) of ``choice``'s chosen
    candidate, preceded by a ``TemplateChoice`` comment: the fastest on the size hints where
    the candidates are timed (the extern wins ties), else the first template."""
    call, prefix, count = choice.group.template, renderer.kernel_prefix, choice.count
    candidates, extern, extern_lines = choice.candidates, choice.extern, choice.extern_lines
    times: dict[str, float] = {}
    if not candidates:
        chosen = EXTERN
    elif not choice.timed:  # mode "always", or an extern that must not run: neither timed nor chosen
        chosen = candidates[0][0]
    else:
        times = time_candidates(renderer, emitter, candidates, extern)
        chosen = winner(times, [name for name, _ in candidates])
    parts = []
    for name, _ in candidates:
        ms = f": {times[name]:.3f} ms" if name in times else ""
        parts.append(f"template {name}{ms}" + (" (chosen)" if name == chosen else ""))
    ms = f": {times[EXTERN]:.3f} ms" if EXTERN in times else ""
    ms += "".join(f" (not run: {why})" for why in choice.unsafe.values())
    parts.append(f"{choice.extern_label}{ms}" + (" (chosen)" if chosen == EXTERN else ""))
    note = TemplateChoice("; ".join(parts), chosen, tuple(sorted(times.items())))
    record = TemplateChoiceRecord(f"{prefix}_template_{count}", call, chosen, dict(times), choice.reasons)
    renderer.built.template_choices.append(record)
    logs.logger("autotune").info("fxwrap: %s: %s%s", call.describe(), note.text, _margin_text(times, candidates))
    if chosen == EXTERN:
        at = next(i for i, ln in enumerate(extern_lines) if isinstance(ln, CallExtern))
        return [[*extern_lines[:at], note, *extern_lines[at:]], *extern[1:]]
    made = dict(candidates)[chosen]
    made.lines.insert(len(made.lines) - 1, note)  # just above the launch: its FX node gets the comment
    return [made]


def winner(times: dict[str, float], templates: list[str]) -> str:
    """The candidate ``times`` (name -> ms, ``EXTERN`` among them) choose: the fastest of
    ``templates`` where it takes less than ``1 - TEMPLATE_MIN_GAIN`` of the extern's time (equal
    times: the first listed), else ``EXTERN``."""
    best = min(templates, key=lambda n: (times[n], templates.index(n)))
    return best if times[best] < times[EXTERN] * (1 - TEMPLATE_MIN_GAIN) else EXTERN


def _margin_text(times: dict[str, float], candidates: list) -> str:
    """``": the fastest template takes 1.147x the extern's time (...)"`` for the log, or ``""``."""
    if not times or not candidates or not times.get(EXTERN):
        return ""
    ratio = min(times[name] for name, _ in candidates) / times[EXTERN]
    return (f": the fastest template takes {ratio:.3f}x the extern's time "
            f"(a template needs < {1 - TEMPLATE_MIN_GAIN:.3f}x)")


def epilogue_group(group: Group) -> Group:
    """The group's stores without the template: the op's result is read back from its
    buffer (the extern wrote it) wherever the epilogue used its value; its own store is
    dropped (the extern makes it)."""
    call = group.template
    own = next(st for st in group.stores if st.buffer == call.output.name)
    readback = Op.load(call.output.name, own.index, call.output.dtype)
    stores = []
    for st in group.stores:
        if st is own:
            continue
        value = rewrite(st.value, lambda node: readback if node is own.value else None)
        if any(n.op == OpCode.TEMPLATE_OUT for n in walk(value)):
            raise AssertionError(f"epilogue of {call.node} reads the template's accumulator outside its result")
        stores.append(Store(st.buffer, st.index, value))
    return dataclasses.replace(group, stores=stores, template=None, values={}, reductions=[])


# -- timing ----------------------------------------------------------------------
ROUNDS = 7
#: how many more series of rounds time a group whose first series chose a template (each
#: candidate's time is then its fastest round of all series): the extern stays unless the
#: template wins again
CONFIRM = 1
TARGET_SECONDS = 2e-3  # each timed sample runs the candidate this long at least
# stopping rule: after MIN_ROUNDS rounds, stop once the fastest candidate's best round is
# CLEAR_MARGIN times faster than every other's best (more rounds only lower a best a little:
# a shared machine's noise adds time)
MIN_ROUNDS = 3
CLEAR_MARGIN = 1.25


def timing_keys(renderer, candidates: list, extern: list) -> dict[str, str]:
    """``{candidate: key}`` of each template candidate and of the extern: what its time
    depends on (``_digest``: kernels without their names), the target, the device's model and
    features (``timing_identity``), the threads, the device's timing clock, torch's version
    (its ATen kernels are the extern) and the size hints."""
    hints = renderer.hints
    runs = {name: [made] for name, made in candidates}
    runs[EXTERN] = extern
    device = renderer.target.device
    clock, identity = device.timing_clock(), device.timing_identity()
    return {name: TimingCache.key("fxwrap template timing", renderer.target.name, torch.get_num_threads(), clock,
                                  [_digest(part, hints) for part in parts], sorted((str(k), v) for k, v in hints.items()),
                                  identity, torch.__version__)
            for name, parts in runs.items()}


def group_key(keys: dict[str, str]) -> str:
    """The timing-cache key of a group: its candidates' keys (``timing_keys``), by name."""
    return TimingCache.key("fxwrap template group", sorted(keys.items()))


def time_candidates(renderer, emitter, candidates: list, extern: list) -> dict[str, float]:
    """``{candidate: ms}`` (the fastest of ``ROUNDS`` rounds, ``MIN_ROUNDS`` when one is clearly fastest) of each
    template candidate and of the extern (``EXTERN``), on random inputs at the size hints,
    interleaved round by round, in ``1 + CONFIRM`` series where the first chose a template;
    the group's times are measured together and cached together, on disk and, for the
    renderer's program, in memory (a group equal to one timed before is not timed again,
    even with the disk cache off)."""
    hints = renderer.hints
    cache = TimingCache()
    runs = {name: [made] for name, made in candidates}
    runs[EXTERN] = extern
    key = group_key(timing_keys(renderer, candidates, extern))
    seen = renderer.template_timings  # this program's timings, by group key
    times = seen.get(key)
    if times is None:
        times = cache.get(key)
        if times is not None:
            logs.logger("autotune").info("fxwrap: template timings read from the timing cache (%s); FXWRAP_RETUNE=1 "
                                         "measures them again", cache.root / f"{key}.json")
    if times is None or set(times) != set(runs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily(), torch.no_grad():
            load = renderer.load_kernel  # each kernel loaded once per program
            times = measure_group(runs, load, hints, renderer.target, [name for name, _ in candidates])
        cache.put(key, times)
    seen[key] = times
    return times


def measure_group(runs: dict, load, hints: dict, target, templates: list[str]) -> dict[str, float]:
    """Each candidate's fastest round over one series of ``_measure``, and ``CONFIRM`` more
    where the series so far choose a template (``winner``)."""
    times = _measure(runs, load, hints, target)
    for _ in range(CONFIRM):
        if winner(times, templates) == EXTERN:
            break
        again = _measure(runs, load, hints, target)
        times = {name: min(ms, again[name]) for name, ms in times.items()}
    return times


def _copies_as_views(renderer, epilogue: Group, call) -> list:
    """``View`` lines for the epilogue's stores that only copy the op's result into a
    row-major buffer of the same elements (a reshape: the ``(B, T, N)`` view of a 3-D
    linear's ``(B*T, N)`` product) -- the extern candidate views the result there instead."""
    out = call.output
    if tuple(out.stride) != tuple(contiguous_strides(out.size)):
        return []
    views = []
    for st in epilogue.stores:
        v = st.value
        if not (v.op == OpCode.LOAD and v.arg[0] == out.name and not v.src and v.arg[1] == st.index):
            continue
        buf = renderer.buffers.get(st.buffer)
        if buf is None or tuple(buf.stride) != tuple(contiguous_strides(buf.size)) or buf.dtype != out.dtype:
            continue
        views.append(View(buf, out))
    return views


def _digest(part, hints) -> tuple:
    """What a candidate's time depends on: a kernel's source without its comment header
    and with its name generic; an extern line's op and operand layouts."""
    if hasattr(part, "source"):
        text = "\n".join(ln for ln in part.source.text.splitlines() if not ln.startswith("//"))
        return ("kernel", text.replace(part.scheduled.name, "KERNEL"))
    out = []
    for line in part:
        if isinstance(line, CallExtern):
            layouts = [(tuple(map(str, b.size)), tuple(map(str, b.stride)), str(b.dtype))
                       for b in buffers_in_values(line.args, line.kwargs)]
            out.append((str(line.op), layouts, repr([v for v in flatten((line.args, line.kwargs))
                                                       if not isinstance(v, Buffer)])))
    return ("extern", tuple(out))


def _clear_winner(samples: dict[str, list[float]]) -> bool:
    """The fastest best round is ``CLEAR_MARGIN`` times faster than each other best round."""
    best = sorted(min(s) for s in samples.values())
    return len(best) < 2 or best[1] >= CLEAR_MARGIN * best[0]


def _measure(runs: dict, load, hints: dict, target) -> dict[str, float]:
    tensors: dict[str, torch.Tensor] = {}
    gen = torch.Generator().manual_seed(0)

    def tensor(buf: Buffer) -> torch.Tensor:
        t = tensors.get(buf.name)
        if t is None:
            size = [evaluate(n, hints) for n in buf.size]
            stride = [evaluate(s, hints) for s in buf.stride]
            # the values fill the storage the layout spans, then the layout views it: an
            # expanded input (stride 0) has elements that share one location, which a copy
            # into the strided tensor refuses
            span = [int(evaluate(storage_elements(buf.size, buf.stride), hints))]
            if buf.dtype.is_floating_point:
                storage = torch.randn(span, generator=gen).to(buf.dtype)
            elif buf.dtype == torch.bool:
                storage = torch.ones(span, dtype=torch.bool)
            else:
                storage = torch.randint(0, 2, span, generator=gen).to(buf.dtype)
            t = storage.to(buf.device).as_strided(size, stride)
            tensors[buf.name] = t
        return t

    def value(v):
        if isinstance(v, Buffer):
            return tensor(v)
        if isinstance(v, sympy.Basic):
            return evaluate(v, hints)
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v

    steps: dict[str, list] = {}
    for name, parts in runs.items():
        calls = []
        for part in parts:
            if hasattr(part, "source"):
                launcher = load(part.source)
                args = [value(a) for a in part.lines[-1].args]
                calls.append((launcher, args, {}))
            else:
                for line in part:
                    if isinstance(line, CallExtern):
                        calls.append((line.op, [value(a) for a in line.args], {k: value(v) for k, v in line.kwargs}))
        steps[name] = calls
    device = next(iter(tensors.values())).device if tensors else torch.device("cpu")

    def run(calls, n: int) -> float:
        def once():
            for fn, args, kwargs in calls:
                fn(*args, **kwargs)
        return target.device.time_calls(once, n, device)  # the device's own clock where it has one

    reps = {}
    for name, calls in steps.items():
        run(calls, 1)  # warm up (first touch, lazy init)
        once = run(calls, 1)
        reps[name] = max(1, min(100, int(TARGET_SECONDS / max(once, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for done in range(1, ROUNDS + 1):
        turn = (done - 1) % len(names)  # who goes first turns round by round: no candidate always follows another
        for name in names[turn:] + names[:turn]:
            samples[name].append(run(steps[name], reps[name]))
        if done >= MIN_ROUNDS and _clear_winner(samples):
            break
    # the fastest round: other processes on the machine only ever add time (a shared CPU's
    # medians swing 2x between candidates run a moment apart)
    return {name: min(s) * 1e3 for name, s in samples.items()}
