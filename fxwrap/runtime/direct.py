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

A target whose kernels' launchers read nothing of a tensor argument but its data pointer
(the CPU's C++ kernels: ``targets/cpu_cpp/wrapper.py``; the CUDA target's compiled Triton
kernels: ``targets/cuda_triton/wrapper.py``) passes ``pointer_kernel``, and
its copy also does less per call on the host:

* a View line whose every reader is such a kernel (or a view, which then views the base)
  and whose first element is its base's (no offset given, or the offset the base is known
  to have: 0 for an allocation) is not made: the kernels get the base, whose data pointer
  is the same (a memory plan's reuse of a storage chains views of views: a view the kernels
  of one layer read and the next layer's attention reads through a view of it goes too);
* ``free`` markers are left out (FX's code drops each local at its last use anyway),
  unless ``keep_free=True`` (the CUDA target: a collective's buffer must live to its wait);
* CPU allocations call torch's unchecked ``_empty_strided_cpu`` (Inductor's wrappers do)::

    program.graph_module:   buf3 = torch.as_strided(arg6, [128, 128], [1, 128])
                            buf4 = torch.empty_strided([1, 128], [128, 1], dtype = torch.float32, device = cpu)
                            fxwrap_template_2(buf5, buf3, buf4)
                            free = fxwrap_runtime_memory_free(buf4)
    what the target runs:   buf4 = empty_strided_cpu([1, 128], [128, 1], torch.float32)
                            fxwrap_template_2(buf5, arg6, buf4)
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.memory import free

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


# torch's private unchecked reinterpretation and CPU allocation (what Inductor's wrappers
# call); a torch without them runs the public, checked ``torch.as_strided`` and
# ``torch.empty_strided`` instead (same results)
_guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_reinterpret_tensor = getattr(_guards, "_reinterpret_tensor", None)
empty_strided_cpu = getattr(_guards, "_empty_strided_cpu", None)


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


def direct_graph_module(gm: torch.fx.GraphModule, prologue=None,
                        pointer_kernel: Callable[[Kernel], bool] | None = None,
                        keep_free: bool = False) -> torch.fx.GraphModule:
    """``gm`` with the calls of :data:`DIRECT_CALLS` retargeted and, when given, a call
    ``prologue()`` after the placeholders (``gm`` itself when there is nothing to do);
    ``pointer_kernel(kernel)``: the kernel's launcher reads only data pointers (see the
    module docstring: views it alone reads dropped, ``free`` markers dropped, CPU
    allocations unchecked)."""
    dropped = _pointer_views(gm, pointer_kernel) if pointer_kernel is not None else {}
    if prologue is None and pointer_kernel is None and not any(
            n.op == "call_function" and n.target in DIRECT_CALLS for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if prologue is not None and node.op != "placeholder":
            graph.call_function(prologue, ())
            prologue = None
        if node in dropped:
            env[node] = env[dropped[node]]
            continue
        if pointer_kernel is not None and not keep_free and node.op == "call_function" and node.target is free:
            continue
        new = graph.node_copy(node, lambda n: env[n])
        if new.op == "call_function" and new.target in DIRECT_CALLS:
            new.target = DIRECT_CALLS[new.target]
        if pointer_kernel is not None and _cpu_allocation(new):
            size, stride = new.args  # it takes tuples only
            new.target, new.args, new.kwargs = empty_strided_cpu, (tuple(size), tuple(stride), new.kwargs["dtype"]), {}
        env[node] = new
    direct = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    direct.meta.update(gm.meta)
    return direct


def _cpu_allocation(node: torch.fx.Node) -> bool:
    """``torch.empty_strided(size, stride, dtype=, device=cpu)`` with nothing else asked."""
    if empty_strided_cpu is None or node.op != "call_function" or node.target is not torch.empty_strided:
        return False
    device = node.kwargs.get("device")
    return (len(node.args) == 2 and set(node.kwargs) <= {"dtype", "device"} and "dtype" in node.kwargs
            and isinstance(device, torch.device) and device.type == "cpu")


def _pointer_views(gm: torch.fx.GraphModule, pointer_kernel) -> dict[torch.fx.Node, torch.fx.Node]:
    """The View nodes (``torch.as_strided``) read only by ``pointer_kernel`` launches (or by
    such views) whose data pointer is their base's, each mapped to the node whose tensor the
    launches get instead."""
    offsets: dict[torch.fx.Node, int | None] = {}  # storage offsets known at compile time
    same_pointer: list[torch.fx.Node] = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in (torch.empty_strided, torch.ops.aten.empty_strided.default):
            offsets[node] = 0
            continue
        if node.target is not torch.as_strided or not isinstance(node.args[0], torch.fx.Node):
            continue
        base = node.args[0]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        offsets[node] = offsets.get(base) if offset is None else (offset if isinstance(offset, int) else None)
        if offset is None or (offsets.get(base) is not None and offsets.get(base) == offset):
            same_pointer.append(node)
    droppable: set[torch.fx.Node] = set()
    for node in reversed(same_pointer):  # a view's readers first
        if node.users and all(user in droppable or _rebases(user, node) or (user.op == "call_function" and (
                user.target is free or (isinstance(user.target, Kernel) and pointer_kernel(user.target)
                                        and node not in user.kwargs.values())))
                for user in node.users):
            droppable.add(node)
    dropped: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in same_pointer:  # program order: a dropped view's base may be a dropped view
        if node in droppable:
            dropped[node] = dropped.get(node.args[0], node.args[0])
    return dropped


def _rebases(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """``user`` is a view of ``node`` that may take ``node``'s base instead: ``as_strided``
    places a view in its base's storage (an offset counted from the storage's start, or the
    base's own offset, which a same-pointer ``node`` shares with its base)."""
    return user.op == "call_function" and user.target is torch.as_strided and user.args[0] is node \
        and node not in user.args[1:] and node not in user.kwargs.values()
