"""What a device brings to fxwrap: a device interface, a kernel emitter, a wrapper.

A hardware team registers a ``Target`` from its plugin::

    @fxwrap.hookimpl
    def fxwrap_targets():
        return [Target(name="arena", device_type="cpu", device=CpuDevice(),
                       emitter=ArenaEmitter, wrapper=ArenaWrapper)]

and fxwrap then compiles programs whose tensors live on ``device_type`` (or that
name ``target="arena"``) with these pieces.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fxwrap.ir.capabilities import Capabilities
from fxwrap.runtime.direct import direct_graph_module
from fxwrap.runtime.graph_replay import GraphCapture
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.launch import KernelLaunch, UserTritonLaunch
from fxwrap.runtime.provenance import header_lines

if TYPE_CHECKING:  # a saved program's loaders import this module: no loop IR (sympy) at import
    from fxwrap.ir.combo import ComboKernel, ComboLimits


class DeviceInterface:
    """One device type's runtime facts: ``DeviceInterface().device_type == "cpu"``.

    What fxwrap calls, and where (a method a device has no use for keeps its default):

    * ``capabilities()``: a ``Capabilities`` record (``fxwrap.ir.capabilities``), read
      once per compile session.  ``dtypes`` (dtype names, e.g. ``("float32",
      "bfloat16")``; None: no limit) narrows what a generated kernel may hold: an op on
      another dtype runs as an ATen extern call (``CompileSession.kernel_dtypes``).
      Emitters read their launch limits here (Metal: ``max_threads_per_threadgroup``).
      A dict (the old contract) is converted with a ``DeprecationWarning``; an unknown
      key is an error naming the valid ones.
    * ``synchronize(device)``: waits for queued work; autotuning calls it before it starts.
    * ``graph_capture()``: the device's ``GraphCapture`` (``fxwrap.runtime.graph_replay``:
      record a run of a program, replay it), or None (the default) when it has none.  A
      device that returns one gets ``mode="reduce-overhead"``: the shared runner, its rules
      (static inputs in place, writes into them recorded, other written inputs copied back,
      partitions around what cannot be recorded) and the conformance kit's checks of them.
    * ``current_stream(device)``: the stream launches go to (None where there are
      none); autotuning records its timing events on it.
    * ``device_count()``: how many devices of this type; the Triton launchers skip
      the per-call device check when it is 1.
    * ``is_available()``: whether the device is there; autotuning runs only then.
    * ``time_calls(run, n, device)``: seconds per call of ``run()`` over ``n`` calls, how
      the template choice (``wrapper_ir/template_choice.py``) times its candidates.  The
      default times the device's own work between two ``timing_event``s where the device
      has them (after ``fill_queue(n)``: CUDA spins so the launches are queued before the
      device starts), else the host clock between two ``synchronize`` calls (the CPU at one
      thread overrides it: the thread's CPU time).
    * ``timing_clock()``: a name for what ``time_calls`` measures now (``"wall"`` by
      default); the template timings' on-disk cache keys by it, so times taken with
      another clock are never compared with these.
    * ``timing_identity()``: what a time measured here depends on besides the program and
      the clock: the device's model and features (default: ``capabilities()``; the CPU: its
      model and ISA flags); the template timings' on-disk cache keys by it too, so a cache
      directory shared between machines never hands one machine's choice to another.
    """

    device_type: str = ""

    def is_available(self) -> bool:
        raise NotImplementedError

    def synchronize(self, device=None) -> None:
        return None

    def current_stream(self, device=None):
        return None

    def timing_event(self, device=None):
        """A new event that marks a point of the device's queue when ``record()``ed, with
        ``start.elapsed_time(end)`` in milliseconds (``torch.cuda.Event(enable_timing=True)``),
        or None (the default): the host clock times the device's work, which then runs as it
        is called.  ``fxwrap.profile`` times launches with it and waits with ``synchronize``."""
        return None

    def device_count(self) -> int:
        return 1 if self.is_available() else 0

    def timing_clock(self) -> str:
        return "wall"

    def timing_identity(self) -> str:
        return repr(self.capabilities())

    def time_calls(self, run, n: int, device=None) -> float:
        """Seconds per call of ``run()`` over ``n`` calls: between two of the device's
        ``timing_event``s where it has them (after ``fill_queue``), else on the host clock
        between two ``synchronize`` calls."""
        start, end = self.timing_event(device), self.timing_event(device)
        self.synchronize(device)
        if start is None:
            begin = time.perf_counter()
            for _ in range(n):
                run()
            self.synchronize(device)
            return (time.perf_counter() - begin) / n
        self.fill_queue(n, device)
        start.record()
        for _ in range(n):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / n

    def fill_queue(self, n: int, device=None) -> None:
        """Before ``n`` timed calls: queue device work so the launches are queued before the
        device reaches them (CUDA: a spin kernel); by default nothing."""
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def graph_capture(self) -> GraphCapture | None:
        """How the device records and replays a program (``mode="reduce-overhead"``), or None."""
        return None


@dataclass(frozen=True)
class Workspace:
    """Scratch memory a kernel needs for one launch: ``numel`` elements (a sympy expression
    over the kernel's size symbols) of ``dtype``, zero-filled before the launch when
    ``zeroed``.  The kernel builder allocates it with an ``Allocate`` line before the
    launch and passes it after the outputs (role ``workspace``); the memory planner frees
    and reuses it like any buffer, so it counts in ``program.peak_bytes``::

        ws2 = empty_strided((4*s0,), (1,), dtype=torch.float32, device='cuda:0')
        fxwrap_scan_0(arg0, buf1, ws2, s0)
        del ws2
    """

    numel: object  # sympy.Expr
    dtype: torch.dtype
    zeroed: bool = False


@dataclass(frozen=True)
class KernelSource:
    """Rendered kernel: ``KernelSource("fxwrap_pointwise_0", "extern \"C\" void ...", "c++")``.

    ``launch``: the launch metadata, a ``KernelLaunch`` (``fxwrap.runtime.launch``: typed
    fields; a dict is converted and an unknown key is an error naming the valid ones).
    ``workspaces``: the scratch buffers (``Workspace``) the kernel takes after its outputs,
    in that order; no kernel allocates memory itself."""

    name: str
    text: str
    language: str
    signature: tuple = ()
    launch: KernelLaunch = field(default_factory=KernelLaunch, hash=False, compare=False)
    workspaces: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "launch", KernelLaunch.of(self.launch))


def kernel_function_name(kernel) -> str:
    """The kernel's name as an identifier: ``fxwrap.add-0`` -> ``fxwrap_add_0``, a leading
    digit prefixed with ``k_``."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", kernel.name)
    return name if name and not name[0].isdigit() else f"k_{name}"


