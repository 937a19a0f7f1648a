"""Run-time side of the Wrapper IR's ``Free`` line."""
from __future__ import annotations

import torch
import torch.fx


@torch.fx.node.has_side_effect
def free(buf) -> None:
    """``free(buf1)``: the program is done with ``buf1``.

    The call is the buffer's last use, so the GraphModule drops its reference
    right after it and the storage goes back to the allocator.  Marked
    side-effectful so ``graph.eliminate_dead_code()`` keeps it.
    """
    if isinstance(buf, torch.fx.Proxy):  # FX re-tracing on unpickle
        return buf.tracer.create_proxy("call_function", free, (buf,), {})
    return None


def _keep_waits() -> None:
    """``_c10d_functional.wait_tensor`` ends a collective the program issued: an FX
    dead-code elimination must keep it even when nothing reads its result."""
    namespace = getattr(torch.ops, "_c10d_functional", None)
    packet = getattr(namespace, "wait_tensor", None) if namespace is not None else None
    if packet is not None:
        torch.fx.node.has_side_effect(packet.default)


_keep_waits()
