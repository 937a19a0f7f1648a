"""Launch metadata: what a launcher needs besides the kernel's source, as a typed record.

An emitter fills a ``KernelLaunch`` in ``render`` (``KernelSource.launch``); the ``Kernel``
built from it carries it (``kernel.launch``), and saved programs store it::

    >>> KernelLaunch(symbol="fxwrap_pointwise_0", language="c++", pointers=2, size_symbols=("s0",))
    KernelLaunch(symbol='fxwrap_pointwise_0', language='c++', pointers=2, size_symbols=('s0',), ...)
    >>> KernelLaunch.from_dict({"symbl": "k"})
    TypeError: unknown launch metadata ['symbl']; valid: ['autotune_reused', ..., 'workspace_dtypes']

Every field is declared below, one per line, grouped by the targets that read it; a
misspelled name is an error (the record has slots).  What an out-of-tree target needs of
its own goes in ``extra`` (a dict).  A dict is still accepted wherever a ``KernelLaunch``
is (``KernelSource(launch={...})``, ``Kernel(..., launch={...})``) and converted with the
same check.  ``launch["symbol"]`` / ``launch.get("symbol")`` read a declared field by name
for code written against the dict form (an undeclared name is a ``KeyError`` naming the
valid ones); new code reads attributes.

This module is part of the runtime: a saved program unpickles these records without the
compiler.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(slots=True)
class KernelLaunch:
    """The launch metadata of one kernel (see the module docstring).  None / empty: unset."""

    # --- every target: the entry point and its arguments
    # (a tuple field is set when not None: ``()`` is a value, e.g. a kernel without size symbols)
    symbol: str | None = None              # the kernel function's name in the source
    language: str | None = None            # "c++", "metal", "triton", "loop-ir"
    pointers: int | None = None            # tensor arguments (inputs, outputs, workspaces)
    size_symbols: tuple = ()               # size-symbol names, after the pointers
    in_place: tuple = ()                   # (input, output) argument names an output may share
    # --- C++ (OpenMP)
    parallel: str | None = None            # "openmp"
    # --- Metal
    kind: str | None = None                # "pointwise" or "reduction" (threadgroup-wide)
    grid: str | None = None                # threads in all, a Python expression over size_symbols
    threadgroup_size: int | None = None
    thread_args: tuple = ()                # the [[thread_position...]] attributes the kernel takes
    sync: bool | None = None               # threads of a group synchronize (barriers)
    execute: str | None = None             # "mps" or "shim" (the C++ shim on the CPU)
    # --- reference target
    kernel: Any = None                     # the legalized ScheduledKernel it evaluates
    # --- Triton
    plan: str | None = None                # tiling plan: "pointwise", "persistent", "split-outer", ...
    template: str | None = None            # the template that rendered it (plan "template")
    reduction_shape: str | None = None
    index_dtype: str | None = None
    numels: tuple = ()                     # (axis, host expression) per grid axis
    configs: tuple | None = None           # autotuning candidates ((name, value), ...) each
    config: tuple = ()                     # the chosen config
    interpret: bool | None = None          # run by Triton's CPU interpreter
    autotuned: bool | None = None
    autotune_reused: bool | None = None
    timings_ms: tuple = ()                 # (config, ms) per timed candidate
    pointer_dtypes: tuple = ()             # dtype name per pointer
    device_index: int | None = None        # the CUDA device it is loaded into and launched on
    grid_extra: str | None = None          # split scans: rows * chunks per row
    grid_factor: str | None = None         # split-outer partials: x tiles * NSPLIT
    parts: tuple = ()                      # launches run in order (a split scan's), each a record
    partial_symbol: str | None = None      # split-outer: the partials kernel
    combine_config: tuple | None = None    # split-outer: the combine kernel's config
    workspace_dtypes: tuple = ()
    nsplit: int | None = None
    # --- a user's Triton kernel (wrapper_ir/build_user_kernels.py)
    user_kernel: bool | None = None
    module: str | None = None
    qualname: str | None = None
    digest: str | None = None
    jit_key: str | None = None
    params: tuple = ()
    grids: int | None = None
    constants: tuple = ()
    reset_to_zero: tuple = ()
    restore_value: tuple = ()
    # --- an out-of-tree target's own metadata
    extra: dict = field(default_factory=dict)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_dict(cls, values) -> "KernelLaunch":
        """``{"symbol": ..., ...}`` as a record; an unknown key is a ``TypeError`` listing
        the valid ones (a target's own data goes in ``extra``)."""
        values = dict(values)
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown launch metadata {unknown}; valid: {sorted(cls.names())} "
                            "(a target's own metadata goes in extra={...})")
        return cls(**values)

    @classmethod
    def of(cls, value) -> "KernelLaunch":
        """A record as it is; None as an empty record; a dict (or any mapping) converted."""
        if isinstance(value, KernelLaunch):
            return value
        return cls() if value is None else cls.from_dict(value)

    def replace(self, **changes) -> "KernelLaunch":
        """A copy with ``changes`` (declared names only)."""
        return replace(self, **changes)

    def copy(self) -> "KernelLaunch":
        return replace(self)

    def as_dict(self) -> dict:
        """The fields that are set (not None; ``extra`` when not empty), by name."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None
                and not (f.name == "extra" and not v)}

    # -- the dict form, for code written against it (declared names only) ----------------
    def _check(self, name: str) -> str:
        if name not in _NAMES:
            raise KeyError(f"unknown launch metadata {name!r}; valid: {sorted(_NAMES)}")
        return name

    def __getitem__(self, name: str):
        value = getattr(self, self._check(name))
        if value is None:
            raise KeyError(name)
        return value

    def get(self, name: str, default=None):
        value = getattr(self, self._check(name))
        return default if value is None else value

    def __setitem__(self, name: str, value) -> None:
        setattr(self, self._check(name), value)

    def __contains__(self, name: str) -> bool:
        return self._check(name) in self.as_dict()

    def keys(self):
        return self.as_dict().keys()

    def items(self):
        return self.as_dict().items()


_NAMES = frozenset(KernelLaunch.names())