def kernel_signature(kernel) -> tuple[KernelArg, ...]:
    """A kernel's arguments (``KernelArg``) in call order: inputs, outputs (``inout`` if also an
    input), size symbols."""
    in_names = {b.name for b in kernel.inputs}
    args = [KernelArg(b.name, "input") for b in kernel.inputs]
    args += [KernelArg(b.name, "inout" if b.name in in_names else "output")
             for b in kernel.outputs]
    args += [KernelArg(s.name, "size") for s in kernel.size_symbols]
    return tuple(args)


def kernel_header(kernel, comment: str, title_suffix: str = "") -> list[str]:
    """The comment lines that open a rendered kernel (name, ATen origins with their
    source lines and modules, buffers, ranges, reductions), each starting with
    ``comment`` (``//``, ``#``)::

        // fxwrap kernel fxwrap_pointwise_0
        // from: mul, erf, add (aten.mul.Tensor, aten.erf.default, aten.add.Tensor)
        //   model.py:41 in forward [layers.0.mlp.act]
        ...

    Nothing but comments: the caches key kernels on the source without this header
    (``host.compiler.CppCompiler.key``, the Triton emitter's ``body_digest``), so the
    same kernel from another source line is the same binary."""
    c = comment
    lines = [f"{c} fxwrap kernel {kernel.name}{title_suffix}"]
    lines += [f"{c} {text}" for text in header_lines(kernel.origins)]
    for i, buf in enumerate(kernel.inputs):
        lines.append(f"{c} in_ptr{i}: {describe_buffer(buf)}")
    for i, buf in enumerate(kernel.outputs):
        lines.append(f"{c} out_ptr{i}: {describe_buffer(buf)}")
    if kernel.ranges:
        lines.append(f"{c} ranges: {tuple(kernel.ranges)}")
    if kernel.reduction_ranges:
        lines.append(f"{c} reduction_ranges: {tuple(kernel.reduction_ranges)}")
    for red in kernel.reductions:
        lines.append(f"{c} reduction {red.name}: {red.kind} ({red.dtype})")
    return lines


