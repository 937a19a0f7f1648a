"""Launch metadata: what a launcher needs besides the kernel's source, as typed records.

An emitter fills a record in ``render`` (``KernelSource.launch``); the ``Kernel`` built from
it carries it (``kernel.launch``), and saved programs store it.  ``KernelLaunch`` holds what
every target has (the entry point and its arguments); each built-in target's record adds
its own fields, and code reads them by attribute::

    >>> launch = CppLaunch(symbol="fxwrap_pointwise_0", language="c++", pointers=2, parallel="openmp")
    >>> launch.symbol, launch.pointers, launch.size_symbols
    ('fxwrap_pointwise_0', 2, ())
    >>> launch["symbol"]
    Traceback (most recent call last):
    TypeError: launch metadata is a CppLaunch read by attribute: launch.symbol (or getattr(launch, 'symbol')), not launch['symbol']
    >>> type(launch_record({"symbol": "k", "threadgroup_size": 64})).__name__
    'MetalLaunch'

* ``CppLaunch``: ``parallel``, how a C++ kernel (``cpu``) spreads over threads (``"openmp"``);
* ``MetalLaunch``: ``mps``/``mps_shim`` threads: ``kind``, ``grid``, ``threadgroup_size``,
  ``thread_args``, ``sync``, ``execute``;
* ``ReferenceLaunch``: ``kernel``, the legalized loop IR the reference target evaluates;
* ``TritonLaunch``: ``cuda``/``triton-interpret``: the tiling plan, configs, grid, pointer
  dtypes, a split reduction's or scan's parts;
* ``UserTritonLaunch``: a user's ``@triton.jit`` kernel: its constants, grids, and where a
  saved program imports it again.

Every field is declared, one per line; a misspelled name is an error (the records have
slots).  What an out-of-tree target needs of its own goes in ``extra`` (a dict), or in a
record type of its own (a ``@dataclass(slots=True)`` subclass of ``KernelLaunch``).  A
dict is still accepted wherever a record is (``KernelSource(launch={...})``,
``Kernel(..., launch={...})``): ``launch_record`` converts it to the first record type
above that declares all its keys (an unknown key is a ``TypeError`` listing the valid
ones).  ``launch["symbol"]`` is a ``TypeError``: records are read by attribute.

This module is part of the runtime: a saved program unpickles these records without the
compiler.  A record pickled by an fxwrap whose launch metadata was one record for every
target fails to unpickle with an error that says to lower the function again.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(slots=True)
class KernelLaunch:
    """The launch metadata every target has (see the module docstring).  None / empty: unset."""

    # (a tuple field is set when not None: ``()`` is a value, e.g. a kernel without size symbols)
    symbol: str | None = None              # the kernel function's name in the source
    language: str | None = None            # "c++", "metal", "triton", "loop-ir"
    pointers: int | None = None            # tensor arguments (inputs, outputs, workspaces)
    size_symbols: tuple = ()               # size-symbol names, after the pointers
    in_place: tuple = ()                   # (input, output) argument names an output may share
    grid: str | None = None                # work items in all (a grid-parallel kernel): a Python expression over size_symbols
    extra: dict = field(default_factory=dict)  # an out-of-tree target's own metadata

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values) -> "KernelLaunch":
        """``{"symbol": ..., ...}`` as a ``cls``; an unknown key is a ``TypeError`` listing
        the valid ones (a target's own data goes in ``extra``)."""
        values = dict(values)
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown launch metadata {unknown} for a {cls.__name__}; valid: "
                            f"{sorted(cls.names())} (a target's own metadata goes in extra={{...}})")
        return cls(**values)

    @classmethod
    def of(cls, value) -> "KernelLaunch":
        """A record as it is; None as an empty ``cls``; a dict (or any mapping) converted by
        ``launch_record``."""
        if isinstance(value, KernelLaunch):
            return value
        return cls() if value is None else launch_record(value)

    def replace(self, **changes) -> "KernelLaunch":
        """A copy with ``changes`` (declared names only)."""
        return replace(self, **changes)

    def copy(self) -> "KernelLaunch":
        return replace(self)

    def as_dict(self) -> dict:
        """The fields that are set (not None; ``extra`` when not empty), by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None
                and not (f.name == "extra" and not v)}

    def __getitem__(self, name):
        raise TypeError(f"launch metadata is a {type(self).__name__} read by attribute: "
                        f"launch.{name} (or getattr(launch, {name!r})), not launch[{name!r}]")

    def __contains__(self, name):
        raise TypeError(f"launch metadata is a {type(self).__name__} read by attribute: "
                        f"hasattr(launch, {name!r}) or isinstance(launch, <record type>), not {name!r} in launch")

    def __setstate__(self, state) -> None:
        """Unpickle: each pickled field must be one this record declares."""
        slots = state[1] if isinstance(state, tuple) else state
        unknown = sorted(set(slots or ()) - set(self.names()))
        if unknown:
            raise TypeError(
                f"pickled launch metadata of a {type(self).__name__} holds fields it does not declare "
                f"{unknown[:6]}{'...' if len(unknown) > 6 else ''}: it was saved by an older fxwrap, whose "
                "launch metadata was one record for every target; lower the function again (and save "
                "the program again)")
        for name, value in (slots or {}).items():
            setattr(self, name, value)


@dataclass(slots=True)
class CppLaunch(KernelLaunch):
    """A C++ kernel's launch (``cpu``; ``extern "C" void fxwrap_pointwise_0(const float* in_ptr0,
    float* out_ptr0, int64_t s0)`` with an OpenMP loop nest)."""

    parallel: str | None = None            # how the kernel spreads over threads: "openmp"


@dataclass(slots=True)
class MetalLaunch(KernelLaunch):
    """A Metal kernel's launch (``mps``, ``mps_shim``): ``kernel void fxwrap_sum_0(device const
    float* in_ptr0 [[buffer(0)]], ..., uint tid [[thread_position_in_grid]])`` run over ``grid``
    threads in groups of ``threadgroup_size``."""

    kind: str | None = None                # "pointwise" or "reduction" (threadgroup-wide)
    threadgroup_size: int | None = None
    thread_args: tuple = ()                # the [[thread_position...]] attributes the kernel takes
    sync: bool | None = None               # threads of a group synchronize (barriers)
    execute: str | None = None             # "mps" or "shim" (the C++ shim on the CPU)


@dataclass(slots=True)
class ReferenceLaunch(KernelLaunch):
    """The reference target's launch: the loop IR it evaluates with torch (``format_ssa`` is
    its source text)."""

    kernel: Any = None                     # the legalized ScheduledKernel it evaluates


@dataclass(slots=True)
class TritonLaunch(KernelLaunch):
    """A Triton kernel's launch (``cuda``, ``triton-interpret``): ``@triton.jit def
    fxwrap_pointwise_0(in_ptr0, out_ptr0, s0, XBLOCK: tl.constexpr)`` launched over
    ``cdiv(numel, XBLOCK)`` programs with ``config``.  A split scan's ``parts`` and a
    split-outer reduction's two kernels are ``TritonLaunch`` records too."""

    plan: str | None = None                # tiling plan: "pointwise1d", "persistent", "split-outer", "combo", ...
    template: str | None = None            # the template that rendered it (plan "template")
    reduction_shape: str | None = None
    index_dtype: str | None = None
    numels: tuple = ()                     # (axis, host expression) per grid axis
    configs: tuple | None = None           # autotuning candidates ((name, value), ...) each
    config: tuple = ()                     # the chosen config
    interpret: bool = False                # run by Triton's CPU interpreter
    autotuned: bool | None = None
    autotune_reused: bool | None = None
    timings_ms: tuple = ()                 # (config, ms) per timed candidate
    pointer_dtypes: tuple = ()             # dtype name per pointer
    device_index: int | None = None        # the CUDA device it is loaded into and launched on
    grid_extra: str | None = None          # split scans: rows * chunks per row; combo kernels: every member's blocks (over XBLOCK)
    grid_factor: str | None = None         # split-outer partials: x tiles * NSPLIT
    parts: tuple = ()                      # launches run in order (a split scan's), each a TritonLaunch
    partial_symbol: str | None = None      # split-outer: the partials kernel
    combine_config: tuple | None = None    # split-outer: the combine kernel's config
    workspace_dtypes: tuple = ()
    nsplit: int | None = None


