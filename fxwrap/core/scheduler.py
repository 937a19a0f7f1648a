"""Fusion into kernels, and their order in the program.

The builder lowers ATen nodes to lazy ``Loops`` (pointwise producers are inlined
into their consumers) and records a *job* wherever a value must reach memory: a
graph output, an extern's argument, a reduction's result.  ``fuse`` then groups
consecutive jobs into kernels:

* pointwise jobs over the same iteration space share one loop nest (horizontal);
* reductions over the same rows share one kernel, each a pass over the row
  (softmax: max, then sum of exp(x - max));
* pointwise jobs over those rows (``(outer..., reduced...)`` or ``(outer...)``)
  join as the final pass: the epilogue (softmax's ``exp(x - max) / sum``).

Inside a group a load of a buffer the group itself stores at the same index is
replaced by the stored value (``acc`` for reductions), and a buffer nobody
outside its group reads is never stored or allocated.  ``[job(max), job(sum),
job(div)]`` for softmax becomes one ``ScheduledKernel`` with two reductions and
one store.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from fxwrap.core.ir import Op, Reduction, ScheduledKernel, Store, rvar, walk, xvar


@dataclass(eq=False)
class Job:
    """Work that writes buffers: ``stores`` over ``outer`` x vars (+ ``reduced`` r vars)."""

    outer: tuple
    reduced: tuple = ()
    dims_key: tuple = ()  # reductions: (input rank, reduced dims)
    reductions: list[Reduction] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)

    @property
    def trailing(self) -> bool:
        rank, dims = self.dims_key if self.dims_key else (0, ())
        return tuple(dims) == tuple(range(rank - len(dims), rank))


def substitute(op: Op, table: dict) -> Op:
    """``op`` with every ``load`` found in ``table`` (by (buffer, index)) replaced."""
    memo: dict[Op, Op] = {}
    for node in walk(op):
        if node.op == "load" and (node.args[0], node.args[1]) in table:
            memo[node] = table[(node.args[0], node.args[1])]
        elif node.children():
            args = tuple(memo.get(a, a) if isinstance(a, Op) else a for a in node.args)
            memo[node] = Op(node.op, node.dtype, args) if args != node.args else node
        else:
            memo[node] = node
    return memo[op]


def loads_of(op: Op) -> list[tuple[str, sympy.Expr]]:
    return [(n.args[0], n.args[1]) for n in walk(op) if n.op == "load"]


@dataclass(eq=False)
class Group:
    outer: tuple
    reduced: tuple = ()
    dims_key: tuple = ()
    reductions: list[Reduction] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    values: dict = field(default_factory=dict)  # (buffer, index) -> stored value
    row_stores: set = field(default_factory=set)  # buffers stored once per row

    def accepts(self, job: Job) -> bool:
        if job.reductions:
            if self.reductions or not self.stores:
                same = (job.outer, job.reduced, job.dims_key) == (self.outer, self.reduced, self.dims_key)
                if not self.reductions:
                    return False
                if not same:
                    return False
                # a reduction may not read what this group stores, unless it can take
                # the stored value itself (a reduction result at its row)
                stored = {s.buffer for s in self.stores}
                return not any(key[0] in stored and key not in self.values
                               for r in job.reductions for key in loads_of(r.value))
            return False
        if self.reductions:
            if not (job.outer == self.outer + self.reduced and self.trailing) and job.outer != self.outer:
                return False
        elif job.outer != self.outer:
            return False
        stored = {s.buffer for s in self.stores}
        for s in job.stores:
            for key in loads_of(s.value):
                if key[0] in stored and key not in self.values:
                    return False
        return True

    @property
    def trailing(self) -> bool:
        rank, dims = self.dims_key if self.dims_key else (0, ())
        return tuple(dims) == tuple(range(rank - len(dims), rank))

    def add(self, job: Job) -> None:
        self.origins.extend(o for o in job.origins if o not in self.origins)
        if self.reductions and not job.reductions and len(job.outer) > len(self.outer):
            job = _as_epilogue(job, len(self.outer))
        renames: dict[str, str] = {}
        for r in job.reductions:
            value = substitute(r.value, self.values)
            twin = next((q for q in self.reductions
                         if (q.kind, q.value, q.dtype) == (r.kind, value, r.dtype)), None)
            if twin is not None:  # var_mean's two welford outputs, repeated sums
                renames[r.name] = twin.name
                continue
            self.reductions.append(Reduction(r.name, r.kind, value, r.dtype))
        for s in job.stores:
            value = substitute(s.value, self.values)
            for old, new in renames.items():
                value = _rename_acc(value, old, new)
            self.stores.append(Store(s.buffer, s.index, value))
            self.values[(s.buffer, s.index)] = value


def subs_index(op: Op, mapping: dict) -> Op:
    """``op`` with ``mapping`` (symbol -> expr) applied to every index expression."""
    memo: dict[Op, Op] = {}
    for node in walk(op):
        if node.op == "load":
            memo[node] = Op("load", node.dtype, (node.args[0], sympy.sympify(node.args[1]).xreplace(mapping)))
        elif node.op == "index":
            memo[node] = Op("index", node.dtype, (sympy.sympify(node.args[0]).xreplace(mapping),))
        elif node.children():
            memo[node] = Op(node.op, node.dtype,
                            tuple(memo.get(a, a) if isinstance(a, Op) else a for a in node.args))
        else:
            memo[node] = node
    return memo[op]


def _as_epilogue(job: Job, n_outer: int) -> Job:
    """A pointwise job over ``(outer..., reduced...)`` re-indexed by ``(x..., r...)``."""
    mapping = {xvar(n_outer + i): rvar(i) for i in range(len(job.outer) - n_outer)}
    stores = [Store(s.buffer, sympy.sympify(s.index).xreplace(mapping), subs_index(s.value, mapping))
              for s in job.stores]
    return Job(job.outer, job.reduced, job.dims_key, job.reductions, stores, job.origins)


def _rename_acc(op: Op, old: str, new: str) -> Op:
    memo: dict[Op, Op] = {}
    for node in walk(op):
        if node.op == "acc" and node.args[0] == old:
            memo[node] = Op("acc", node.dtype, (new,) + tuple(node.args[1:]))
        elif node.children():
            args = tuple(memo.get(a, a) if isinstance(a, Op) else a for a in node.args)
            memo[node] = Op(node.op, node.dtype, args)
        else:
            memo[node] = node
    return memo[op]


def fuse(items: list) -> list:
    """Program items (lines and Jobs, in order) -> lines and Groups, in order."""
    out: list = []
    current: Group | None = None
    for item in items:
        if isinstance(item, Job):
            if current is not None and current.accepts(item):
                current.add(item)
                continue
            current = Group(item.outer, item.reduced, item.dims_key)
            current.add(item)
            out.append(current)
        else:
            out.append(item)
            current = None
    return out


def referenced_outside(groups_and_lines: list, buffers_in_lines) -> dict[int, set[str]]:
    """For each group (by id), the buffers it stores that something else reads."""
    needed: dict[int, set[str]] = {}
    readers: dict[str, set[int]] = {}
    for item in groups_and_lines:
        if isinstance(item, Group):
            ops = [r.value for r in item.reductions] + [s.value for s in item.stores]
            for op in ops:
                for name, _ in loads_of(op):
                    readers.setdefault(name, set()).add(id(item))
        else:
            for buf in buffers_in_lines(item):
                readers.setdefault(buf.name, set()).add(-1)
    for item in groups_and_lines:
        if isinstance(item, Group):
            needed[id(item)] = {s.buffer for s in item.stores
                                if readers.get(s.buffer, set()) - {id(item)}}
    return needed


def to_kernel(group: Group, name: str, keep: set[str], buffers: dict, extra_keep: set[str]) -> ScheduledKernel:
    """The ``ScheduledKernel`` of a group, storing only buffers in ``keep | extra_keep``."""
    stores = tuple(s for s in group.stores if s.buffer in keep or s.buffer in extra_keep)
    ops = [r.value for r in group.reductions] + [s.value for s in stores]
    input_names: list[str] = []
    for op in ops:
        for buf, _ in loads_of(op):
            if buf not in input_names:
                input_names.append(buf)
    output_names: list[str] = []
    for s in stores:
        if s.buffer not in output_names:
            output_names.append(s.buffer)
    iter_vars = {xvar(i) for i in range(len(group.outer))} | {rvar(i) for i in range(len(group.reduced))}
    symbols: set = set()
    for e in (*group.outer, *group.reduced, *(s.index for s in stores)):
        symbols |= sympy.sympify(e).free_symbols
    for op in ops:
        for node in walk(op):
            if node.op in ("load", "index"):
                symbols |= sympy.sympify(node.args[-1] if node.op == "load" else node.args[0]).free_symbols
    for b in input_names + output_names:
        for e in (*buffers[b].size, *buffers[b].stride):
            symbols |= sympy.sympify(e).free_symbols
    symbols -= iter_vars
    return ScheduledKernel(
        name=name,
        inputs=tuple(buffers[b] for b in input_names if b not in output_names),
        outputs=tuple(buffers[b] for b in output_names),
        size_symbols=tuple(sorted(symbols, key=lambda s: s.name)),
        ranges=tuple(group.outer), reduction_ranges=tuple(group.reduced),
        reductions=tuple(group.reductions), stores=stores, origins=tuple(group.origins))

