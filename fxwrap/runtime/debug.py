"""What the debug modes' lines call at run time (``options={"check_nan": True}``,
``options={"print_values": ...}``; the passes are in ``fxwrap.plugins.debug_modes``).

With ``check_nan`` every kernel and extern launch is followed by a check of the buffers
it wrote::

    fxwrap_pointwise_0(arg0, buf0)
    check_finite('kernel fxwrap_pointwise_0', 'log1p: aten.log1p.default', 'cpu', True, ('buf0',), ('arg0',), buf0)

which raises ``NonFiniteValueError`` naming the launch, what it computes, the output and
how many NaN/Inf values it holds.  On an accelerator the check reads a flag back to the
host: one synchronization per written buffer (a debug mode, not for timing runs).

With ``print_values`` the chosen buffers are summarized on stdout, one line each::

    [fxwrap.values] buf0 from kernel fxwrap_pointwise_0 (from: exp): shape=(16, 8) dtype=torch.float32 min=0.0412 max=23.7 mean=1.62 norm=25.9 nan=0 inf=0

Imports only torch (the runtime layer).
"""
from __future__ import annotations

import sys

import torch
import torch.fx

__all__ = ["NonFiniteValueError", "check_finite", "print_values", "summarize"]


class NonFiniteValueError(FloatingPointError):
    """A kernel or extern wrote NaN or Inf (raised by ``check_finite``); ``launch``,
    ``origins``, ``buffer``, ``nan`` and ``inf`` say which, where and how many."""

    def __init__(self, message: str, launch: str, origins: str, buffer: str, nan: int, inf: int):
        super().__init__(message)
        self.launch, self.origins, self.buffer, self.nan, self.inf = launch, origins, buffer, nan, inf


def _counts(tensor: torch.Tensor) -> tuple[int, int]:
    """(NaN count, Inf count) of a floating or complex tensor; (0, 0) for other dtypes."""
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.numel() == 0:
        return 0, 0
    return int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())


@torch.fx.node.has_side_effect
def check_finite(launch: str, origins: str, target: str, check_inf: bool, names: tuple, inputs: tuple,
                 *tensors):
    """Raise ``NonFiniteValueError`` when a tensor of ``tensors`` (the buffers ``names``
    that ``launch`` wrote, from the buffers ``inputs``) holds NaN, or Inf when
    ``check_inf``; else return None."""
    if any(isinstance(t, torch.fx.Proxy) for t in tensors):  # FX re-tracing on unpickle
        proxy = next(t for t in tensors if isinstance(t, torch.fx.Proxy))
        return proxy.tracer.create_proxy("call_function", check_finite,
                                         (launch, origins, target, check_inf, names, inputs, *tensors), {})
    for index, (name, tensor) in enumerate(zip(names, tensors)):
        if not isinstance(tensor, torch.Tensor) or not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        flags = torch.isnan(tensor) | torch.isinf(tensor) if check_inf else torch.isnan(tensor)
        if not bool(flags.any()):  # one read back to the host on an accelerator
            continue
        nan, inf = _counts(tensor)
        found = " and ".join(part for part in (f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else "")
                             if part)
        which = f"output {index + 1} of {len(names)}" if len(names) > 1 else "its output"
        selection = [*inputs, launch.split()[-1]]
        message = (f"fxwrap check_nan: {launch} (target {target}) wrote {found} into {which} {name} "
                   f"(shape {tuple(tensor.shape)}, {tensor.dtype}, {tensor.numel()} values): the first "
                   f"launch of this call to write a non-finite value.\n"
                   f"  it computes: {origins or '(no ATen origin recorded)'}\n"
                   f"  Every launch before it wrote finite values{' (its inputs ' + ', '.join(inputs) + ')' if inputs else ''}: "
                   "either its lowering or kernel is wrong, or it overflows on its inputs' values; see them "
                   f"with options={{'print_values': {selection!r}}}.")
        raise NonFiniteValueError(message, launch, origins, name, nan, inf)
    return None


def summarize(tensor: torch.Tensor) -> str:
    """``shape=(8, 16) dtype=torch.float32 min=0.0412 max=23.7 mean=1.62 norm=25.9 nan=0 inf=0``:
    statistics over the finite values (NaN and Inf are counted, not averaged)."""
    head = f"shape={tuple(tensor.shape)} dtype={tensor.dtype}"
    if tensor.numel() == 0:
        return f"{head} (empty)"
    if tensor.dtype == torch.bool:
        return f"{head} true={int(tensor.sum())} false={int((~tensor).sum())}"
    values = tensor.detach()
    if values.is_complex():
        values = values.abs()
    nan, inf = _counts(values)
    values = values.double()
    finite = values[torch.isfinite(values)] if nan or inf else values.reshape(-1)
    if finite.numel() == 0:
        return f"{head} (no finite value) nan={nan} inf={inf}"
    lo, hi = torch.aminmax(finite)
    stats = (f"min={float(lo):.6g} max={float(hi):.6g} mean={float(finite.mean()):.6g} "
             f"norm={float(torch.linalg.vector_norm(finite)):.6g}")
    return f"{head} {stats} nan={nan} inf={inf}"


@torch.fx.node.has_side_effect
def print_values(launch: str, origins: str, names: tuple, *tensors):
    """Print one ``summarize`` line per tensor of ``tensors`` (the buffers ``names``
    that ``launch`` wrote) to stdout, prefixed ``[fxwrap.values]``."""
    if any(isinstance(t, torch.fx.Proxy) for t in tensors):  # FX re-tracing on unpickle
        proxy = next(t for t in tensors if isinstance(t, torch.fx.Proxy))
        return proxy.tracer.create_proxy("call_function", print_values, (launch, origins, names, *tensors), {})
    where = f"{launch} ({origins})" if origins else launch
    for name, tensor in zip(names, tensors):
        if isinstance(tensor, torch.Tensor):
            print(f"[fxwrap.values] {name} from {where}: {summarize(tensor)}", file=sys.stdout, flush=True)
    return None
