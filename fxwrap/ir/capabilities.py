"""What a device says about itself: ``DeviceInterface.capabilities()`` returns a ``Capabilities``.

A typed, frozen record, checked as ``CompileOptions`` are: a misspelled field is an error,
never a silently ignored key::

    >>> Capabilities(dtypes=("float32", "bfloat16"), index_checks="in_kernel")
    Capabilities(dtypes=('float32', 'bfloat16'), ..., index_checks='in_kernel', ...)
    >>> Capabilities(index_check="in_kernel")
    Traceback (most recent call last):
    TypeError: Capabilities.__init__() got an unexpected keyword argument 'index_check'
    >>> Capabilities.from_dict({"convolution_layuot": "channels_last"})
    Traceback (most recent call last):
    TypeError: unknown device capability(ies) ['convolution_layuot']; valid: ['capability', ...

Fields fxwrap acts on come first (every one defaults to "no opinion"), then facts only
printed or keyed on (the program cache keys on the whole record).  A device with facts of
its own subclasses the record (``@dataclass(frozen=True) class NpuCapabilities(Capabilities):
tiles: int = 4``).  One field per line: a new capability is one line here plus its reader.
"""
from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

#: ``convolution_layout`` / ``training_convolution_layout`` values: ``"channels_last"`` (every
#: graph with 2-D convolutions) or ``"channels_last_half"`` (only graphs whose convolutions
#: all take float16/bfloat16 inputs: a device whose float32 NHWC convolutions use TF32, as
#: cuDNN's do by default, would change eager's float32 numbers)
CONVOLUTION_LAYOUTS = ("channels_last", "channels_last_half")
#: ``convolution_bias`` values: ``"call"`` (the convolution call adds it, the default) or
#: ``"epilogue"`` (the kernel after the convolution adds it: the vendor call would add it in
#: a pass of its own)
CONVOLUTION_BIAS = ("call", "epilogue")
#: ``index_checks`` values: ``"host"`` (ATen checks before the kernel, the default) or
#: ``"in_kernel"`` (the kernel traps on an index out of bounds)
INDEX_CHECKS = ("host", "in_kernel")


@dataclass(frozen=True)
class Capabilities:
    """A device's capabilities: ``CpuDevice().capabilities() ->
    Capabilities(dtypes=('float64', 'float32', ...), convolution_layout='channels_last', cores=8, ...)``.

    What fxwrap reads (None: no limit / no preference):

    * ``dtypes``: dtype names a generated kernel may hold; an op on another dtype runs
      as an ATen extern (``CompileSession.kernel_dtypes``); a float dtype not listed is
      computed in float32 (``CompileSession.numerics``).
    * ``convolution_layout``: ``"channels_last"`` runs inference graphs with 2-D
      convolutions channels-last (``fxwrap.core.layout``).
    * ``training_convolution_layout``: the same for training graphs; ``"channels_last_half"``:
      only where every convolution's input is float16 or bfloat16.
    * ``convolution_bias``: ``"epilogue"``: a convolution's bias is added by the kernel after
      it (``fxwrap.core.convolution_bias``); ``"call"`` or None: by the convolution call.
    * ``index_checks``: ``"in_kernel"``: gathers check their indices inside the kernel
      (``fxwrap.core.rules.indexing``); ``"host"`` or None: ATen checks before it.
    * ``matmul_alignment_bytes``: pad matrix products to leading dimensions of this many
      bytes (``fxwrap.core.matmul_padding``).
    * ``max_threads_per_threadgroup``: the Metal emitter's launch limit.
    """

    # --- read by fxwrap
    dtypes: tuple[str, ...] | None = None
    convolution_layout: str | None = None
    training_convolution_layout: str | None = None
    index_checks: str | None = None
    convolution_bias: str | None = None
    matmul_alignment_bytes: int | None = None
    max_threads_per_threadgroup: int | None = None
    # --- facts (printed, keyed on by the program cache)
    name: str | None = None
    capability: tuple[int, ...] | None = None
    kernel_language: str | None = None
    cores: int | None = None
    threads: int | None = None
    multiprocessors: int | None = None
    warp_size: int | None = None
    simd_width: int | None = None
    memory_bytes: int | None = None
    max_threads_per_block: int | None = None
    shared_memory_per_block: int | None = None
    l2_cache_bytes: int | None = None
    threadgroup_memory_bytes: int | None = None
    float64: bool | None = None
    shader_compiler: str | None = None

    def __post_init__(self):
        if self.dtypes is not None:
            if isinstance(self.dtypes, str):
                raise TypeError(f"Capabilities.dtypes must be a sequence of dtype names, got {self.dtypes!r}")
            names = tuple(str(d).replace("torch.", "") for d in self.dtypes)
            bad = [n for n in names if not isinstance(getattr(torch, n, None), torch.dtype)]
            if bad:
                raise ValueError(f"Capabilities.dtypes: {bad} are not torch dtype names "
                                 "(e.g. 'float32', 'bfloat16')")
            object.__setattr__(self, "dtypes", names)  # hashable, names only
        for name in ("convolution_layout", "training_convolution_layout"):
            value = getattr(self, name)
            if value is not None and value not in CONVOLUTION_LAYOUTS:
                raise ValueError(f"Capabilities.{name}={value!r} is not one of {list(CONVOLUTION_LAYOUTS)} "
                                 "(or None: the traced layout)")
        if self.convolution_bias is not None and self.convolution_bias not in CONVOLUTION_BIAS:
            raise ValueError(f"Capabilities.convolution_bias={self.convolution_bias!r} is not one of "
                             f"{list(CONVOLUTION_BIAS)}")
        if self.index_checks is not None and self.index_checks not in INDEX_CHECKS:
            raise ValueError(f"Capabilities.index_checks={self.index_checks!r} is not one of {list(INDEX_CHECKS)}")
        if self.capability is not None:
            object.__setattr__(self, "capability", tuple(self.capability))
        for name in ("matmul_alignment_bytes", "max_threads_per_threadgroup"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ValueError(f"Capabilities.{name}={value!r} must be a positive int (or None)")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Capabilities":
        """``{"dtypes": [...], ...}`` as a record; an unknown key is a ``TypeError`` listing the valid ones."""
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown device capability(ies) {unknown}; valid: {sorted(cls.names())} "
                            f"(a device with facts of its own subclasses fxwrap's Capabilities)")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set (not None), for printing."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def as_capabilities(value, device=None) -> Capabilities:
    """What a ``DeviceInterface.capabilities()`` returned, as a ``Capabilities``.

    The record itself passes through; None is ``Capabilities()``; a dict (the old
    contract) is converted with a ``DeprecationWarning`` (unknown keys: ``TypeError``)."""
    if isinstance(value, Capabilities):
        return value
    if value is None:
        return Capabilities()
    if isinstance(value, dict):
        who = type(device).__name__ if device is not None else "a device"
        warnings.warn(f"{who}.capabilities() returned a dict; return fxwrap.Capabilities(...) instead "
                      "(dicts are converted for now and will be rejected in a later release)",
                      DeprecationWarning, stacklevel=3)
        return Capabilities.from_dict(value)
    raise TypeError(f"{type(device).__name__ if device is not None else 'a device'}.capabilities() returned "
                    f"{type(value).__name__}; it must return fxwrap.Capabilities")
