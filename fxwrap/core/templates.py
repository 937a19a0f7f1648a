"""Templates: hand-written kernels for whole ATen ops (GEMMs), with the scheduler's
pointwise work fused around them as an epilogue.

A target (built-in or plugin) registers ``Template`` subclasses through the hook
``fxwrap_templates(target)`` (``fxwrap.plugins.hookspecs``).  The lowerer
turns an ATen node a template applies to (``Template.ops``, ``Template.refusal``)
into a *template job*: one store of the op's result over the output's sizes, whose
value is the leaf ``template_out`` ("the template's accumulator at (x0, x1)").  The
scheduler then fuses the pointwise jobs over the same sizes into it (the epilogue):
a load of the op's result at its own index becomes the stored value, and the result
is not stored at all when nothing else reads it.  ``relu(linear(x, w, b))`` (the ATen
graph ``addmm(b, x, permute(w))`` then ``relu``) is the one kernel::

    fxwrap_template_0: ranges=(128, 3072) reduction_ranges=()  template=aten.addmm.default
      %0 = load.f32 arg2[x1]
      %1 = template_out.f32 buf1[x0, x1]
      %2 = add.f32 %0 %1
      %3 = const.f32 0.0
      %4 = maximum.f32 %2 %3
      buf2[3072*x0 + x1] = %4

whose ``ScheduledKernel.template`` is the ``TemplateCall``::

    TemplateCall(op=aten.addmm.default, node="addmm", output=buf1 (128, 3072),
                 operands=(arg0 (128, 768) stride (768, 1), buf0 (768, 3072) stride (1, 768)),
                 sizes=(("batch", 1), ("m", 128), ("n", 3072), ("k", 768)), ...)

The template computes ``template_out`` (the product ``sum_k a[.., m, k] * b[.., k, n]``
in ``acc_dtype``, float32 for float32 and bfloat16 operands: no ``alpha``, no bias:
those are in the epilogue) and renders each store's value with its target's own
expression printer, binding ``template_out`` to its accumulator (``Template.render``).

**Choice.**  For each template group the builder has candidates: every template that
applies, rendered with the epilogue, and the *extern*: the op's ATen call into its
buffer, as without templates, then the epilogue as an ordinary pointwise kernel.
``options={"templates": ...}``: ``"off"`` (no template jobs: the program is the one
without templates), ``"always"`` (the first template that applies, untimed: tests),
``"auto"`` (the default: every candidate timed on the size hints with fresh random
inputs, the fastest kept; the extern whenever it is as fast or faster).  A group's
times are cached on disk together, as measured in one interleaved session (``TimingCache``:
``$FXWRAP_CACHE_DIR/templates``, keyed by the target, the device's model and features, the
threads, the clock, torch's version, the candidates' sources and the sizes), so a recompile
does not time again and, given that cache, the choice (and the printed program) is
deterministic.  ``FXWRAP_RETUNE=1`` (``retune_requested``) measures every group again and
replaces its entry (and, since a cached program holds its choices, compiles the programs
again rather than loading them from the program cache).  The Wrapper IR shows the choice
above the launch (``TemplateChoice``)::

    # template cpp_gemm: 0.212 ms (chosen); aten.addmm + epilogue: 0.251 ms
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import sympy
import torch

from fxwrap.ir.loops import Op, OpCode, ScheduledKernel, walk
from fxwrap.runtime.cache_dir import cache_root

aten = torch.ops.aten

#: ``options={"templates": ...}``: see the module docstring.
TEMPLATE_MODES = ("default", "auto", "off", "always")

#: The ops the builder knows how to state as a ``TemplateCall`` (a product over k).
#: ``_weight_int8pack_mm(x, w, scales)``: ``operands = (x, w viewed as (K, N), scales)``,
#: ``template_out`` the product, the epilogue multiplies by ``scales[n]``.
GEMM_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten._weight_int8pack_mm.default})


@dataclass(frozen=True)
class TemplateCall:
    """The op a template computes, as data.

    ``op``: the ATen overload (``aten.addmm.default``); ``node``: the ATen node's name;
    ``operands``: the product's operand buffers (``Buffer``: name, size, stride, dtype;
    views keep their own strides: a transposed weight is ``stride (1, K)``), ``(a, b)``
    with ``a`` of size ``(batch..., M, K)`` and ``b`` of ``(batch..., K, N)``, then any
    other buffer the op reads (``_weight_int8pack_mm``: its int8 ``w`` as ``b``, the same
    buffer through transposed strides, and ``scales``); ``kernel.inputs`` start with them;
    ``output``: the op's result buffer (its layout; not stored when no one reads it);
    ``sizes``: ``(("batch", B), ("m", M), ("n", N), ("k", K))``, sympy expressions of
    the program's size symbols; ``hints``: the same as ints (the sizes of the example
    inputs); ``acc_dtype``: the dtype of ``template_out``; ``index``: the iteration
    variables ``template_out`` is indexed by (``(x0, x1)``, ``(x0, x1, x2)`` for bmm).
    """

    op: object
    node: str
    operands: tuple
    output: object
    sizes: tuple
    hints: tuple
    acc_dtype: torch.dtype = torch.float32
    index: tuple = ()

    def size(self, name: str) -> sympy.Expr:
        return dict(self.sizes)[name]

    def hint(self, name: str) -> int:
        return int(dict(self.hints)[name])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of ``a`` (and of ``b``, but for the int8 weight of ``_weight_int8pack_mm``)."""
        return self.operands[0].dtype

    def accumulator(self) -> Op:
        """The ``template_out`` leaf of this call (what the epilogue reads)."""
        return template_out(self.output.name, self.index, self.acc_dtype)

    def describe(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.sizes)
        return f"{self.op} ({dims}, {str(self.dtype).replace('torch.', '')})"


