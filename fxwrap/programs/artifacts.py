"""Programs as files: ``program.save(path)``, ``fxwrap.load(path)``, ``pickle`` of a Program.

    >>> x = torch.randn(8)
    >>> program = fxwrap.lower(lambda t: t.sin() + 1, x)   # or training=True: a forward/backward pair
    >>> program.save("model.fxwrap")
    >>> # later, in another process, with no compiler:
    >>> loaded = fxwrap.load("model.fxwrap")               # a LoadedProgram (LoadedTrainingPrograms)
    >>> torch.equal(loaded.run(x), program.run(x))         # what program.run(x) returned
    True

A file is a zip archive of two members::

    header.json   {"format": "fxwrap-program", "format_version": 3, "fxwrap_version": "0.1.0",
                   "torch_version": "2.13.0+cpu", "target": "cpu", "device_type": "cpu",
                   "contents": "program", "runtime_versions": {"triton": "3.9.0"}}
    program.pkl   the pickled program (below)

``program.pkl`` holds, per program: its GraphModule as plain records
(``fxwrap.runtime.graph_records``: no FakeTensors, no sympy), the input guard and the
constants it reads as attributes, the ``ArgumentMap`` (with the parameters of a lowered
module) and ``OutputMap``, the target's wrapper class, and its kernels, each with the
loader its emitter's ``saved_loader`` gave it: the loader carries the kernel's binary
(C++ and Metal-shim shared objects, CUDA cubins) and imports no compiler module.
Loading checks the header, unpickles, rebuilds the GraphModule and binds every kernel:
``import fxwrap; fxwrap.load(path)`` imports no dynamo, AOTAutograd, Inductor, sympy or
fxwrap compiler module (``fxwrap.core``, ``fxwrap.wrapper_ir``, ``fxwrap.plugins``, the
emitters) and compiles nothing.  The ``reference`` target is the exception: its kernels
are loop IR that it evaluates with torch, so loading one imports ``fxwrap.ir.loops`` and
sympy (still no dynamo).

A file loads only with the fxwrap and torch versions that saved it (and Triton's, for
Triton kernels), and only where the target's device is present; otherwise
``ProgramFileError`` says so and what to do.  A file is a pickle: load only files you trust.
"""
from __future__ import annotations

import functools
import importlib.metadata
import io
import json
import os
import pickle
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from fxwrap.runtime.graph_replay import capture_runner, replay_runners
from fxwrap.runtime.graph_records import OpRef, graph_module_from_records, graph_records, kernels_of, resolve_op
from fxwrap.runtime.kernel import DamagedKernelError, Kernel, _rebuild, kernel_key
from fxwrap.targets.host.cache import write_atomically

FORMAT = "fxwrap-program"
FORMAT_VERSION = 3  # 3: the pickle names fxwrap.programs.* (the modules moved there); 2: per-target launch records (runtime/launch.py); 1: one KernelLaunch for every target
HEADER, PAYLOAD = "header.json", "program.pkl"


class ProgramFileError(RuntimeError):
    """A saved program cannot be loaded here: another fxwrap/torch version, an absent device,
    or not a program file.  The message says what to do (lower the function again)."""


@functools.lru_cache(maxsize=None)
def fxwrap_version() -> str:
    try:
        return importlib.metadata.version("fxwrap")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


@functools.lru_cache(maxsize=None)
def triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class SavedTarget:
    """What a loaded program knows of its target (its wrapper gets this, not a ``Target``)."""

    name: str
    device_type: str
    options: dict


