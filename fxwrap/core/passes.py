"""The declared passes: fxwrap's ATen-graph passes and Wrapper-IR passes, as data.

Two stages of the pipeline (``fxwrap.core.pipeline``) run passes: ``aten passes`` rewrites
the ATen graph in place before the program cache is asked (the key is the rewritten graph,
and the pass names are part of it); ``wrapper passes`` rewrites the rendered lines before
they become a GraphModule.  fxwrap's own lists::

    >>> default_aten_passes().names()  # doctest: +NORMALIZE_WHITESPACE
    ['follow input layouts', 'constant folding', 'channels-last convolutions', 'matmul padding',
     'convolution bias', 'patterns', 'grouped attention']
    >>> default_wrapper_passes().names()
    ['overlap collectives', 'memory plan']

Each pass decides for itself whether it applies (the channels-last pass only where the
device asks for it, the matmul padding only on inference and forward graphs ...).  A plugin
edits them through the ``fxwrap_pipeline(pipeline, target, options)`` hook
(``pipeline.insert_after("matmul padding", GraphPass(...))``; ``pipeline.aten`` and
``pipeline.wrapper`` are ``PassList``s with ``insert_after``, ``insert_before``,
``move_before``, ``move_after`` and ``remove_named``).  The Wrapper-IR list must keep
``"memory plan"`` (it gives the program its ``MemoryPlan``); a pass before it sees lines
without ``Free`` / ``Reuse``, a pass after it must keep the plan valid.  Nested programs
(``torch.cond`` branches, loop bodies) go through the same Wrapper-IR list.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from fxwrap.core import patterns
from fxwrap.core.capture import saved_activation_outputs
from fxwrap.core.grouped_attention import grouped_decode_attention
from fxwrap.core.constant_folding import fold_constants
from fxwrap.core.convolution_bias import bias_as_epilogue
from fxwrap.core.layout import (channels_last_convolutions, follow_input_layouts, half_precision_convolutions,
                                 has_channels_last_convolution)
from fxwrap.core.matmul_padding import pad_matmul_columns
from fxwrap.core.memory import MemoryPlan, plan_memory
from fxwrap.core.overlap import overlap_collectives
from fxwrap.ir.capabilities import Capabilities

log = logging.getLogger("fxwrap")


class PassOptions(Protocol):
    """The compile options ATen-graph passes read (``plugins.session.CompileOptions`` has them)."""

    kernels: bool
    templates: str
    cache_weight_layouts: bool
    cuda_graphs: bool


class PassSession(Protocol):
    """What an ATen-graph pass reads of the compile session (``plugins.session.CompileSession``)."""

    @property
    def options(self) -> PassOptions: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def generates_kernels(self) -> bool: ...

    @property
    def active_templates(self) -> tuple: ...


@dataclass
class AtenGraph:
    """What an ATen-graph pass sees: the graph (rewrite ``gm`` in place) and its context.

    ``kind``: ``"inference"``, ``"forward"`` or ``"backward"``; ``session``: the compile
    session (``options``, ``capabilities``, ``templates``, ``generates_kernels``);
    ``example_inputs``: AOTAutograd's example inputs (a backward graph's saved activations
    in the strides the compiled forward returns them in), or None; ``saved_outputs``: a
    forward graph's outputs saved for the backward (a ``range``), or None."""

    gm: torch.fx.GraphModule
    kind: str
    session: PassSession
    example_inputs: Sequence[Any] | None = None
    saved_outputs: range | None = None

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, kind: str, session: PassSession, example_inputs: Sequence[Any] | None = None) -> "AtenGraph":
        """The graph AOTAutograd gave (a forward graph's saved activations read from it)."""
        return cls(gm, kind, session, example_inputs, saved_activation_outputs(gm) if kind == "forward" else None)

    @property
    def makes_kernels(self) -> bool:
        """The session's target generates kernels and the options let it."""
        return bool(self.session.generates_kernels and self.session.options.kernels)


@dataclass
class WrapperProgram:
    """What a Wrapper-IR pass sees besides the lines: the size hints, whether storage may be
    reused, and the memory plan once ``"memory plan"`` made it."""

    hints: dict
    reuse: bool = True
    memory: MemoryPlan | None = None


@dataclass(frozen=True)
class GraphPass:
    """An ATen-graph pass: ``run(graph: AtenGraph) -> None`` rewrites ``graph.gm`` in place.
    ``phase``: the phase it is timed under (``FXWRAP_LOG=timing``)."""

    name: str
    run: Callable[[AtenGraph], Any]
    phase: str = "passes"