def describe_buffer(buf) -> str:
    """``buf0 float32 size=(4, 8) stride=(8, 1)``: a kernel argument buffer, for headers."""
    size = tuple(getattr(buf, "size", ()))
    stride = tuple(getattr(buf, "stride", ()))
    return f"{buf.name} {str(buf.dtype).replace('torch.', '')} size={size} stride={stride}"


class KernelEmitter:
    """Turns one scheduled kernel into source text, and source into a launcher.

    ``load_threads``: how many ``load`` calls of one program fxwrap may run at once
    (loading usually waits on a compiler subprocess); 1 loads them one after another.
    ``max_autotune``: the session's ``mode="max-autotune"``, for emitters that tune.
    """

    language: str = ""
    load_threads: int = 1
    #: set by the compile session from ``mode="max-autotune"``: an emitter with tunable
    #: choices tries a wider set of candidates (the Triton emitter: more configs per kernel)
    max_autotune: bool = False
    #: the stores at computed offsets it renders (``Store.indexed``: an ``index_put`` or
    #: ``scatter`` written in place), by mode -- ``"set"`` a plain write, ``"add"`` adding to
    #: the element, each addition whole when several iterations reach one element -- each
    #: with the buffer dtypes it renders it for.  An indexed write it does not list stays
    #: the ATen op (an extern on a copy of the tensor): a new emitter renders none
    indexed_stores: dict = {}
    #: ops this emitter renders as a call its vector loops cannot inline (a scalar math-library
    #: call: ``std::cos`` in a ``#pragma omp simd`` loop): a lazy value with one of them that
    #: several nodes read is stored once rather than computed again in each reader's kernel
    #: (``core.scheduler.worth_storing``: HF Llama's rotary ``cos`` / ``sin`` tables, read by
    #: every layer's q and k, each element then computed once per head and batch); none by default
    costly_ops: frozenset = frozenset()
    #: the target's own ops (``fxwrap.Intrinsic``, ``fxwrap/ir/intrinsics.py``): a native
    #: ``gelu``, a fast ``exp``, which lowerings emit inside fused kernels as loop-IR nodes of
    #: op ``intrinsic`` and this emitter renders through each one's ``spelling`` (the C-family
    #: engine and the Triton emitter do); a call an intrinsic does not cover lowers as on a
    #: target that declares none: ``(Intrinsic("my_gelu", "my_gelu({0})",
    #: replaces=aten.gelu.default, when={"approximate": "none"}),)``
    intrinsics: tuple = ()
    #: the combo kernels it renders (``fxwrap.ir.combo.ComboLimits``: independent pointwise
    #: kernels of different sizes as one launch, ``core/combo.py``), through ``render_combo``;
    #: None (the default): none, each kernel is launched alone
    combo_kernels: ComboLimits | None = None

    def __init__(self, target: "Target"):
        self.target = target

    # what a subclass asks of its target, answered where no target was given (an emitter made
    # alone, in a test) as well: read through these, not through ``self.target``
    @property
    def target_name(self) -> str:
        """The target's name; the emitter's ``language`` where it has no target."""
        return getattr(self.target, "name", None) or self.language

    @property
    def target_options(self) -> dict[str, Any]:
        """The target's ``options`` (``{}`` where it has none)."""
        return getattr(self.target, "options", None) or {}

    @property
    def target_device(self) -> "DeviceInterface | None":
        """The target's ``DeviceInterface``; None where it has no target."""
        return getattr(self.target, "device", None)

    @property
    def target_device_type(self) -> str | None:
        """The torch device type of the target's tensors (``"cuda"``, ``"cpu"``...); None
        where it has no target."""
        return getattr(self.target, "device_type", None)

    def render(self, kernel) -> KernelSource:
        raise NotImplementedError(f"{type(self).__name__} cannot render kernels yet")

    def render_combo(self, kernel: ComboKernel) -> KernelSource | None:
        """One kernel computing every member of ``kernel`` (``fxwrap.ir.combo.ComboKernel``),
        its arguments ``(*kernel.inputs, *kernel.outputs, *kernel.size_symbols)``; or None
        where it cannot (the members are then rendered and launched one by one).  Called only
        on an emitter that declares ``combo_kernels``."""
        return None

    def load(self, source: KernelSource) -> Callable:
        raise NotImplementedError(f"{type(self).__name__} cannot load kernels yet")

    def prepare(self) -> None:
        """A compile for this target begins (``api.Backend``, before AOTAutograd traces the
        graphs): start what loading kernels will need, so that it is ready by then (the Triton
        emitter's compile worker processes); nothing by default."""

    def load_ahead(self, sources: list[KernelSource]) -> None:
        """Before ``load`` of each of ``sources`` (a program's kernels, known at once): build
        what those loads need in fewer, larger steps (the C++ emitter compiles the kernels
        in a few translation units rather than one compiler process each); nothing by default."""

    def saved_loader(self, kernel) -> Callable | None:
        """What ``program.save`` stores as the loader of ``kernel`` (an ``fxwrap.Kernel``
        this emitter built): a picklable ``loader(kernel) -> launcher`` that carries what
        the kernel needs to run (its binary) and imports no compiler module, or None: the
        saved kernel keeps the compiler's loader and is compiled again from its source
        when a loaded program first launches it (through the plugin manager)."""
        return None

    def user_kernel(self, name: str, source: str, signature: tuple, launch: UserTritonLaunch,
                    triton_kernel) -> Kernel:
        """The ``Kernel`` (bound to its launcher) of a user-written Triton kernel launched in the
        program: ``triton_kernel`` is the ``JITFunction`` (or ``Autotuner``) from the user's code,
        ``launch`` what ``wrapper_ir.build_user_kernels`` records of the launch (constants,
        grids, configs); the launcher takes ``(*tensors_and_scalars, *grids)``.  The Triton
        targets run it; by default a target cannot, and says so."""
        from fxwrap.core.errors import UnsupportedUserKernel  # here: a loaded program imports this module
        raise UnsupportedUserKernel(
            f"user Triton kernel {name} ({launch.module}.{launch.qualname}) cannot run on "
            f"target {getattr(self.target, 'name', '?')!r}: Triton kernels run on target 'cuda' (CUDA "
            "tensors) or 'triton-interpret' (CPU tensors, through Triton's interpreter). Compile with "
            "target='triton-interpret' (options={'target': 'triton-interpret'}) or 'cuda', or launch the "
            "kernel outside the compiled function")