def template_out(name: str, index, dtype: torch.dtype) -> Op:
    """``template_out.<dtype> name[x0, x1]``: the template's accumulator at the output
    element ``index`` (a tuple of iteration variables) of the op whose result buffer is
    ``name``."""
    return Op(OpCode.TEMPLATE_OUT, dtype, (), (name, tuple(sympy.sympify(i) for i in index)))


def accumulators(kernel: ScheduledKernel) -> list[Op]:
    """The ``template_out`` nodes under the kernel's stores (one: the template's)."""
    found = [n for st in kernel.stores for n in walk(st.value) if n.op == OpCode.TEMPLATE_OUT]
    return list(dict.fromkeys(found))


class Template:
    """A kernel for one or more ATen ops, with the scheduler's epilogue fused in.

    Subclass it and register instances through the ``fxwrap_templates(target)`` hook::

        class MyGemm(fxwrap.Template):
            name = "my_gemm"
            ops = frozenset({aten.mm.default, aten.addmm.default})

            def refusal(self, call):            # why this template does not apply, or None
                if call.dtype != torch.float32:
                    return f"{call.dtype} operands"
                return None

            def render(self, kernel, emitter):  # -> targets.base.KernelSource
                ...

    ``render`` gets the legalized ``ScheduledKernel`` (``kernel.template`` is the
    ``TemplateCall``; ``kernel.inputs`` starts with the call's operands, then the
    epilogue's other inputs; ``kernel.outputs`` the stored buffers; ``kernel.stores``
    are the epilogue, over ``template_out``) and the target's emitter (to print the
    epilogue's expressions and to build the ``KernelSource`` its ``load`` takes: same
    signature as a generated kernel, ``emitter.signature(kernel)``).
    """

    name: str = ""
    ops: frozenset = frozenset()

    def refusal(self, call: TemplateCall) -> str | None:
        """Why this template does not compute ``call`` (dtype, layout, sizes, CPU
        features), for the schedule log; None: it does."""
        return None

    #: Whether ``templates="default"`` (the default option) times this template against the
    #: ATen call; False: only under ``templates="auto"`` / ``"always"`` or a max-autotune mode
    #: (Inductor's rule for its GEMM templates: on the H200 the Triton GEMM won by kernel but
    #: not by whole model, and tuning its tilings made compiles 3-4x longer; BENCHMARKS.md)
    in_default_mode: bool = True

    def extern_refusal(self, call: TemplateCall) -> str | None:
        """Why the op's ATen call must not compute ``call`` (nor be timed against this
        template: it gives wrong numbers or crashes there), or None (the default)."""
        return None

    #: Whether ``pattern_refusal(op, args) is None`` promises that ``refusal`` accepts the
    #: rewritten call: the rewrite may then produce an op whose own ATen kernel cannot run on
    #: the device (there is none, or it is wrong there), this template being its kernel
    pattern_guarantee: bool = False

    def pattern_refusal(self, op, args: tuple) -> str | None:
        """Why the ATen graph should not be rewritten into ``op`` for this template (a
        pattern rewrite of ``fxwrap.core.patterns``: ``_weight_int8pack_mm`` for the
        dequantize-and-linear pattern), given the rewritten op's arguments as fake tensors
        (their sizes may be symbolic), or None (the default): rewrite where the op's own
        ATen kernel is a good fallback (or anywhere, with ``pattern_guarantee``).  A template
        that wins only on some shapes keeps the others on the pattern's own path."""
        return None

    def render(self, kernel: ScheduledKernel, emitter):
        raise NotImplementedError(f"template {self.name or type(self).__name__} has no render()")

    def __repr__(self) -> str:
        return f"<template {self.name or type(self).__name__}>"