@dataclass(slots=True)
class UserTritonLaunch(KernelLaunch):
    """A user's Triton kernel (``add_kernel[grid](x, y, out, n, BLOCK=64)`` in the compiled
    function; ``wrapper_ir/build_user_kernels.py``): what launches it, and what imports it
    again in a saved program."""

    module: str | None = None              # where a saved program imports the kernel from
    qualname: str | None = None
    digest: str | None = None
    jit_key: str | None = None             # the JITFunction's cache_key when compiled
    params: tuple = ()                     # the kernel's parameter names, in order
    grids: int | None = None               # grid sizes after the arguments
    constants: tuple = ()                  # (name, value) arguments the launch fixes
    configs: tuple | None = None           # an autotuned kernel's configs
    reset_to_zero: tuple = ()
    restore_value: tuple = ()
    interpret: bool = False                # run by Triton's CPU interpreter


LAUNCH_RECORDS: tuple[type[KernelLaunch], ...] = (KernelLaunch, CppLaunch, MetalLaunch, ReferenceLaunch,
                                                   TritonLaunch, UserTritonLaunch)


def launch_record(values) -> KernelLaunch:
    """A dict of launch metadata as the first record of ``LAUNCH_RECORDS`` that declares every
    key (``{"symbol": "k", "pointers": 2}``: a ``KernelLaunch``; with ``"plan"``: a
    ``TritonLaunch``); keys no record declares are a ``TypeError`` listing the valid ones."""
    values = dict(values)
    for record in LAUNCH_RECORDS:
        if set(values) <= set(record.names()):
            return record(**values)
    valid = sorted({name for record in LAUNCH_RECORDS for name in record.names()})
    unknown = sorted(set(values) - set(valid))
    raise TypeError(f"unknown launch metadata {unknown or sorted(values)}; valid: {valid} (one record "
                    "type must declare every key: " + ", ".join(r.__name__ for r in LAUNCH_RECORDS)
                    + "; a target's own metadata goes in extra={...})")
