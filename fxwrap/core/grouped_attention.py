"""Grouped-query attention of one query position without the repeated keys and values.

A decode step of a model with grouped KV heads (``KV`` cached heads, each shared by ``G``
query heads: Llama's ``repeat_kv``, ``repeat_interleave(G, dim=1)``) repeats the whole
cache before attention, a copy of ``G`` times the cache per layer and step; with a single
query position the ``G`` query heads of a group can instead be the ``G`` query rows of one
attention over the group's own keys and values.  The ATen graph (CPU attention)::

    unsqueeze = aten.unsqueeze(k_cache, 2)                       # [B, KV, 1, S, D]
    expand = aten.expand(unsqueeze, [B, KV, G, S, D])
    clone = aten.clone(expand, memory_format=torch.contiguous_format)
    view = aten.view(clone, [B, KV * G, S, D])                   # the same for the values
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu(q, view, view_1, attn_mask=mask)
    getitem = sdpa[0]                                            # [B, KV * G, 1, D]

becomes, where ``q`` is ``[B, KV * G, 1, D]`` (viewable as ``[B, KV, G, D]``), the mask (if
any) has one head and one query row (it broadcasts the same way over the group's rows),
there is no dropout, no causal flag and nothing reads the log-sum-exp::

    view_q = aten.view(q, [B, KV, G, D])
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu(view_q, k_cache, v_cache, attn_mask=mask)
    getitem = sdpa[0]                                            # [B, KV, G, D]
    clone = aten.clone(getitem, memory_format=torch.contiguous_format)
    view = aten.view(clone, [B, KV * G, 1, D])                   # head kv * G + g: the original's order

(the last copy is one row of ``KV * G * D`` values; the repeats it replaces were ``2 * G``
copies of the cache).  Each query row is computed as before (same keys, values, mask and
scale: the default scale is ``1 / sqrt(D)`` of the same ``D``).  The repeats stay where
anything else reads them.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from fxwrap.core import logs

aten = torch.ops.aten

CPU_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _call(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _static(*sizes) -> bool:
    return all(isinstance(s, int) for s in sizes)


def _repeated_heads(node: torch.fx.Node):
    """``(cache, G)`` where ``node`` is ``cache [B, KV, S, D]`` with each head repeated ``G`` times
    next to each other (``view(clone(expand(unsqueeze(cache, 2))))``) and read by nothing else
    on the way, or None."""
    if not _call(node, aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return None
    clone = node.args[0]
    if not _call(clone, aten.clone.default) or len(clone.users) != 1:
        return None
    expand = clone.args[0]
    if not _call(expand, aten.expand.default) or len(expand.users) != 1:
        return None
    unsqueeze = expand.args[0]
    if not _call(unsqueeze, aten.unsqueeze.default) or unsqueeze.args[1] != 2 or len(unsqueeze.users) != 1:
        return None
    cache = unsqueeze.args[0]
    cv, ev, out = _val(cache), _val(expand), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (cv, ev, out)) or cv.dim() != 4 or ev.dim() != 5:
        return None
    b, kv, s, d = cv.shape
    groups = ev.shape[2]
    if not _static(b, kv, s, d, groups) or tuple(ev.shape) != (b, kv, groups, s, d) \
            or tuple(out.shape) != (b, kv * groups, s, d):
        return None
    return cache, groups


def _match(sdpa: torch.fx.Node):
    """``(q, k_cache, v_cache, groups)`` of a grouped one-position attention at ``sdpa``, or None."""
    if not _call(sdpa, CPU_ATTENTION):
        return None
    q, k, v = sdpa.args[:3]
    dropout = sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("dropout_p", 0.0)
    causal = sdpa.args[4] if len(sdpa.args) > 4 else sdpa.kwargs.get("is_causal", False)
    if dropout != 0.0 or causal:
        return None
    if any(not (_call(u, operator.getitem) and u.args[1] == 0) for u in sdpa.users):
        return None  # the log-sum-exp is read (a backward graph needs it)
    keys, values = _repeated_heads(k), _repeated_heads(v)
    if keys is None or values is None or keys[1] != values[1] or len(k.users) != 1 or len(v.users) != 1:
        return None
    groups = keys[1]
    qv, kc = _val(q), _val(keys[0])
    if not isinstance(qv, torch.Tensor) or qv.dim() != 4 or not _static(*qv.shape) or qv.shape[2] != 1:
        return None
    b, heads, _, d = qv.shape
    if heads != kc.shape[1] * groups or groups == 1:
        return None
    try:
        qv.view(b, kc.shape[1], groups, d)
    except RuntimeError:
        return None  # q's heads are not one stride apart: no view
    mask = _val(sdpa.kwargs.get("attn_mask"))
    if mask is not None and (mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1):
        return None
    return q, keys[0], values[0], groups


def grouped_decode_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite every grouped one-position CPU attention of ``gm`` (module docstring); returns
    how many.  ``meta["val"]`` of the new nodes is computed with the graph's fake values."""
    graph = gm.graph
    rewritten = 0
    for sdpa in list(graph.nodes):
        found = _match(sdpa)
        if found is None:
            continue
        q, k_cache, v_cache, groups = found
        qv, kv = _val(q), _val(k_cache).shape[1]
        b, heads, _, d = qv.shape
        (result,) = sdpa.users
        with graph.inserting_before(sdpa):
            view_q = graph.call_function(aten.view.default, (q, [b, kv, groups, d]))
            view_q.meta["val"] = qv.view(b, kv, groups, d)
            grouped = graph.call_function(CPU_ATTENTION, (view_q, k_cache, v_cache, *sdpa.args[3:]), dict(sdpa.kwargs))
            grouped.meta.update({k: v for k, v in sdpa.meta.items() if k in ("stack_trace", "nn_module_stack")})
            grouped.meta["val"] = CPU_ATTENTION(view_q.meta["val"], _val(k_cache), _val(v_cache), *sdpa.args[3:],
                                                **{k: _val(a) if isinstance(a, torch.fx.Node) else a
                                                   for k, a in sdpa.kwargs.items()})
            out = graph.call_function(operator.getitem, (grouped, 0))
            out.meta["val"] = grouped.meta["val"][0]
            ordered = graph.call_function(aten.clone.default, (out,), {"memory_format": torch.contiguous_format})
            ordered.meta["val"] = out.meta["val"].clone(memory_format=torch.contiguous_format)
            back = graph.call_function(aten.view.default, (ordered, [b, heads, 1, d]))
            back.meta["val"] = ordered.meta["val"].view(b, heads, 1, d)
        result.replace_all_uses_with(back)
        graph.erase_node(result)
        graph.erase_node(sdpa)
        rewritten += 1
    if rewritten:
        graph.eliminate_dead_code()
        gm.recompile()
        logs.logger("capture").debug("attention of %d grouped one-position queries without repeated heads",
                                     rewritten)
    return rewritten