@dataclass
class LoadedProgram:
    """A program read back by ``fxwrap.load`` (or ``pickle.loads`` of a ``Program``): runs
    like the ``Program`` it was saved from, with the runtime alone::

        loaded = fxwrap.load("f.fxwrap")
        loaded.run(x, w)              # f's own arguments -> f's return value
        loaded(*graph_inputs)         # the graph's inputs -> the flat output tuple
        loaded.graph_module.code      # def forward(self, arg0, arg1): ... (the kernels launch here)
    """

    kind: str
    target: SavedTarget
    graph_module: torch.fx.GraphModule
    runner: Callable
    arguments: Any = None
    outputs: Any = None
    wrapper: type | None = None  # the target's WrapperCodegen class (made ``runner``)
    capture: Any = None  # graph capture: (the device's GraphCapture, static input positions)

    @property
    def input_guard(self):
        return getattr(self.graph_module, "_fxwrap_input_guard", None)

    @property
    def kernels(self) -> tuple[Kernel, ...]:
        return kernels_of(self.graph_module)

    def __call__(self, *graph_inputs):
        """As ``Program.__call__``: the graph inputs, without autograd."""
        with torch.no_grad():
            return self.runner(*graph_inputs)

    def run(self, *args):
        """As ``Program.run``: the lowered function's positional arguments, its return value."""
        if self.arguments is None:
            raise TypeError(f"this {self.kind} program has no argument map (only inference and forward "
                            "programs made by fxwrap.lower have one); call it with its graph inputs")
        with torch.no_grad():
            outputs = self.runner(*self.arguments(args))
        return outputs if self.outputs is None else self.outputs(outputs, args)

    def save(self, path: str | os.PathLike) -> None:
        save(self, path)

    def __reduce__(self):
        return (loads, (dumps(self),))


@dataclass
class LoadedTrainingPrograms:
    """A saved ``TrainingPrograms`` read back: ``.forward`` and ``.backward`` are
    ``LoadedProgram``s that run as the compiled pair did (forward: the primals -> the
    outputs and what the backward saves; backward: the saved values and tangents -> the
    gradients, in AOTAutograd's order)."""

    forward: LoadedProgram
    backward: LoadedProgram

    def save(self, path: str | os.PathLike) -> None:
        save(self, path)

    def __reduce__(self):
        return (loads, (dumps(self),))


# ------------------------------------------------------------------------------ saving
class SavingPickler(pickle.Pickler):
    """A pickler that stores each ``Kernel`` with its saved loader (the emitter's
    ``saved_loader``: the binary, no compiler) and ATen operators by name."""

    def __init__(self, file, protocol=pickle.HIGHEST_PROTOCOL):
        super().__init__(file, protocol)
        self.loaders: dict[str, Callable] = {}  # kernel key -> saved loader
        self._emitters: dict[str, Any] = {}

    def reducer_override(self, obj):
        if isinstance(obj, Kernel):
            loader = self.loader_of(obj)
            return (_rebuild, (obj.name, obj.source, obj.target, obj.signature, obj.launch, loader,
                               kernel_key(obj.name, obj.source, obj.target, obj.signature, obj.launch, loader)))
        op = OpRef.of(obj)
        if op is not None:
            return (resolve_op, (op.namespace, op.op, op.overload))
        return NotImplemented

    def loader_of(self, kernel: Kernel) -> Callable:
        loader = self.loaders.get(kernel.key)
        if loader is None:
            loader = self.loaders[kernel.key] = self._saved_loader(kernel)
        return loader

    def _saved_loader(self, kernel: Kernel) -> Callable:
        if getattr(kernel.loader, "fxwrap_saved", False):  # loaded from a file already
            return kernel.loader
        emitter = self._emitters.get(kernel.target)
        if emitter is None:
            from fxwrap.plugins.manager import get_plugin_manager
            target = get_plugin_manager().target(kernel.target)
            emitter = self._emitters[kernel.target] = target.emitter(target)
        return emitter.saved_loader(kernel) or kernel.loader


def _portable_arguments(arguments):
    """The ``ArgumentMap`` with its size symbols as names (no sympy needed to load it)."""
    if arguments is None:
        return None
    sources = tuple((s[0], str(s[1]), *s[2:]) if s[0] == "size" else s for s in arguments.sources)
    return replace(arguments, sources=sources)


def _program_record(program) -> dict:
    """What a loaded program is rebuilt from (``program``: a ``Program`` or a ``LoadedProgram``)."""
    target = program.target
    if not isinstance(target, SavedTarget):
        target = SavedTarget(target.name, target.device_type, dict(target.options))
        wrapper = program.target.wrapper
        package = providing_package(type(program.target.device), program.target.emitter, wrapper)
    else:
        wrapper = program.wrapper
        package = providing_package(wrapper)
    capture = getattr(program, "capture", None)
    if capture is None and not isinstance(program.target, SavedTarget) \
            and replay_runners(program.runner):
        capture = (program.target.device.graph_capture(), tuple(program.static_inputs))
    return {"kind": program.kind, "target": target, "wrapper": wrapper, "graph": graph_records(program.graph_module),
            "arguments": _portable_arguments(program.arguments), "outputs": program.outputs,
            "capture": capture, "package": package}


