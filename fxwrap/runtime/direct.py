"""The GraphModule a target runs: the program's FX graph with cheaper call targets.

A program's ``graph_module`` is the contract form of the Wrapper IR (docs/architecture.md,
"The Wrapper IR contract"): an extern calls
its ATen ``OpOverload``.  Calling an ``OpOverload`` from Python matches the arguments
against the op's schema at every call, about 2 us more per call on an H200 host than
the op's generated Python binding (``torch.mm``: 11.8 us against 13.8 us for
``torch.ops.aten.mm.out`` on 64x64 matrices), which is most of what a graph of small
matrix products spends outside its kernels; reading a view's storage offset through
``aten.sym_storage_offset`` costs ten times ``tensor.storage_offset()``; and a View line's
``torch.as_strided`` checks the view against its storage, which the input guard and the
memory plan already guarantee (a view of an input lies in the span of the sizes and strides
the guard checked; a view of a buffer in the storage the plan allocated), so the target runs
the unchecked reinterpretation Inductor's wrappers call, half the cost on the host.
``direct_graph_module(gm)`` returns a copy of ``gm`` in which the calls listed in
:data:`DIRECT_CALLS` -- ops whose Python binding takes the same positional arguments,
the same keyword names and the same ``out=``, and the metadata reads -- call the
cheaper form instead; every other node is unchanged::

    program.graph_module:   mm_out = torch.ops.aten.mm.out(arg0, arg1, out = buf0)
    what the target runs:   mm_out = torch.mm(arg0, arg1, out = buf0)

The copy shares the ``Kernel`` objects and constants of ``gm``.
"""
from __future__ import annotations

import torch

_aten = torch.ops.aten


def storage_offset(tensor: torch.Tensor) -> int:
    """``aten.sym_storage_offset`` of a real tensor (what a View line reads at run time)."""
    return tensor.storage_offset()


def size_of(tensor: torch.Tensor, dim: int) -> int:
    """``aten.sym_size.int`` of a real tensor."""
    return tensor.size(dim)


def stride_of(tensor: torch.Tensor, dim: int) -> int:
    """``aten.sym_stride.int`` of a real tensor."""
    return tensor.stride(dim)


# torch's private unchecked reinterpretation (what Inductor's wrappers call); a torch
# without it runs the public, checked ``torch.as_strided`` instead (same result)
_reinterpret_tensor = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None)


def view_of(base: torch.Tensor, size, stride, offset=None) -> torch.Tensor:
    """``torch.as_strided(base, size, stride, offset)`` without the bounds check (see the
    module docstring) where torch has the unchecked call, else ``torch.as_strided`` itself;
    ``offset`` None keeps ``base``'s storage offset."""
    if _reinterpret_tensor is None:
        return torch.as_strided(base, size, stride, offset)
    return _reinterpret_tensor(base, size, stride, 0 if offset is None else offset - base.storage_offset())


# ATen overload -> a callable with the same arguments, out= behaviour and result
DIRECT_CALLS = {
    torch.as_strided: view_of,
    _aten.mm.default: torch.mm, _aten.mm.out: torch.mm,
    _aten.bmm.default: torch.bmm, _aten.bmm.out: torch.bmm,
    _aten.addmm.default: torch.addmm, _aten.addmm.out: torch.addmm,
    _aten.baddbmm.default: torch.baddbmm, _aten.baddbmm.out: torch.baddbmm,
    _aten.sym_storage_offset.default: storage_offset,
    _aten.sym_size.int: size_of,
    _aten.sym_stride.int: stride_of,
}


def direct_graph_module(gm: torch.fx.GraphModule, prologue=None) -> torch.fx.GraphModule:
    """``gm`` with the calls of :data:`DIRECT_CALLS` retargeted and, when given, a call
    ``prologue()`` after the placeholders (``gm`` itself when there is nothing to do)."""
    if prologue is None and not any(n.op == "call_function" and n.target in DIRECT_CALLS
                                    for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if prologue is not None and node.op != "placeholder":
            graph.call_function(prologue, ())
            prologue = None
        new = graph.node_copy(node, lambda n: env[n])
        if new.op == "call_function" and new.target in DIRECT_CALLS:
            new.target = DIRECT_CALLS[new.target]
        env[node] = new
    direct = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    direct.meta.update(gm.meta)
    return direct
