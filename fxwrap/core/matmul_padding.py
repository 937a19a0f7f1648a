"""Matrix products whose rows are not aligned get a padded width: the vendor GEMM's fast kernels.

cuBLAS takes its fast kernels only when every matrix's leading dimension is a multiple of
16 bytes; GPT-2's language-model head (``(B*T, 768) @ (768, 50257)``, 50257 bf16 columns:
100514 bytes per row) runs in the slow ``align1`` kernel instead, 1151 us where the padded
product takes 167 us on an H200.  ``pad_matmul_columns(gm, alignment)`` rewrites each such
``mm``/``addmm`` of the ATen graph to compute ``N_padded`` columns and read the first ``N``
through a slice (a view, no copy)::

    mm = aten.mm(x, t)                          # t: (768, 50257), a transposed weight

becomes::

    t_t = aten.t(t)                             # the weight itself: (50257, 768), contiguous
    t_pad = aten.constant_pad_nd(t_t, [0, 0, 0, 7])          # (50264, 768): a copy kernel
    mm_pad = aten.mm(x, aten.t(t_pad))          # (B*T, 50264): 16-byte rows
    mm = aten.slice(mm_pad, 1, 0, 50257)        # the result, rows 50264 apart

(``addmm``'s bias is padded alike; a right operand that is not a transpose is padded
along its columns directly.)  Every node's ``meta["val"]`` is propagated again, so later
views see the padded strides.  An output of an inference graph, and a forward graph's
activation saved for the backward, keep the padded rows (``(B, T, 50257)`` logits with rows
50264 apart, as Inductor's ``pad_mm`` returns them): cloning them back to eager's layout
held the result twice at the program's end (GPT-2's bf16 logits at 2048 tokens: 196 MiB
more, peak 1.55x Inductor's, and a 108 us copy on an H200).  Other outputs whose strides
changed get their traced layout back through a ``clone``.  Only
products large enough to pay for the copies are padded (``MIN_FLOPS``), with static
sizes, and never a one-row product (a decode step's: it reads the weight once, the padding
would copy all of it on every call; the GEMV template reads it unpadded).  The device asks for
it: ``capabilities().matmul_alignment_bytes``.
"""
from __future__ import annotations

import logging
from collections.abc import Collection

import torch
import torch.fx
from torch._guards import detect_fake_mode

from fxwrap.core.layout import propagate, restore_traced_outputs

log = logging.getLogger("fxwrap.layout")
aten = torch.ops.aten

_PRODUCTS = (aten.mm.default, aten.addmm.default)
MIN_FLOPS = 1 << 27  # a product below this is left alone: the copies would cost more than they save
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _padded_width(node: torch.fx.Node, alignment: int, min_flops: int) -> int | None:
    """The padded column count of product ``node``, or None when it needs none."""
    if node.op != "call_function" or node.target not in _PRODUCTS:
        return None
    if node.target is aten.addmm.default and (node.kwargs or len(node.args) != 3):
        return None  # alpha/beta: left alone
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype not in _DTYPES or val.dim() != 2:
        return None
    if not all(isinstance(s, int) for s in (*val.shape, *val.stride())):
        return None
    a = node.args[-2].meta.get("val") if isinstance(node.args[-2], torch.fx.Node) else None
    if not isinstance(a, torch.Tensor) or not isinstance(a.shape[1], int):
        return None
    m, n = val.shape
    size = val.element_size()
    if m == 1:  # a one-row product (decode) reads each weight once: padding would copy it every call
        return None
    if (n * size) % alignment == 0 or 2 * m * n * a.shape[1] < min_flops or val.stride() != (n, 1):
        return None
    step = alignment // size
    return (n + step - 1) // step * step


def _padded_columns(graph: torch.fx.Graph, operand: torch.fx.Node, pad: int) -> torch.fx.Node:
    """``operand`` (K, N) with ``pad`` zero columns more, laid out as it was: a transposed
    weight is padded as the weight (rows) and transposed back."""
    val = operand.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dim() == 2 and val.stride(0) == 1 and val.shape[1] > 1:
        rows = graph.call_function(aten.t.default, (operand,))
        padded = graph.call_function(aten.constant_pad_nd.default, (rows, [0, 0, 0, pad]))
        return graph.call_function(aten.t.default, (padded,))
    return graph.call_function(aten.constant_pad_nd.default, (operand, [0, pad]))


def pad_matmul_columns(gm: torch.fx.GraphModule, alignment: int, min_flops: int | None = None,
                       keep_outputs: Collection[int] = ()) -> bool:
    """Rewrite ``gm`` as the module docstring says; True if it changed.  The rewrite is made
    on a copy of the graph, which replaces ``gm.graph`` only once it propagated.
    ``keep_outputs``: positions of outputs returned with their padded rows, not cloned back."""
    min_flops = MIN_FLOPS if min_flops is None else min_flops
    if not any(_padded_width(n, alignment, min_flops) for n in gm.graph.nodes):
        return False
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    outputs = graph.graph_copy(gm.graph, env)
    traced = {env[n]: n.meta.get("val") for n in gm.graph.nodes if n in env}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    fake_mode = detect_fake_mode([n.meta.get("val") for n in placeholders])
    if fake_mode is None or any("val" not in n.meta for n in placeholders):
        return False

    padded = 0
    for node in list(graph.nodes):
        width = _padded_width(node, alignment, min_flops)
        if width is None:
            continue
        n = node.meta["val"].shape[1]
        with graph.inserting_before(node):
            args = list(node.args)
            args[-1] = _padded_columns(graph, args[-1], width - n)
            bias = args[0].meta.get("val") if isinstance(args[0], torch.fx.Node) else None
            if node.target is aten.addmm.default and isinstance(bias, torch.Tensor) and bias.dim() \
                    and bias.shape[-1] == n:  # a bias of one column broadcasts to the padded ones
                args[0] = graph.call_function(aten.constant_pad_nd.default, (args[0], [0, width - n]))
            wide = graph.call_function(node.target, tuple(args))
        with graph.inserting_after(wide):
            narrow = graph.call_function(aten.slice.Tensor, (wide, 1, 0, n))
        node.replace_all_uses_with(narrow)
        graph.erase_node(node)
        padded += 1

    graph.output(outputs)
    candidate = torch.fx.GraphModule(gm, graph)
    what = "matmul padding"
    if not propagate(candidate, fake_mode, [n.meta["val"] for n in placeholders], what) \
            or not restore_traced_outputs(graph, traced, keep_outputs, what):
        return False
    gm.graph = graph
    gm.recompile()
    log.info("matmul padding: %d product(s) padded to %d-byte rows", padded, alignment)
    return True