@dataclass(frozen=True)
class LinesPass:
    """A Wrapper-IR pass: ``run(lines, program: WrapperProgram) -> lines``."""

    name: str
    run: Callable[[list, WrapperProgram], list]
    phase: str = "wrapper passes"

    @classmethod
    def of(cls, fn: Callable[[list], list], name: str | None = None) -> "LinesPass":
        """A callable ``pass(lines) -> lines`` as a ``LinesPass`` (named after it by default)."""
        if name is None:
            name = fn.__name__ if hasattr(fn, "__name__") else type(fn).__name__
        return cls(name, lambda lines, program: fn(lines))


class PassList(list):
    """A list of passes, found by name: ``passes.insert_after("matmul padding", p)``."""

    def names(self) -> list[str]:
        return [p.name for p in self]

    def index_of(self, name: str) -> int:
        for i, p in enumerate(self):
            if p.name == name:
                return i
        raise KeyError(f"no pass named {name!r}; the passes are {self.names()}")

    def insert_before(self, name: str, new) -> None:
        self.insert(self.index_of(name), new)

    def insert_after(self, name: str, new) -> None:
        self.insert(self.index_of(name) + 1, new)

    def remove_named(self, name: str):
        return self.pop(self.index_of(name))

    def move_before(self, name: str, before: str) -> None:
        """Move pass ``name`` just before pass ``before``."""
        moved = self.remove_named(name)
        self.insert_before(before, moved)

    def move_after(self, name: str, after: str) -> None:
        moved = self.remove_named(name)
        self.insert_after(after, moved)


def run_wrapper_passes(passes: Sequence[LinesPass], lines: list, program: WrapperProgram,
                       timer=None) -> tuple[list, MemoryPlan]:
    """``lines`` through ``passes`` in order; the lines and the memory plan made on the way."""
    for p in passes:
        if timer is None:
            lines = list(p.run(lines, program))
        else:
            with timer.phase(p.phase):
                lines = list(p.run(lines, program))
    if program.memory is None:
        raise ValueError(f"the Wrapper-IR passes {[p.name for p in passes]} made no memory plan "
                         f"(the {MEMORY_PLAN!r} pass)")
    return lines, program.memory


# -- fxwrap's passes ------------------------------------------------------------------------

def _follow_input_layouts(graph: AtenGraph) -> None:
    """A backward graph reads its inputs in the layout the compiled forward returns them in."""
    if graph.kind != "backward" or graph.example_inputs is None:
        return
    channels_last = graph.session.capabilities.convolution_layout == "channels_last"
    follow_input_layouts(graph.gm, graph.example_inputs,
                         channels_last and _restrided_channels_last(graph.gm, graph.example_inputs))


def _channels_last(graph: AtenGraph) -> None:
    """Inference and forward graphs with 2-D convolutions run channels-last where the device
    asks for it (``Capabilities.convolution_layout``)."""
    if graph.session.capabilities.convolution_layout != "channels_last" or graph.kind not in ("inference", "forward"):
        return
    if _takes_layout_pass(graph):
        options = graph.session.options
        channels_last_convolutions(graph.gm, saved_outputs=graph.saved_outputs or (),
                                   # a recorded graph replays the convolution on the copy without
                                   # asking the cache whether the parameter changed
                                   cache_weights=graph.kind == "inference" and options.cache_weight_layouts
                                   and not options.cuda_graphs)


def _constant_folding(graph: AtenGraph) -> None:
    """What depends on no input (tensor constants, a mask built from ``arange``s) computed
    now, once (``fxwrap.core.constant_folding``)."""
    fold_constants(graph.gm)


def _convolution_bias(graph: AtenGraph) -> None:
    """A convolution's bias added by the kernel after it where the device's call would add it
    in a pass of its own (``Capabilities.convolution_bias == "epilogue"``)."""
    if graph.session.capabilities.convolution_bias == "epilogue" and graph.kind in ("inference", "forward") \
            and graph.makes_kernels:
        bias_as_epilogue(graph.gm)


def _matmul_padding(graph: AtenGraph) -> None:
    """Matrix products padded to the device's alignment (``Capabilities.matmul_alignment_bytes``)."""
    alignment = graph.session.capabilities.matmul_alignment_bytes
    if alignment and graph.kind in ("inference", "forward") and graph.makes_kernels:
        outputs = next(n for n in graph.gm.graph.nodes if n.op == "output").args[0]
        count = len(outputs) if isinstance(outputs, (tuple, list)) else 1
        keep = range(count) if graph.kind == "inference" else (graph.saved_outputs or ())
        pad_matmul_columns(graph.gm, alignment, keep_outputs=keep)