def _contents(obj) -> tuple[str, dict]:
    if hasattr(obj, "forward") and hasattr(obj, "backward") and not isinstance(obj, torch.nn.Module):
        return "training", {"forward": _program_record(obj.forward), "backward": _program_record(obj.backward)}
    return "program", {"program": _program_record(obj)}


def pickled(value, pickler_type=SavingPickler) -> tuple[bytes, SavingPickler]:
    """``value`` pickled by a ``SavingPickler`` (kernels with their saved loaders)."""
    buffer = io.BytesIO()
    pickler = pickler_type(buffer)
    pickler.dump(value)
    return buffer.getvalue(), pickler


def providing_package(*parts: type) -> dict:
    """The module and installed distribution that provide a target: the first of ``parts``
    (its device interface's, emitter's and wrapper's classes) that is not fxwrap's own (a plugin may reuse
    ``fxwrap.WrapperCodegen`` or ``fxwrap.CpuDevice``), else fxwrap:
    ``{"module": "fxwrap_npu0", "distribution": "fxwrap-npu0"}`` -- what loading names where
    the target's plugin is missing (``distribution`` None where not installed)."""
    modules = [str(getattr(part, "__module__", "") or "").split(".")[0]
               for part in parts]
    module = next((m for m in modules if m and m != "fxwrap"), "fxwrap")
    return {"module": module, "distribution": _distributions().get(module, [None])[0]}


@functools.lru_cache(maxsize=1)
def _distributions() -> dict:
    return importlib.metadata.packages_distributions()


def _missing_module(exc: ModuleNotFoundError, header: dict, origin: str) -> ProgramFileError:
    """The error for a program file whose target plugin (or a module it needs) is not installed."""
    package = header.get("target_package") or {}
    distribution = package.get("distribution")
    install = (f"install the package {distribution!r} (pip install {distribution})" if distribution
               else f"install the package that provides the module {package.get('module') or exc.name!r}")
    return ProgramFileError(f"{origin} is a program for target {header.get('target')!r}, and loading it needs the "
                            f"module {exc.name!r}, which is not installed here (the target's plugin, module "
                            f"{package.get('module', '?')!r}); {install} and load it again")


def dumps(obj) -> bytes:
    """A ``Program``, ``TrainingPrograms`` or loaded one as the bytes of a program file."""
    contents, records = _contents(obj)
    payload, pickler = pickled({"contents": contents, **records})
    first = records.get("program") or records["forward"]
    runtimes = {}
    if triton_version() is not None and any(
            getattr(loader, "__module__", "").startswith("fxwrap.targets.cuda_triton")
            for loader in pickler.loaders.values()):
        runtimes["triton"] = triton_version()
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "fxwrap_version": fxwrap_version(),
              "torch_version": torch.__version__, "target": first["target"].name,
              "device_type": first["target"].device_type, "contents": contents, "runtime_versions": runtimes,
              "target_package": first["package"]}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in ((HEADER, json.dumps(header, indent=1, sort_keys=True).encode()), (PAYLOAD, payload)):
            member = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # no clock: same program, same bytes
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, data)
    return buffer.getvalue()


def save(obj, path: str | os.PathLike) -> None:
    """Write ``obj`` (see ``dumps``) to ``path``, atomically (a temporary file, then ``os.replace``)."""
    write_atomically(Path(path), dumps(obj))


