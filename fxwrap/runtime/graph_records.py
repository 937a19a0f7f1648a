"""A GraphModule as plain picklable records, and back: what a saved program stores.

Each node is one record ``(op, name, target, args, kwargs)``; nodes in arguments are
``NodeRef(name)``, ATen overloads ``OpRef(namespace, op, overload)`` (an ``OpOverload``
does not pickle: its schema is a pybind object); everything else (kernels, the input
guard, dtypes, devices, ``torch.empty_strided``) pickles as itself::

    ("placeholder", "arg0", "arg0", (), {})
    ("call_function", "buf0", torch.empty_strided, ([8, 16], [16, 1]), {"dtype": torch.float32, ...})
    ("call_function", "mm_out", OpRef("aten", "mm", "out"), (NodeRef("arg0"), NodeRef("arg1")),
     {"out": NodeRef("buf0")})
    ("output", "output", "output", ((NodeRef("buf0"),),), {})

``graph_module_from_records`` rebuilds a ``torch.fx.GraphModule`` with no ``meta``
(no FakeTensors, no ShapeEnv, no sympy): the form a loaded program runs.  The
compiler's own pickling (``fxwrap.wrapper_ir.fx``) adds ``meta["val"]`` on top.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from fxwrap.runtime.kernel import Kernel


@dataclass(frozen=True)
class NodeRef:
    """A node named in another node's arguments."""

    name: str


@dataclass(frozen=True)
class OpRef:
    """``OpRef("aten", "mm", "out")`` stands for ``torch.ops.aten.mm.out``; ``overload=None``
    for the ``OpOverloadPacket``."""

    namespace: str
    op: str
    overload: str | None

    @classmethod
    def of(cls, value) -> "OpRef | None":
        if isinstance(value, torch._ops.OpOverload):
            return cls(value.namespace, value._schema.name.split("::")[-1], value._overloadname)
        if isinstance(value, torch._ops.OpOverloadPacket):
            return cls(value._qualified_op_name.split("::")[0], value.__name__, None)
        if isinstance(value, torch._ops.HigherOrderOperator):  # torch.ops.higher_order.cond
            return cls("higher_order", value.name(), None)
        return None

    def resolve(self):
        packet = getattr(getattr(torch.ops, self.namespace), self.op)
        return packet if self.overload is None else getattr(packet, self.overload)


def resolve_op(namespace: str, op: str, overload: str | None):
    """Unpickles an ATen operator by name (see ``OpRef``)."""
    return OpRef(namespace, op, overload).resolve()


def encode(value):
    """Nodes -> ``NodeRef``, operators -> ``OpRef``, through tuples, lists, dicts, slices."""
    if isinstance(value, torch.fx.Node):
        return NodeRef(value.name)
    op = OpRef.of(value)
    if op is not None:
        return op
    if isinstance(value, tuple):
        return tuple(encode(v) for v in value)
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(encode(value.start), encode(value.stop), encode(value.step))
    return value


def decode(value, nodes: dict):
    """The inverse of ``encode``, with ``nodes`` the graph's nodes by name."""
    if isinstance(value, NodeRef):
        return nodes[value.name]
    if isinstance(value, OpRef):
        return value.resolve()
    if isinstance(value, tuple):
        return tuple(decode(v, nodes) for v in value)
    if isinstance(value, list):
        return [decode(v, nodes) for v in value]
    if isinstance(value, dict):
        return {k: decode(v, nodes) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(decode(value.start, nodes), decode(value.stop, nodes), decode(value.step, nodes))
    return value


def attribute(module: torch.nn.Module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def graph_records(gm: torch.fx.GraphModule) -> dict:
    """``gm`` as records (see the module docstring) plus the attributes its ``get_attr``
    nodes read; no ``meta``."""
    records, attrs = [], {}
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            attrs[node.target] = attribute(gm, node.target)
        records.append((node.op, node.name, encode(node.target), encode(node.args), encode(dict(node.kwargs))))
    return {"class_name": type(gm).__name__, "records": records, "attrs": attrs, "training": gm.training}


def graph_module_from_records(state: dict) -> torch.fx.GraphModule:
    """The GraphModule of ``graph_records``; its kernels are listed in ``_fxwrap_kernels``."""
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    for op, name, target, args, kwargs in state["records"]:
        nodes[name] = graph.create_node(op, decode(target, nodes), decode(args, nodes), decode(kwargs, nodes),
                                        name=name)
    gm = torch.fx.GraphModule(state["attrs"], graph, class_name=state["class_name"])
    gm.train(state["training"])
    gm._fxwrap_kernels = kernels_of(gm)
    return gm


def kernels_of(gm: torch.fx.GraphModule) -> tuple[Kernel, ...]:
    """The kernels ``gm`` launches, in first-launch order."""
    return tuple(dict.fromkeys(n.target for n in gm.graph.nodes
                               if n.op == "call_function" and isinstance(n.target, Kernel)))
