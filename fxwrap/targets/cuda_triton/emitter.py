"""The Triton kernel emitter: ``ScheduledKernel`` -> Triton module -> bound launcher.

``torch.softmax(x, -1)`` over a contiguous ``(64, 128)`` float tensor is one kernel
with two reductions and a store indexed by ``r`` (the epilogue); it renders as a
*persistent* reduction (the row lives in registers)::

    # fxwrap kernel fxwrap_reduction_0 (triton)
    # from: _softmax
    # plan: persistent reduction (inner), indices tl.int32
    import triton
    import triton.language as tl

    from fxwrap.targets.cuda_triton.libm import fx_round_bf16, libdevice

    @triton.jit
    def _fx_max(a, b): ...

    @triton.jit
    def fxwrap_reduction_0(in_ptr0, out_ptr0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xnumel = 64
        rnumel = 128
        xoffset = tl.program_id(0) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        rbase = tl.arange(0, RBLOCK)[None, :]
        x0 = xindex
        rindex = rbase
        rmask = rindex < rnumel
        xrmask = xmask & rmask
        r0 = rindex
        tmp0 = tl.load(in_ptr0 + (128*x0 + r0), xmask & rmask, other=0)
        _acc0_v = tl.where(xrmask, tmp0, tl.full([], float("-inf"), tl.float32))
        _acc0 = tl.reduce(_acc0_v, 1, _fx_max)[:, None]
        ...
        tl.store(out_ptr0 + (128*x0 + r0), tmp5, xmask & rmask)

The source depends on the kernel only (block sizes are ``tl.constexpr`` parameters),
so the same program gives byte-identical sources.  ``KernelSource.launch`` records the
plan, the host grid expressions and the chosen ``config`` (block sizes, ``num_warps``;
autotuned on the GPU at render time, the planner's single config under the
interpreter), and ``configs``, the candidates.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading

import sympy
import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._sympy.functions import CeilDiv

from fxwrap.ir.combo import ComboKernel, ComboLimits
from fxwrap.ir.loops import REDUCTIONS, ScheduledKernel
from fxwrap.ir.symbolic import evaluate
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.launch import TritonLaunch, UserTritonLaunch
from fxwrap.targets.base import (DeviceInterface, KernelEmitter, KernelSource, Workspace, kernel_function_name,
                                  kernel_header, kernel_signature)
from fxwrap.targets.cuda_triton import ops as O
from fxwrap.targets.cuda_triton.compile_workers import CompileUnit, compile_workers, default_count
from fxwrap.targets.cuda_triton.launcher import (InterpretedLauncher, SequenceLauncher, SplitLauncher, bind_compiled,
                                                 clear_modules, load_module, split_launches)
from fxwrap.targets.cuda_triton.device import CudaDevice
from fxwrap.targets.cuda_triton.codegen import CodegenError, KernelWriter
from fxwrap.targets.cuda_triton.combo import render_triton_combo
from fxwrap.targets.cuda_triton.lookback import LookbackScanWriter
from fxwrap.targets.cuda_triton.reduction import ReductionWriter
from fxwrap.targets.cuda_triton.scan import ScanWriter
from fxwrap.core import logs
from fxwrap.targets.cuda_triton.printer import IndexPrinter
from fxwrap.targets.cuda_triton.tiling import Planner


log = logging.getLogger("fxwrap")

# In-process caches shared by every emitter: kernels whose bodies are equal up to the
# function names (the repeated blocks of a model) compile and autotune once.
_LAUNCHERS: dict[tuple, object] = {}
_TUNED: dict[tuple, tuple] = {}
_BUILDING: dict[tuple, threading.Event] = {}  # launchers being built: a second thread waits for the first
_CACHE_LOCK = threading.Lock()
_DEFAULT_DEVICE = CudaDevice()


def body_digest(text: str, launch: TritonLaunch) -> str:
    """Digest of a kernel module without its header comments and with its function
    names replaced: equal for kernels that differ only in name and provenance."""
    lines = text.split("\n")
    start = 0
    while start < len(lines) and lines[start].startswith("#"):
        start += 1
    body = "\n".join(lines[start:])
    if launch.partial_symbol:
        body = body.replace(f"def {launch.partial_symbol}(", "def _FX_PARTIAL_(")
    for i, part in enumerate(launch.parts):
        if part.symbol != launch.symbol:
            body = body.replace(f"def {part.symbol}(", f"def _FX_PART{i}_(")
    body = body.replace(f"def {launch.symbol}(", "def _FX_KERNEL_(")
    return hashlib.sha256(body.encode()).hexdigest()


def _launch_key(text: str, launch: TritonLaunch, device) -> tuple:
    index = None
    if device is not None:
        index = device.index if device.index is not None else torch.cuda.current_device()
    return (body_digest(text, launch), tuple(launch.config), launch.combine_config,
            tuple(launch.pointer_dtypes), tuple(launch.workspace_dtypes), tuple(launch.numels),
            tuple(launch.size_symbols), launch.pointers, bool(launch.interpret), index)


def _compiled_launches(launch: TritonLaunch) -> list[TritonLaunch]:
    """The launches whose functions binding ``launch`` compiles: a split scan's parts, a
    split-outer reduction's partials and combine, else ``launch`` itself."""
    if launch.parts:
        return list(launch.parts)
    if launch.plan == "split-outer":
        return list(split_launches(launch))
    return [launch]