def check_template(template, who: str = "a plugin") -> None:
    """Raise ``TypeError`` naming ``who`` when ``template`` is not a usable ``Template``."""
    if not isinstance(template, Template):
        raise TypeError(f"{who}: fxwrap_templates() returned {template!r}, not an fxwrap.Template instance")
    if not template.name or not isinstance(template.name, str):
        raise TypeError(f"{who}: template {type(template).__name__} has no name")
    unknown = [op for op in template.ops if op not in GEMM_OPS]
    if unknown:
        raise TypeError(f"{who}: template {template.name!r} lists ops fxwrap cannot state as a template call: "
                        f"{unknown}; supported: {sorted(map(str, GEMM_OPS))}")


@dataclass
class TemplateChoiceRecord:
    """What the builder chose for one template group: ``chosen`` (a template name or
    ``"extern"``), ``times`` (candidate -> milliseconds, its fastest round; empty under "always"),
    ``call`` (the ``TemplateCall``), ``reasons`` (template name -> why it did not apply)."""

    kernel: str
    call: TemplateCall
    chosen: str
    times: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)


#: ``FXWRAP_RETUNE=1``: see ``retune_requested``
RETUNE_ENV = "FXWRAP_RETUNE"


def retune_requested() -> bool:
    """``FXWRAP_RETUNE=1`` (any value but empty, ``0``, ``false``, ``off``, ``no``): the template
    choice measures its candidates again instead of reading the timing cache, and writes
    the new times there; the program caches are not read (their programs hold the old
    choices) but written, so later runs without it load the programs of the new choices."""
    return os.environ.get(RETUNE_ENV, "").strip().lower() not in ("", "0", "false", "off", "no")


class TimingCache:
    """A template group's candidate times on disk, measured together:
    ``$FXWRAP_CACHE_DIR/templates/<key>.json`` (default ``~/.cache/fxwrap``) holding
    ``{"times": {"cpp_gemm": 0.242, "extern": 0.211}}`` (milliseconds), one file per key, written
    atomically.  ``FXWRAP_TEMPLATE_CACHE=0`` turns it off (every compile times again);
    ``FXWRAP_RETUNE=1`` does not read it but writes it (``retune_requested``)."""

    def __init__(self, root: Path | None = None):
        if root is None:
            root = cache_root() / "templates"
        self.root = Path(root)
        self.enabled = os.environ.get("FXWRAP_TEMPLATE_CACHE", "1") != "0"
        self.retune = retune_requested()

    @staticmethod
    def key(*parts) -> str:
        h = hashlib.sha256()
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")
        return h.hexdigest()

    def get(self, key: str) -> dict[str, float] | None:
        """The times stored under ``key`` (candidate -> ms), or None (none, unreadable, or retuning)."""
        if not self.enabled or self.retune:
            return None
        try:
            times = json.loads((self.root / f"{key}.json").read_text())["times"]
            return {str(name): float(ms) for name, ms in times.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def put(self, key: str, times: dict[str, float]) -> None:
        if not self.enabled:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps({"times": {name: float(ms) for name, ms in sorted(times.items())}}))
            os.replace(tmp, self.root / f"{key}.json")
        except OSError:
            pass
