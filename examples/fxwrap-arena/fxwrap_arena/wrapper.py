"""Runs an fxwrap GraphModule out of one preallocated byte arena, without ``gm.forward``: intermediate
``empty_strided`` storages get arena ranges, live from allocation to ``free`` node; outputs and functional
externs' results (never an alias of an input) are allocated per call.  See docs/adding-a-device.md."""
from __future__ import annotations

import itertools
import operator
import threading
from dataclasses import dataclass, field

import sympy
import torch
from fxwrap import WrapperCodegen, free, lines
from fxwrap.runtime.guards import check_inputs

_ARITH = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
          operator.mod, operator.pow, operator.neg, torch.sym_max, torch.sym_min}
_PURE = _ARITH | {torch.as_strided, operator.getitem}


class ArenaWrapper(WrapperCodegen):
    def compile_graph(self, gm: torch.fx.GraphModule) -> "ArenaProgram":
        return ArenaProgram(gm, torch.device(self.target.device_type), self.target.options.get("alignment", 64))


@dataclass
class Plan:
    """The arena for one set of sizes; ``offsets[name] = (byte, nbytes, first node, last node)``."""

    views: list = field(repr=False)
    offsets: dict
    arena_bytes: int
    arena_peak: int
    peak_bytes: int


def first_fit(blocks, align: int):
    """Largest first, each ``(key, nbytes, first, last)`` at the lowest aligned offset free
    throughout its lifetime; returns ``({key: offset}, arena bytes)``."""
    placed, offsets = [], {}
    for key, nbytes, first, last in sorted(blocks, key=lambda b: (-b[1], b[2])):
        size, off = -(-nbytes // align) * align, 0
        for o, sz in sorted((o, sz) for o, sz, f, l in placed if f <= last and first <= l):
            if off + size <= o:
                break
            off = max(off, o + sz)
        placed.append((off, size, first, last))
        offsets[key] = off
    return offsets, max((o + sz for o, sz, _, _ in placed), default=0)


def span(size, stride) -> int:
    """Elements of storage a strided layout spans."""
    return 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride))


def _reader(a, slot):
    """``env -> value`` of an FX argument, nodes read from their ``env`` slot."""
    return lambda env: torch.fx.node.map_arg(a, lambda n: env[slot[n]])