def clear_caches() -> None:
    """Forget the in-process launcher, autotuning and kernel-module caches (tests,
    benchmarks): the next load imports the module anew, so Triton compiles again."""
    with _CACHE_LOCK:
        _LAUNCHERS.clear()
        _TUNED.clear()
    clear_modules()


def write_body(writer: KernelWriter) -> list[str]:
    """The body of a kernel whose plan is one function, by the part that writes that plan:
    the writer itself (``pointwise1d``, ``pointwise2d``), ``ScanWriter`` (``scan``) or
    ``ReductionWriter`` (``persistent``, ``looped``)."""
    kind = writer.plan.kind
    if kind in ("pointwise1d", "pointwise2d"):
        return writer.write_pointwise()
    if kind == "scan":
        return ScanWriter(writer).write()
    return ReductionWriter(writer).write()


class TritonEmitError(CodegenError):
    """A kernel the Triton emitter cannot render (names the op, the target and a way out)."""


class TritonEmitter(KernelEmitter):
    """``TritonEmitter(target).render(kernel) -> KernelSource``; ``.load(source) -> launcher``.

    The launcher is called like every fxwrap kernel: ``launcher(in0, ..., out0, ...,
    s0, ...)``.  A target whose ``device_type`` is ``cpu`` (``triton-interpret``) or
    whose options say ``{"interpret": True}`` runs kernels under Triton's CPU
    interpreter.  ``size_hints`` (``{symbol: int}``, set by the kernel builder) are the
    example sizes autotuning times symbolic kernels at; ``autotune=False`` in the
    target options (or ``FXWRAP_TRITON_AUTOTUNE=0``) keeps the planner's first config.
    """

    language = "triton"
    supported_dtypes = frozenset(O.TL_TYPES)  # other dtypes stay ATen extern calls
    # indexed writes (index_put, scatter in place): tl.store at the computed offsets, and
    # tl.atomic_add where they accumulate (32/64-bit types: 16-bit floats would round at each
    # addition where eager's CUDA kernel sums in float, so those stay the ATen op)
    indexed_stores = {"set": supported_dtypes,
                      "add": frozenset({torch.float32, torch.float64, torch.int32, torch.int64})}
    load_threads = 8  # ptxas is a subprocess: build in parallel
    # independent 1-D pointwise kernels as one launch, programs dispatched by id (combo.py);
    # at most 250 arguments (Inductor's foreach kernels' bound): native_launch.py's binding
    # takes 256 slots, Triton's two scratch pointers among them; a 40-tensor Adam step (5
    # arguments a tensor) is one launch
    combo_kernels = ComboLimits(max_members=64, max_arguments=250)

    def __init__(self, target=None):
        super().__init__(target)
        self.size_hints: dict = {}

    # ------------------------------------------------------------------ options
    @property
    def device_interface(self) -> DeviceInterface:
        """The target's ``DeviceInterface`` (a ``CudaDevice`` for an emitter made without a
        target): what autotuning synchronizes and times on, and the device count."""
        device = self.target_device
        if isinstance(device, DeviceInterface) and device.device_type == "cuda":
            return device
        return _DEFAULT_DEVICE

    @property
    def interpret(self) -> bool:
        opts = self.target_options
        if "interpret" in opts:
            return bool(opts["interpret"])
        if (self.target_device_type or "cuda") != "cuda":
            return True
        from fxwrap.targets.cuda_triton.libm import interpreting
        return interpreting()

    @property
    def autotune(self) -> bool:
        import os
        opts = self.target_options
        if os.environ.get("FXWRAP_TRITON_AUTOTUNE", "1") == "0":
            return False
        return bool(opts.get("autotune", True)) and not self.interpret

    # ------------------------------------------------------------------ render
    @staticmethod
    def in_place_pairs(kernel: ScheduledKernel) -> tuple[tuple[str, str], ...]:
        """``(input, output)`` buffer names the memory planner may give one storage
        (``launch.in_place``, read by ``CallKernel.in_place_pairs``): the kernel's own
        ``in_place_pairs``.  A pointwise program loads each element of such an input at the
        offsets it then stores the output at, and the stored value depends on that load,
        so the load comes first; Triton assumes no ``noalias`` between pointer arguments.
        A GELU after a matmul extern, the hidden activation of an MLP::

            buf8 = empty_strided((512, 128), (128, 1), ...)
            aten.addmm.out(arg7, buf7, buf5, out=buf8)
            buf11 = buf8  # reuse
            fxwrap_pointwise_2(buf9, buf11)     # buf9: a view of buf8; writes over it

        (without it both 512 x 128 buffers are live at the kernel)."""
        return kernel.in_place_pairs()

    def render_combo(self, kernel: ComboKernel) -> KernelSource | None:
        source = render_triton_combo(self, kernel)
        if source is not None:  # to the compile workers now, as a plain kernel is
            self._compile_ahead(source.text, source.launch, [source.launch.config])
        return source

    def render(self, kernel: ScheduledKernel) -> KernelSource:
        for red in kernel.reductions:
            if red.kind not in REDUCTIONS and not red.is_scan:
                raise TritonEmitError(f"reduction kind {red.kind!r} of kernel {kernel.name} is not one "
                                      f"of {sorted(REDUCTIONS)} (target {self.target_name})")
        for buf in (*kernel.inputs, *kernel.outputs):
            O.tl_type(buf.dtype, self.target_name)
        plan = Planner(self.interpret, self.size_hints, self.max_autotune).plan(kernel)
        writer = KernelWriter(kernel, plan, self.target_name, self.intrinsics)
        fname = self.function_name(kernel)
        ptrs = [f"in_ptr{i}" for i in range(len(kernel.inputs))]
        ptrs += [f"out_ptr{i}" for i in range(len(kernel.outputs))]
        sizes = [s.name for s in kernel.size_symbols]
        deco = "@triton.jit"
        if sizes:
            deco = f"@triton.jit(do_not_specialize={sizes!r})"
        workspaces = ()
        xnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges]) if kernel.ranges else sympy.Integer(1)
        if plan.kind == "lookback-scan":  # the ticket and status words, zeroed before the launch
            lookback = LookbackScanWriter(writer)
            functions = [(fname, ptrs + ["ws_ptr0"] + sizes + [f"{b}: tl.constexpr" for b in plan.block_names],
                          lookback.write())]
            rnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.reduction_ranges])
            nchunks = CeilDiv(rnumel, sympy.Integer(plan.scan_chunk))
            workspaces = (Workspace(lookback.workspace_numel(xnumel, nchunks), torch.int64, zeroed=True),)
        elif plan.kind == "split-scan":
            scans = ScanWriter(writer)
            body_a, body_b = scans.write_split()
            fields = scans.workspace_fields()
            ws = [f"ws_ptr{i}" for i in range(len(fields))]
            scan_blocks = ["XBLOCK: tl.constexpr", "RBLOCK: tl.constexpr", "SCAN_CHUNK: tl.constexpr"]
            functions = [(f"{fname}_totals", ptrs + ws + sizes + scan_blocks, body_a),
                         (fname, ptrs + ws + sizes + scan_blocks + ["CBLOCK: tl.constexpr"], body_b)]
            rnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.reduction_ranges])
            nchunks = CeilDiv(rnumel, sympy.Integer(plan.scan_chunk))
            workspaces = tuple(Workspace(xnumel * nchunks, T) for _, _, T in fields)
        elif plan.kind == "split-outer":
            reductions = ReductionWriter(writer)
            body_a, body_b = reductions.write_split()
            partial_dtypes = reductions.workspace_dtypes()
            ws = [f"ws_ptr{i}" for i in range(len(partial_dtypes))]
            functions = [(f"{fname}_partial", ptrs + ws + sizes + [f"{b}: tl.constexpr" for b in plan.block_names],
                          body_a),
                         (fname, ptrs + ws + sizes + ["XBLOCK: tl.constexpr", "NSPLIT: tl.constexpr"], body_b)]
        else:
            functions = [(fname, ptrs + sizes + [f"{b}: tl.constexpr" for b in plan.block_names],
                          write_body(writer))]
        helpers = writer.helpers | writer.printer.helpers | writer.ops.helpers
        lines = self.header(kernel, plan)
        lines += ["import triton", "import triton.language as tl", "",
                  "from fxwrap.targets.cuda_triton.libm import fx_round_bf16, libdevice", "", ""]
        if helpers:
            lines += O.helper_source(helpers)
            lines.append("")
        for i, (name, params, body) in enumerate(functions):
            if i:
                lines += ["", ""]
            lines += [deco, f"def {name}({', '.join(params)}):"]
            lines += ["    " + ln for ln in body]
        text = "\n".join(lines) + "\n"

        host = IndexPrinter(self.target_name)
        numels = tuple((axis, host.render(sympy.Mul(*[sympy.sympify(r) for r in plan.ranges[axis]]))
                        if plan.ranges[axis] else "1") for axis in plan.axes)
        configs = [self._config_tuple(plan, c) for c in plan.configs]
        if "_fx_index_check" in helpers:
            configs = [c + O.INDEX_CHECK_OPTIONS for c in configs]
        launch = TritonLaunch(symbol=fname, language=self.language, plan=plan.kind,
                              reduction_shape=plan.reduction_shape, index_dtype=plan.index_dtype,
                              pointers=len(kernel.inputs) + len(kernel.outputs),
                              size_symbols=tuple(sizes), numels=numels,
                              configs=tuple(configs), config=configs[0],
                              interpret=self.interpret, autotuned=False,
                              pointer_dtypes=tuple(str(b.dtype) for b in (*kernel.inputs, *kernel.outputs)),
                              in_place=tuple(self.in_place_pairs(kernel)))
        device = self._device(kernel)
        if device is not None and device.index is not None:
            launch.device_index = device.index  # loaded into, and launched on, this device
        if plan.kind == "lookback-scan":  # one program per (row, chunk): XBLOCK is 1
            launch.pointers += len(workspaces)
            launch.pointer_dtypes += tuple(str(w.dtype) for w in workspaces)
            launch.grid_extra = f"((({dict(numels)['r']}) + {plan.scan_chunk - 1}) // {plan.scan_chunk})"
        if plan.kind == "split-scan":
            launch.pointers += len(workspaces)
            launch.pointer_dtypes += tuple(str(w.dtype) for w in workspaces)
            launch.parts = self._split_scan_parts(fname, plan, numels, launch)
        if plan.kind == "split-outer":
            cc = plan.combine_config
            launch.partial_symbol = f"{fname}_partial"
            launch.combine_config = (("XBLOCK", int(cc["XBLOCK"])), ("num_warps", int(cc["num_warps"])))
            launch.workspace_dtypes = tuple(str(d) for d in partial_dtypes)
            launch.nsplit = dict(configs[0])["NSPLIT"]
        source = KernelSource(kernel.name, text, self.language, self.signature(kernel), launch, workspaces)
        tuned = self.autotune and len(configs) > 1 and self._device(kernel) is not None
        self._compile_ahead(text, launch, configs if tuned else [launch.config], urgent=tuned)
        if self.autotune and len(configs) > 1:
            self._tune(source, kernel, configs)
        if plan.kind == "split-outer":  # the partials' workspaces, sized by the NSPLIT chosen
            xnumel = sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges]) if kernel.ranges else sympy.Integer(1)
            source = dataclasses.replace(source, workspaces=tuple(
                Workspace(int(source.launch.nsplit) * xnumel, d) for d in partial_dtypes))
        elif logs.enabled("autotune"):
            why = ("the interpreter times nothing" if self.interpret else "one config" if len(configs) < 2
                   else "autotuning is off")
            logs.logger("autotune").debug("%s: %s, config %s (not tuned: %s)", kernel.name, plan.kind,
                                          dict(configs[0]), why)
        return source

    @staticmethod
    def _split_scan_parts(fname: str, plan, numels, launch: TritonLaunch) -> tuple[TritonLaunch, ...]:
        """The launches of a split scan, in order, each with the kernel's arguments
        (workspaces included): the chunk totals, then the chunks' scans."""
        numel = dict(numels)
        chunks = f"((({numel['r']}) + {plan.scan_chunk - 1}) // {plan.scan_chunk})"
        cfg = dict(launch.config)
        chunked = (("XBLOCK", 1), ("RBLOCK", cfg["RBLOCK"]), ("SCAN_CHUNK", plan.scan_chunk))
        warps = (("num_warps", cfg["num_warps"]),) + tuple(
            kv for kv in launch.config if kv in O.INDEX_CHECK_OPTIONS)
        cblock = 16 if launch.interpret else 1024

        def part(symbol: str, config: tuple) -> TritonLaunch:
            return TritonLaunch(symbol=symbol, language=launch.language, pointers=launch.pointers,
                                pointer_dtypes=launch.pointer_dtypes, size_symbols=launch.size_symbols,
                                interpret=launch.interpret, device_index=launch.device_index,
                                numels=(("x", numel["x"]),), grid_extra=chunks, config=config)
        return (part(f"{fname}_totals", chunked + warps), part(fname, chunked + (("CBLOCK", cblock),) + warps))

    @staticmethod
    def _config_tuple(plan, cfg: dict) -> tuple:
        out = [(b, int(cfg[b])) for b in plan.block_names if b in cfg]
        if plan.rblock is not None:
            out = [(b, v) for b, v in out if b != "RBLOCK"] + [("RBLOCK", plan.rblock)]
            out.sort(key=lambda kv: plan.block_names.index(kv[0]))
        out += [(k, int(v)) for k, v in sorted(cfg.items()) if not k.isupper()]
        return tuple(out)

    def header(self, kernel: ScheduledKernel, plan) -> list[str]:
        lines = kernel_header(kernel, "#", " (triton)")
        what = {"pointwise1d": "pointwise, 1-D", "pointwise2d": "pointwise, 2-D tiles",
                "persistent": f"persistent reduction ({plan.reduction_shape})",
                "looped": f"looped reduction ({plan.reduction_shape})",
                "split-outer": "split reduction (outer): partials per r chunk, then an ordered combine",
                "scan": "scan, one program per row",
                "split-scan": "split scan: chunk totals, then each chunk's scan from the totals before it",
                "lookback-scan": "look-back scan: one launch; each chunk takes a ticket, publishes its total, "
                                 "looks back for its prefix and scans"}[plan.kind]
        lines.append(f"# plan: {what}, indices {plan.index_dtype}")
        return lines

    def function_name(self, kernel: ScheduledKernel) -> str:
        return kernel_function_name(kernel)

    def signature(self, kernel: ScheduledKernel) -> tuple[KernelArg, ...]:
        return kernel_signature(kernel)

    # ------------------------------------------------------------------ autotune
    def _device(self, kernel: ScheduledKernel):
        for buf in (*kernel.inputs, *kernel.outputs):
            dev = getattr(buf, "device", None)
            if dev is not None and torch.device(dev).type == "cuda":
                return torch.device(dev)
        return None

    def _tune(self, source: KernelSource, kernel: ScheduledKernel, configs) -> None:
        from fxwrap.targets.cuda_triton import autotune

        device = self._device(kernel)
        if device is None or not self.device_interface.is_available():
            return
        hints = dict(self.size_hints or {})

        def make(cfg):
            launch = source.launch.replace(config=cfg)
            launcher = self._bind(source.text, launch, device)
            if launch.plan != "split-outer":
                return launcher
            # timing only: the workspaces a program allocates for this config's NSPLIT
            xnumel = int(evaluate(sympy.Mul(*[sympy.sympify(r) for r in kernel.ranges]), hints)) \
                if kernel.ranges else 1
            ws = [torch.empty(dict(cfg)["NSPLIT"] * max(xnumel, 1), dtype=getattr(torch, d.replace("torch.", "")),
                              device=device) for d in launch.workspace_dtypes]
            n = launch.pointers
            return lambda *args: launcher(*args[:n], *ws, *args[n:])

        key = (_launch_key(source.text, source.launch.replace(config=()), device), tuple(configs),
               tuple(int(hints[sym]) if sym in hints else None for sym in kernel.size_symbols))
        with _CACHE_LOCK:
            hit = _TUNED.get(key)
        if hit is not None:
            best, timings = hit
            source.launch.autotune_reused = True
        else:
            # Kernels render inside AOTAutograd's compile, under its fake tensor mode: the
            # timing inputs must be real tensors (under the fake mode every config failed
            # with "Cannot access data pointer" and the first was kept, untimed).
            with torch.cuda.device(device), unset_fake_temporarily():
                self._bind_concurrently(make, configs, device)
                best, timings = autotune.choose(make, kernel, hints, configs, device, self.device_interface)
            with _CACHE_LOCK:
                _TUNED[key] = (best, timings)
        source.launch.config = best
        if source.launch.nsplit is not None:
            source.launch.nsplit = dict(best)["NSPLIT"]
        source.launch.autotuned = bool(timings)
        source.launch.timings_ms = tuple(sorted(timings.items()))

    def _bind_concurrently(self, make, configs, device) -> None:
        """Build every candidate config's launcher at once (Triton's compile waits on
        ptxas, a subprocess; a launcher stub built with gcc where the CUDA driver path
        does not apply), so that timing them finds
        them ready.  Best effort: a config that fails here fails again, and is skipped
        with its reason logged, when ``autotune.choose`` builds it.
        ``FXWRAP_TRITON_COMPILE_THREADS=1`` builds them one after another instead."""
        threads = min(int(os.environ.get("FXWRAP_TRITON_COMPILE_THREADS", self.load_threads) or 1),
                      len(configs))
        if threads < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        def build(cfg):
            try:
                with torch.cuda.device(device):
                    make(cfg)
            except Exception as e:  # noqa: BLE001 - reported by the sequential path
                log.debug("fxwrap: concurrent build of config %s: %s", cfg, e)

        with ThreadPoolExecutor(threads, thread_name_prefix="fxwrap-compile") as pool:
            list(pool.map(build, configs))

    # ------------------------------------------------------------------ compile workers
    @property
    def compile_workers(self) -> int:
        """How many Triton compile worker processes the process keeps (``compile_workers.py``);
        none for GPU kernels rendered where no GPU is (the ``cuda-offline`` renders: nothing to
        compile them for)."""
        if not self.interpret and not torch.cuda.is_available():
            return 0
        return default_count(self.interpret)

    def prepare(self) -> None:
        """Start the compile workers (their imports take seconds: begun before AOTAutograd)."""
        compile_workers(self.compile_workers)

    def load_ahead(self, sources: list) -> None:
        """Every kernel of a program about to be loaded, to the compile workers (those not given
        them at render: combos, template candidates)."""
        for source in sources:
            if isinstance(source.launch, TritonLaunch):
                self._compile_ahead(source.text, source.launch, [source.launch.config])

    def _compile_ahead(self, text: str, launch: TritonLaunch, configs, urgent: bool = False) -> None:
        """Each compile that binding ``launch`` with each of ``configs`` will make, to the
        compile workers (one job per body, config and device: ``_launch_key``)."""
        workers = compile_workers(self.compile_workers)
        if workers is None:
            return
        device = None
        if not launch.interpret:
            index = launch.device_index
            device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        for config in configs:
            for unit in _compiled_launches(launch.replace(config=config)):
                workers.submit(_launch_key(text, unit, device),
                               CompileUnit(text, unit.symbol, unit, tuple(unit.pointer_dtypes)), urgent=urgent)

    # ------------------------------------------------------------------ load
    def load(self, source: KernelSource):
        """Import the module and bind a launcher for ``source.launch.config`` on the
        kernel's device (``launch.device_index``; the current device when the kernel's
        buffers name none)."""
        launch = source.launch
        device = None
        if not launch.interpret:
            index = launch.device_index
            device = torch.device("cuda", torch.cuda.current_device() if index is None else index)
        return self._bind(source.text, launch, device)

    def user_kernel(self, name, source, signature, launch, triton_kernel):
        """A user's Triton kernel: launched as it is on ``cuda``, interpreted on ``triton-interpret``
        (``user_kernels.UserKernelLauncher``)."""
        from fxwrap.targets.cuda_triton import user_kernels
        launch = launch.replace(interpret=self.interpret)
        kernel = Kernel(name, source, self.target_name, signature, launch, loader=user_kernels.compile_time_loader)
        kernel.bind(user_kernels.launcher_for(triton_kernel, launch))
        return kernel

    def saved_loader(self, kernel):
        """``triton-interpret``: the source (``saved.interpreted_loader``); ``cuda``: the
        cubins and their launch metadata (``saved.CubinLoader``); a user's kernel: imported
        again by name (``user_kernels.saved_loader_of``)."""
        from fxwrap.targets.cuda_triton import saved
        if isinstance(kernel.launch, UserTritonLaunch):
            from fxwrap.targets.cuda_triton import user_kernels
            return user_kernels.saved_loader_of(kernel)
        if kernel.launch.interpret:
            return saved.interpreted_loader
        return saved.cubin_loader_of(kernel)

    def _bind(self, text: str, launch: TritonLaunch, device):
        """A launcher for ``launch.config``, shared by every kernel with the same body: built
        once, also where several threads ask for it at once (the repeated layers of a model
        loaded together)."""
        if device is None and not launch.interpret:
            device = torch.device("cuda", torch.cuda.current_device())
        key = _launch_key(text, launch, device)
        while True:
            with _CACHE_LOCK:
                hit = _LAUNCHERS.get(key)
                building = _BUILDING.get(key) if hit is None else None
                if hit is None and building is None:
                    _BUILDING[key] = mine = threading.Event()
            if logs.enabled("cache"):
                logs.logger("cache").debug("%s: %s", launch.symbol, "in-process launcher hit (same body)"
                                           if hit is not None else "miss, loading the module" if building is None
                                           else "being loaded by another thread: waiting for it")
            if hit is not None:
                return hit
            if building is None:
                break
            building.wait()  # then the launcher it built (or, where it failed, build it here)
        try:
            units = [self._bind_one(text, unit, device) for unit in _compiled_launches(launch)]
            if launch.parts:
                launcher = SequenceLauncher(units)
            elif launch.plan == "split-outer":
                launcher = SplitLauncher(*units, launch)
            else:
                (launcher,) = units
            with _CACHE_LOCK:
                return _LAUNCHERS.setdefault(key, launcher)
        finally:
            with _CACHE_LOCK:
                del _BUILDING[key]
            mine.set()

    def _bind_one(self, text: str, launch: TritonLaunch, device):
        interpret = bool(launch.interpret)
        workers = compile_workers(self.compile_workers)
        if workers is not None:  # a worker that began this compile: Triton's disk cache has it after
            workers.claim(_launch_key(text, launch, device))
        mod = load_module(text, launch.symbol, interpret)
        fn = getattr(mod, launch.symbol)
        if interpret:
            return InterpretedLauncher(fn, launch)
        dtypes = [getattr(torch, d.replace("torch.", "")) for d in launch.pointer_dtypes]
        index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(index):
            return bind_compiled(fn, launch, dtypes, index, device_count=self.device_interface.device_count())