# ------------------------------------------------------------------------------ loading
def check_header(header: dict, origin: str) -> None:
    """Raise ``ProgramFileError`` unless a program with ``header`` can run here."""
    if header.get("format") != FORMAT:
        raise ProgramFileError(f"{origin} is not an fxwrap program file (its header names format "
                               f"{header.get('format')!r}); save one with program.save(path)")
    if header.get("format_version") != FORMAT_VERSION:
        raise ProgramFileError(f"{origin} is an fxwrap program file of format version {header.get('format_version')}; "
                               f"this fxwrap reads version {FORMAT_VERSION}: lower the function again and save it "
                               "with this fxwrap")
    saved = (header.get("fxwrap_version"), header.get("torch_version"))
    here = (fxwrap_version(), torch.__version__)
    if saved != here:
        raise ProgramFileError(f"{origin} was saved by fxwrap {saved[0]} with torch {saved[1]}; this is fxwrap "
                               f"{here[0]} with torch {here[1]}. A saved program runs only with the versions that "
                               "saved it: lower the function again here (fxwrap.lower) and save it")
    for name, version in (header.get("runtime_versions") or {}).items():
        current = triton_version() if name == "triton" else None
        if current != version:
            raise ProgramFileError(f"{origin} holds {name} {version} kernels; this machine has {name} {current}: "
                                   "lower the function again here and save it")
    device_type = header.get("device_type", "cpu")
    why = _device_type_missing(device_type)
    if why is not None:
        raise ProgramFileError(f"{origin} is a program for target {header.get('target')!r}, which runs on "
                               f"{device_type} devices: {why}. Run it on a machine with one, or lower the "
                               "function again for a device this machine has (e.g. target='cpu') and save that")


def _device_type_missing(device_type: str) -> str | None:
    """Why tensors of ``device_type`` cannot be made in this process, asked of torch's own
    device module (``torch.get_device_module(device_type).is_available()``: ``torch.cpu``,
    ``torch.cuda``, ``torch.mps``, a PrivateUse1 backend's registered module); None when
    they can.  No fxwrap compiler module is imported: a loaded program needs none."""
    try:
        module = torch.get_device_module(device_type)
    except (RuntimeError, AttributeError):
        return (f"torch knows no {device_type!r} device in this process: import the package that registers "
                "it (a PrivateUse1 backend and its torch module) before loading")
    if not module.is_available():
        return f"this machine has no {device_type} device (torch.get_device_module({device_type!r}).is_available() is False)"
    return None


def _build(record: dict) -> LoadedProgram:
    gm = graph_module_from_records(record["graph"])
    for kernel in kernels_of(gm):  # bind every kernel now: a file that cannot run fails here
        kernel.launcher()
    wrapper = record["wrapper"](record["target"])
    capture = record.get("capture")  # (the device's GraphCapture, the static inputs' positions)
    runner = wrapper.compile_graph(gm) if capture is None else capture_runner(
        wrapper.compile_graph_per_call(gm), gm, capture[0], static=capture[1], name=f"loaded {record['kind']} program")
    return LoadedProgram(record["kind"], record["target"], gm, runner, record["arguments"], record["outputs"],
                         record["wrapper"], capture)



def loads(data: bytes, origin: str = "the fxwrap program") -> LoadedProgram | LoadedTrainingPrograms:
    """The program (or training pair) in ``data``, the bytes of a program file."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise ProgramFileError(f"{origin} is not an fxwrap program file ({exc}); save one with "
                               "program.save(path)") from exc
    with archive:
        try:
            header = json.loads(archive.read(HEADER))
        except (KeyError, ValueError) as exc:
            raise ProgramFileError(f"{origin} is not an fxwrap program file (no readable {HEADER}); save one "
                                   "with program.save(path)") from exc
        check_header(header, origin)
        try:
            payload = pickle.loads(archive.read(PAYLOAD))
        except ModuleNotFoundError as exc:  # the target's plugin is not installed here
            raise _missing_module(exc, header, origin) from exc
        except DamagedKernelError as exc:
            raise ProgramFileError(f"{origin}: {PAYLOAD} is damaged: {exc}; save the program again") from exc
        except (zipfile.BadZipFile, zlib.error, EOFError, pickle.UnpicklingError, ValueError, TypeError,
                AttributeError, IndexError, KeyError, UnicodeDecodeError, OverflowError, MemoryError) as exc:
            # a flipped or cut byte: the zip's CRC, the decompressor or the unpickler notices
            raise ProgramFileError(f"{origin}: {PAYLOAD} is damaged ({type(exc).__name__}: {exc}); the file "
                                   "was changed or cut after it was written: save the program again") from exc
    if payload["contents"] == "training":
        return LoadedTrainingPrograms(_build(payload["forward"]), _build(payload["backward"]))
    return _build(payload["program"])


def load(path: str | os.PathLike) -> LoadedProgram | LoadedTrainingPrograms:
    """Read a program file written by ``program.save(path)`` (see the module docstring)."""
    return loads(Path(path).read_bytes(), origin=str(path))
