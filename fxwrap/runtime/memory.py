"""Run-time side of the Wrapper IR's ``Free`` line."""
from __future__ import annotations

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