class ArenaProgram:
    """What ``compile_graph`` returns; ``last`` is the ``Plan`` of the latest call."""

    def __init__(self, gm: torch.fx.GraphModule, device: torch.device, align: int):
        nodes = list(gm.graph.nodes)
        self.slot = slot = {n: i for i, n in enumerate(nodes)}
        self.env0 = [operator.attrgetter(n.target)(gm) if n.op == "get_attr" else None for n in nodes]
        inputs = [n for n in nodes if n.op == "placeholder"]
        assert nodes[:len(inputs)] == inputs, "call arguments fill the first slots"
        size_inputs = [n for n in inputs if isinstance(n.meta.get("val"), (int, torch.SymInt))]
        self.sizes = {str(v.node.expr) if isinstance(v := n.meta.get("val"), torch.SymInt) else n.name: slot[n]
                      for n in size_inputs}  # size symbol -> slot of its input
        sizey = set(size_inputs)  # nodes computed from sizes alone
        self.root = root = {}
        last, end = {}, {}
        for i, n in enumerate(nodes):
            if n.op == "call_function" and n.target in _ARITH and set(n.all_input_nodes) <= sizey:
                sizey.add(n)
            root[n] = root[n.args[0]] if n.target is torch.as_strided else n
            last.update((x, i) for x in n.all_input_nodes)
            if n.target is free:
                end[root[n.args[0]]] = i
        # Storages: nodes that own new memory.  In the arena: intermediate empty_strided
        # on our device whose layout, and every view's, follows from the size inputs.
        self.life = {n: (i, end.get(n, len(nodes) - 1)) for i, n in enumerate(nodes) if root[n] is n
                     and n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)}
        shaped = {n for n in nodes if n.target in (torch.empty_strided, torch.as_strided)
                  and set(n.all_input_nodes) - {n.args[0]} <= sizey}
        arena = {n for n in self.life if n in shaped and n.target is torch.empty_strided
                 and torch.device(n.kwargs["device"]) == device} - {root[x] for x in nodes[-1].all_input_nodes}
        arena -= {root[n] for n in nodes if n.target is torch.as_strided and n not in shaped}
        self.arena_nodes = [n for n in nodes if root[n] in arena]  # allocations and their views
        self.read = {n: _reader(n.args, slot) for n in self.arena_nodes}
        # the input guard runs first: the sizes below are read off inputs it has not checked yet
        self.checks = [_reader(n.args, slot) for n in nodes if n.target is check_inputs]
        self.size_steps = [(n.target, _reader(n.args, slot), slot[n]) for n in nodes
                           if n in sizey and n.op != "placeholder"]
        self.steps = []  # (fn, args, kwargs, slot, slots to drop after it): all but sizes and arena views
        for i, n in enumerate(nodes):
            if n.op == "call_function" and n not in sizey and root[n] not in arena \
                    and n.target not in (free, check_inputs) and (n.users or n.target not in _PURE):
                self.steps.append((n.target, _reader(n.args, slot), _reader(dict(n.kwargs), slot), slot[n], []))
            if self.steps and n.op != "output":  # drop what dies here, as gm.forward would
                self.steps[-1][4].extend(slot[x] for x in [*n.all_input_nodes, n]
                                         if last.get(x, i) == i and x not in sizey)
        self.output = _reader(nodes[-1].args[0], slot)
        self.device, self.align, self.arena, self.plans, self.last = device, align, None, {}, None
        self.lock = threading.Lock()  # one arena: calls run one at a time

    def __call__(self, *args):
        env = self.env0.copy()
        env[:len(args)] = args
        for read in self.checks:
            check_inputs(*read(env))
        for fn, read, i in self.size_steps:
            env[i] = fn(*read(env))
        key = tuple(env[i] for i in self.sizes.values())
        with self.lock:
            self.last = plan = self.plans.get(key) or self._plan(key, env)
            for i, view in plan.views:
                env[i] = view
            for fn, read, read_kw, i, dead in self.steps:
                env[i] = fn(*read(env), **read_kw(env))
                for d in dead:
                    env[d] = None
            return self.output(env)

    def _plan(self, key: tuple, env: list) -> Plan:
        sizes = {name: sympy.Integer(env[i]) for name, i in self.sizes.items()}
        nbytes = {}  # storage bytes the way fxwrap.core.memory counts them, at this call's sizes
        for n in self.life:
            e = lines.Buffer.from_fake(n.name, n.meta["val"]).storage_bytes
            nbytes[n] = int(e.xreplace({s: sizes[s.name] for s in e.free_symbols}))
        nbytes.update((n, span(*self.read[n](env)) * n.kwargs["dtype"].itemsize)
                      for n in self.arena_nodes if n in self.life)
        offsets, total = first_fit([(n, nbytes[n], *self.life[n]) for n in self.arena_nodes if n in self.life],
                                   self.align)
        if self.arena is None or self.arena.numel() < total:
            self.arena = torch.empty(total, dtype=torch.uint8, device=self.device)
            self.plans.clear()  # their views are of the old arena
        for n in self.arena_nodes:  # views in node order: a view's base comes first
            if n in offsets:  # an allocation: its range of the arena
                dtype = n.kwargs["dtype"]
                view = torch.as_strided(self.arena.view(dtype), *self.read[n](env), offsets[n] // dtype.itemsize)
            else:  # as_strided's offset counts from its storage's start, which is in the arena
                base, size, stride, offset = self.read[n](env)
                view = torch.as_strided(base, size, stride, env[self.slot[self.root[n]]].storage_offset() + offset)
            env[self.slot[n]] = view
        live, arena_live = ([0] * (len(env) + 1) for _ in range(2))
        for n, (first, last) in self.life.items():
            for profile in (live, arena_live) if n in offsets else (live,):
                profile[first] += nbytes[n]
                profile[last + 1] -= nbytes[n]
        plan = Plan([(self.slot[n], env[self.slot[n]]) for n in self.arena_nodes],
                    {n.name: (offsets[n], nbytes[n], *self.life[n]) for n in offsets},
                    total, max(itertools.accumulate(arena_live)), max(itertools.accumulate(live)))
        if len(self.plans) >= 64:  # many distinct sizes: start over rather than grow
            self.plans.clear()
        self.plans[key] = plan
        return plan