def _patterns(graph: AtenGraph) -> None:
    """The rewrites of ``fxwrap.core.patterns`` that the session's templates ask for: the
    dequantize-and-linear pattern becomes ``_weight_int8pack_mm`` where a template of the
    session computes that op and asks for the rewrite (``Template.pattern_refusal``), and only
    where ATen's own kernel of it (the template's fallback and rival) runs on the device and is
    exact for the shapes, or where the template promises to compute every call it asks for
    (``Template.pattern_guarantee``: then it is the op's only kernel)."""
    session = graph.session
    if not graph.makes_kernels or session.options.templates == "off":
        return
    templates = [t for t in session.active_templates if patterns.INT8_MM in t.ops]
    if not templates:
        return

    def allow(x, w, scale) -> bool:
        aten_ok = patterns.aten_int8_mm_refusal(x.dtype, x.shape[-1], x.device.type, x.is_contiguous()) is None
        return any(t.pattern_refusal(patterns.INT8_MM, (x, w, scale)) is None and (aten_ok or t.pattern_guarantee)
                   for t in templates)

    patterns.int8_weight_only_linears(graph.gm, allow)


def _grouped_attention(graph: AtenGraph) -> None:
    """One-position attention over grouped KV heads without repeating the keys and values
    (``fxwrap.core.grouped_attention``): inference and forward graphs."""
    if graph.kind in ("inference", "forward"):
        grouped_decode_attention(graph.gm)


def _takes_layout_pass(graph: AtenGraph) -> bool:
    """Whether an inference or forward graph goes channels-last.  A forward graph only where
    AOTAutograd says which outputs are saved activations and every input is of static shape:
    the backward graph is compiled for the strides the forward reports, which must be numbers."""
    if graph.kind == "inference":
        return True
    gm = graph.gm
    wanted = graph.session.capabilities.training_convolution_layout
    if wanted not in ("channels_last", "channels_last_half"):
        log.info("channels-last layout not applied to the forward graph: the device does not ask for "
                 "it in training (capabilities().training_convolution_layout)")
        return False
    if not has_channels_last_convolution(gm):
        return False
    if wanted == "channels_last_half" and not half_precision_convolutions(gm):
        log.info("channels-last layout not applied to the forward graph: the device asks for it only "
                 "where every convolution is float16/bfloat16 (training_convolution_layout="
                 "'channels_last_half'), and this graph convolves another dtype")
        return False
    if graph.saved_outputs is None:
        log.info("channels-last layout not applied to the forward graph: no AOTAutograd metadata "
                 "says which outputs are saved for the backward")
        return False
    dynamic = [n.name for n in gm.graph.nodes if n.op == "placeholder"
               and isinstance(v := n.meta.get("val"), (torch.Tensor, torch.SymInt))
               and not all(isinstance(s, int) for s in (v.shape if isinstance(v, torch.Tensor) else (v,)))]
    if dynamic:
        log.info("channels-last layout not applied to the forward graph: inputs %s have symbolic "
                 "sizes, and the backward graph needs the saved activations' strides as numbers",
                 ", ".join(dynamic))
        return False
    return True


def _restrided_channels_last(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether one of a backward graph's inputs comes channels-last where it was traced
    otherwise: the forward graph went channels-last, and the backward follows."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, given in zip(placeholders, example_inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and isinstance(given, torch.Tensor) and given.dim() == 4 \
                and given.stride() != val.stride() and given.is_contiguous(memory_format=torch.channels_last):
            return True
    return False


def _memory_plan(lines: list, program: WrapperProgram) -> list:
    """``Free`` after each last use and ``Reuse`` where it never raises the peak (``core.memory``)."""
    program.memory = plan_memory(lines, program.hints, reuse=program.reuse)
    return program.memory.lines


MEMORY_PLAN = "memory plan"


def _overlap_collectives(lines: list, program: WrapperProgram) -> list:
    """Each collective raised to its inputs, each wait sunk to its first reader (``core.overlap``)."""
    return overlap_collectives(lines)


def default_aten_passes() -> PassList:
    """fxwrap's ATen-graph passes, in order, before any plugin edits them."""
    return PassList([
        GraphPass("follow input layouts", _follow_input_layouts, "layout"),
        GraphPass("constant folding", _constant_folding, "constant folding"),
        GraphPass("channels-last convolutions", _channels_last, "layout"),
        GraphPass("matmul padding", _matmul_padding, "layout"),
        GraphPass("convolution bias", _convolution_bias, "layout"),
        GraphPass("patterns", _patterns, "patterns"),
        GraphPass("grouped attention", _grouped_attention, "patterns"),
    ])


def default_wrapper_passes() -> PassList:
    """fxwrap's Wrapper-IR passes, in order, before any plugin edits them."""
    return PassList([
        LinesPass("overlap collectives", _overlap_collectives, "wrapper passes"),
        LinesPass(MEMORY_PLAN, _memory_plan, "memory plan"),
    ])
