"""Run-time checks the Wrapper IR calls before a kernel that trusts its inputs.

A kernel with an *indirect* load (gather, embedding, ``x[idx]``, ``index_select``)
reads at offsets computed from an index tensor.  Eager PyTorch raises on an index
out of range; a generated kernel would read outside its buffer.  The lowering
therefore puts a check on the host before the kernel::

    # gather: aten.gather.default
    check_index_bounds(arg1, 6, 1, False)
    fxwrap_pointwise_0(arg0, arg1, buf0)

which raises ``IndexError`` (the kernel never runs) when a value of ``arg1`` is not
in ``[0, 6)`` (``[-6, 6)`` when negative indices wrap, as in ``x[idx]``).

On a CPU the check reads the index range on the host.  On an accelerator reading it
would synchronize the host with the device on every call, so the check stays on the
device: ``torch._assert_async`` fails the stream (a device-side assert, as eager's own
index kernels do) instead of raising here, and the host runs ahead as it would without
the check.
"""
from __future__ import annotations

import torch
import torch.fx


@torch.fx.node.has_side_effect
def check_index_bounds(index, size, dim: int, negative_ok: bool) -> None:
    """Raise ``IndexError`` unless every value of ``index`` indexes a dim of ``size``."""
    if isinstance(index, torch.fx.Proxy):  # FX re-tracing on unpickle
        return index.tracer.create_proxy("call_function", check_index_bounds,
                                         (index, size, dim, negative_ok), {})
    numel = index.numel()
    if numel == 0:
        return None
    size = int(size)
    low = -size if negative_ok else 0
    if index.device.type != "cpu":
        lo, hi = torch.aminmax(index)
        torch._assert_async((lo >= low) & (hi < size),
                            f"index out of bounds for dimension {dim} with size {size}")
        return None
    if numel == 1:  # one position (a decode step's): read it, no reduction (a tenth of the time)
        lo = hi = index.item()
    else:
        lo, hi = (int(v) for v in torch.aminmax(index))
    for v in (lo, hi):
        if not low <= v < size:
            raise IndexError(f"index {v} is out of bounds for dimension {dim} with size {size}")
    return None


# what the compiler may assume of the call: it changes nothing, and on an accelerator it
# never reads a value back to the host (torch._assert_async), so a program calling it
# may still be captured into a CUDA graph
check_index_bounds.is_device_check = True