class WrapperCodegen:
    """Turns the program's GraphModule into what runs; subclass to run it your way.

    The default runs the GraphModule itself: ``compile_graph(gm) is gm``.
    """

    def __init__(self, target: "Target"):
        self.target = target

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return gm

    def compile_graph_per_call(self, gm: torch.fx.GraphModule) -> Callable:
        """What runs where a call may keep no storage for the next: under graph capture
        (``fxwrap.runtime.graph_replay``: a recording holds its buffers for good, and must
        share them with no other call) and with option ``arena=False``.  ``compile_graph(gm)``
        unless that keeps storage across calls (the CPU's arena, ``fxwrap.runtime.arena``)."""
        return self.compile_graph(gm)


class DirectCallWrapper(WrapperCodegen):
    """Runs a copy of the GraphModule whose matrix-product externs call torch's Python
    bindings, and whose size/stride/offset reads call tensor methods, instead of ATen
    ``OpOverload``s -- the same results, cheaper calls (``fxwrap.runtime.direct``)::

        program.graph_module:  torch.ops.aten.mm.out(arg0, arg1, out = buf0)
        compile_graph(gm):     torch.mm(arg0, arg1, out = buf0)

    The CPU and CUDA targets use it; ``program.graph_module`` keeps the ATen form.
    """

    def compile_graph(self, gm: torch.fx.GraphModule) -> Callable:
        return direct_graph_module(gm)


@dataclass(frozen=True)
class Target:
    """``Target("cpu", "cpu", CpuDevice(), CppEmitter, WrapperCodegen)``."""

    name: str
    device_type: str
    device: DeviceInterface
    emitter: type[KernelEmitter]
    wrapper: type[WrapperCodegen] = WrapperCodegen
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    priority: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("Target.name must be a non-empty string")
