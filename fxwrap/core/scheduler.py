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
* a scan (``cumsum``...) starts a kernel of its own; pointwise jobs over its whole
  ranges (scanned dim last) join it as its epilogue (``cumsum(x) * 2``); its prologue
  is the lazy value it scans, inlined.

* a reduction over the iteration space of a pointwise group (the same sizes, up
  to an order of the dims) takes that group in as its prologue: the pointwise
  stores become the final pass over ``r``, and the reduction reads their values
  instead of the buffers (a bias gradient ``g.sum(0)`` next to the ``g`` it sums);
* a job may join the group before it across lines that neither touch what it
  writes nor define or mutate what it reads (views, size reads, an extern call on
  other buffers): the job moves up to the group's place.

Inside a group a load of a buffer the group itself stores at the same index is
replaced by the stored value (``acc`` for reductions), and a buffer nobody
outside its group reads is never stored or allocated.  ``[job(max), job(sum),
job(div)]`` for softmax becomes one ``ScheduledKernel`` with two reductions and
one store.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass, field

import sympy
import torch

from fxwrap.ir.loops import (Op, OpCode, Reduction, ScheduledKernel, Store, acc_key, direct_indices, is_indirect,
                            is_loop_var,
                            load_buffer,
                            load_key,
                            rewrite, rvar, walk, xvar)
from fxwrap.ir.symbolic import simplify_index
from torch.utils._sympy.functions import FloorDiv, ModularIndexing


@dataclass(eq=False)
class Job:
    """Work that writes buffers: ``stores`` over ``outer`` x vars (+ ``reduced`` r vars)."""

    outer: tuple
    reduced: tuple = ()
    dims_key: tuple = ()  # reductions: (input rank, reduced dims)
    reductions: list[Reduction] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    origins: list = field(default_factory=list)  # provenance.Origin of every ATen node it computes
    roots: list[str] = field(default_factory=list)  # the ATen nodes whose values it stores
    #: a template job (``fxwrap.core.templates.TemplateCall``): one store of the op's
    #: result over its output's sizes, valued ``template_out``; it reads the call's operands
    template: object = None

    @property
    def trailing(self) -> bool:
        rank, dims = self.dims_key if self.dims_key else (0, ())
        return tuple(dims) == tuple(range(rank - len(dims), rank))


def template_reads(item) -> set[str]:
    """The buffers a job's or group's template reads (its operands; none without one)."""
    call = getattr(item, "template", None)
    return {b.name for b in call.operands} if call is not None else set()


# A lazy value read by several consumers is inlined into each of them; past these
# sizes it is stored once instead (by the kernel that first needs it).  Without the
# limit, a residual stream ``x = x + f(x)`` repeated over L layers is recomputed from
# all L + 1 of its terms by every reader: O(L^2) loads.
SHARED_VALUE_MAX_LOADS = 4    # distinct buffers the inlined value reads
SHARED_VALUE_MAX_OPS = 40     # nodes of its expression


def worth_storing(value: Op, readers: int, costly_ops: frozenset = frozenset()) -> bool:
    """Whether a lazy value with ``readers`` consumers should be stored once rather
    than inlined into each: it reads more than ``SHARED_VALUE_MAX_LOADS`` buffers, has
    more than ``SHARED_VALUE_MAX_OPS`` nodes, or computes one of ``costly_ops`` (the
    emitter's ``KernelEmitter.costly_ops``: ``cos(pos * inv_freq)`` read by q's and k's
    kernels of every layer is stored once).  ``value`` is the value at one index
    (``loops(xs)``)."""
    if readers < 2:
        return False
    nodes = walk(value)
    if len(nodes) > SHARED_VALUE_MAX_OPS:
        return True
    if costly_ops and any(n.op in costly_ops for n in nodes):
        return True
    buffers = {load_buffer(n) for n in nodes if n.op == OpCode.LOAD}
    return len(buffers) > SHARED_VALUE_MAX_LOADS


def substitute(op: Op, table: dict) -> Op:
    """``op`` with every ``load`` found in ``table`` (by (buffer, index)) replaced."""
    if not table:
        return op
    return rewrite(op, {OpCode.LOAD: lambda load: table.get(load_key(load))})


def _expand(index):
    """A load index in canonical form (an indirect index, an ``Op``, as it is)."""
    return index if is_indirect(index) else sympy.expand(index)


@functools.lru_cache(maxsize=1 << 16)
def loads_of(op: Op) -> tuple[tuple[str, sympy.Expr], ...]:
    """``(buffer, index)`` of every distinct load under ``op``, in walk order.  Memoized (ops
    are interned and immutable): fusion asks it of a group's values again at every job that
    tries to join the group, each time a walk of the whole expression."""
    return tuple(load_key(n) for n in walk(op) if n.op == OpCode.LOAD)


def store_reads(stores) -> set[str]:
    """The buffers ``stores`` read beyond their values' loads: what an indexed store's
    offset loads (the index tensor), and the buffer it writes into, whose other elements
    it leaves as they were (and, accumulating, whose elements it reads)."""
    return {name for st in stores if st.indexed for name in [st.buffer, *(b for b, _ in loads_of(st.index))]}


def indexed(item) -> bool:
    """A job or group of indexed stores (``Store.indexed``): a kernel of its own."""
    return any(st.indexed for st in item.stores)


@dataclass(eq=False)
class Group:
    outer: tuple
    reduced: tuple = ()
    dims_key: tuple = ()
    reductions: list[Reduction] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    origins: list = field(default_factory=list)  # provenance.Origin, as Job.origins
    roots: list[str] = field(default_factory=list)
    started_because: str = ""  # why its first job did not join the kernel before (the fusion log)
    values: dict = field(default_factory=dict)  # (buffer, index) -> stored value
    row_stores: set = field(default_factory=set)  # buffers stored once per row
    template: object = None  # a template group: its TemplateCall (the first job's)
    #: ``(key, (used, written))`` of the stores and reductions it was computed for (``footprint``)
    _footprint_memo: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def footprint(self) -> tuple[frozenset, frozenset]:
        """``(buffers used, buffers written)``: what it loads, stores and its template reads;
        kept until a job joins (every fusion decision asks it of the groups since)."""
        key = (id(self.stores), len(self.stores), id(self.reductions), len(self.reductions))
        if self._footprint_memo is None or self._footprint_memo[0] != key:
            ops = [r.value for r in self.reductions] + [s.value for s in self.stores]
            writes = frozenset(s.buffer for s in self.stores)
            reads = {b for op in ops for b, _ in loads_of(op)} | store_reads(self.stores)
            self._footprint_memo = (key, (frozenset(reads | writes | template_reads(self)), writes))
        return self._footprint_memo[1]

    def refusal(self, job: Job, roots: dict | None = None) -> str | None:
        """Why ``job`` may not join this group (None: it may), for the fusion log;
        ``roots``: a view's buffer name -> the buffer it views."""
        if indexed(job) or indexed(self):
            return "an indexed write (index_put, scatter) is a kernel of its own"
        if self.writes_what_it_reads(job, roots):
            return "it writes a buffer the kernel reads"
        if job.template is not None:
            return "a template starts a kernel of its own"
        if self.template is not None:
            # a template group takes pointwise jobs over its output's sizes: the epilogue
            if job.reductions or job.reduced:
                return "a reduction after a template (a template's epilogue is pointwise)"
            if tuple(job.outer) != tuple(self.outer):
                return (f"other loop ranges ({tuple(job.outer)} vs the template's output "
                        f"{tuple(self.outer)})")
            stored = {s.buffer for s in self.stores}
            for s in job.stores:
                for key in loads_of(s.value):
                    if key[0] in stored and key not in self.values:
                        return f"it reads {key[0]}, which the template kernel stores, at another index"
            return None
        if any(r.is_scan for r in job.reductions):
            return "a scan starts a kernel of its own"
        if any(r.is_scan for r in self.reductions):
            if job.reductions:
                return "a reduction after a scan"
            if not (job.outer == self.outer + self.reduced and self.trailing):
                return (f"a scan kernel takes only pointwise work over its whole ranges "
                        f"{tuple(self.outer) + tuple(self.reduced)} with the scanned dim last, not {tuple(job.outer)}")
        if job.reductions and not self.reductions and self.stores:
            if self.prologue_mapping(job) is None:
                return "no mapping of the pointwise kernel's loops onto the reduction's (x, r) ranges"
            return None
        if job.reductions:
            if self.reductions or not self.stores:
                same = (job.outer, job.reduced, job.dims_key) == (self.outer, self.reduced, self.dims_key)
                if not self.reductions:
                    return "an empty kernel"
                if not same:
                    return (f"reduction over other ranges ({tuple(job.outer)} x {tuple(job.reduced)} vs "
                            f"{tuple(self.outer)} x {tuple(self.reduced)})")
                # a reduction may not read what this group stores, unless it can take
                # the stored value itself (a reduction result at its row)
                stored = {s.buffer for s in self.stores}
                if any(key[0] in stored and key not in self.values
                       for r in job.reductions for key in loads_of(r.value)):
                    return "the reduction reads a value the kernel stores, at another index"
                return None
            return "a reduction after a reduction kernel's epilogue"
        if self.reductions:
            if not (job.outer == self.outer + self.reduced and self.trailing) and job.outer != self.outer:
                return (f"pointwise ranges {tuple(job.outer)} are neither the reduction's rows "
                        f"{tuple(self.outer)} nor its full ranges")
            if len(job.outer) > len(self.outer):
                job = _as_epilogue(job, len(self.outer))  # indexed as ``add`` will index it
        elif job.outer != self.outer:
            return f"other loop ranges ({tuple(job.outer)} vs {tuple(self.outer)})"
        stored = {s.buffer for s in self.stores}
        for s in job.stores:
            for key in loads_of(s.value):
                if key[0] in stored and key not in self.values:
                    return f"it reads {key[0]}, which the kernel stores, at another index"
        return None

    @property
    def trailing(self) -> bool:
        rank, dims = self.dims_key if self.dims_key else (0, ())
        return tuple(dims) == tuple(range(rank - len(dims), rank))

    def writes_what_it_reads(self, job: Job, roots: dict | None = None) -> bool:
        """Whether ``job`` stores into a buffer this group reads, itself or through a view
        (``copy_`` into a graph input): in one kernel other iterations could read the
        value already written."""
        root = (lambda name: roots.get(name, name)) if roots else (lambda name: name)  # noqa: E731
        ops = [r.value for r in self.reductions] + [s.value for s in self.stores]
        loads = [key for op in ops for key in loads_of(op)]
        read = {root(b) for b, _ in loads} | {root(b) for b in template_reads(self)}
        return any(root(s.buffer) in read and not self._read_where_written(s, job, loads, root) for s in job.stores)

    def _read_where_written(self, store: Store, job: Job, loads: list, root) -> bool:
        """Whether this pointwise group reads ``store``'s buffer only at the element each
        iteration of ``job`` (over the same ranges, every loop var in the store's index)
        then writes, and never through a view: each element is read, then overwritten,
        by one iteration (``x.mul_(3)`` after ``x`` was read: the ``copy_`` into an input
        joins the kernel that reads it)."""
        if self.reductions or self.reduced or self.template is not None or store.indexed \
                or tuple(job.outer) != tuple(self.outer) or root(store.buffer) != store.buffer \
                or store.buffer in template_reads(self):
            return False
        index = _expand(store.index)
        if not {xvar(i) for i in range(len(job.outer))} <= sympy.sympify(index).free_symbols:
            return False
        return all(b == store.buffer and _expand(i) == index for b, i in loads if root(b) == store.buffer)

    def prologue_mapping(self, job: Job) -> dict | None:
        """How this pointwise group's vars map onto reduction ``job``'s ``(x..., r...)``.

        Only bijections between equal sizes are candidates; the reduction must read
        every buffer of the group exactly where a remapped store writes it (the
        stores run in the final pass, after the reductions).  Among the candidates
        the one sharing the most loads with the reduction wins (the first, in
        ``itertools.permutations`` order, on a tie); none shared: no fusion.
        """
        if self.reductions or not self.stores or not job.reduced:
            return None
        targets = [(xvar(i), sympy.sympify(n)) for i, n in enumerate(job.outer)]
        targets += [(rvar(i), sympy.sympify(n)) for i, n in enumerate(job.reduced)]
        sizes = [sympy.sympify(n) for n in self.outer]
        if len(sizes) != len(targets) or len(sizes) > 6:
            return None
        if any(n == 1 for _, n in targets):
            return None
        rvars = {rvar(i) for i in range(len(job.reduced))}
        stored = {st.buffer for st in self.stores}
        red_loads = [key for r in job.reductions for key in loads_of(r.value)]
        best, best_score = None, 0
        for perm in itertools.permutations(range(len(targets))):
            if any(sizes[i] != targets[j][1] for i, j in enumerate(perm)):
                continue
            mapping = {xvar(i): targets[j][0] for i, j in enumerate(perm)}
            stores = [Store(st.buffer, sympy.expand(sympy.sympify(st.index).xreplace(mapping)),
                            subs_index(st.value, mapping)) for st in self.stores]
            if any(not (sympy.sympify(st.index).free_symbols & rvars) for st in stores):
                continue
            keys = {(st.buffer, st.index) for st in stores}
            if any(k[0] in stored and (k[0], _expand(k[1])) not in keys for k in red_loads):
                continue
            mine = keys | {(b, _expand(i)) for st in stores for b, i in loads_of(st.value)}
            score = sum((b, _expand(i)) in mine for b, i in red_loads)
            if score > best_score:
                best, best_score = mapping, score
        return best

    def take_as_prologue(self, job: Job) -> None:
        """Turn this pointwise group into a reduction group over ``job``'s ranges."""
        mapping = self.prologue_mapping(job)
        stores = [Store(st.buffer, sympy.expand(sympy.sympify(st.index).xreplace(mapping)),
                        subs_index(st.value, mapping)) for st in self.stores]
        self.outer, self.reduced, self.dims_key = tuple(job.outer), tuple(job.reduced), job.dims_key
        self.stores = stores
        self.values = {(st.buffer, st.index): st.value for st in stores}

    def add(self, job: Job) -> None:
        self.origins.extend(o for o in job.origins if o not in self.origins)
        self.roots.extend(r for r in job.roots if r not in self.roots)
        if job.reductions and not self.reductions and self.stores:
            self.take_as_prologue(job)
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
            self.stores.append(dataclasses.replace(s, value=value))
            if not s.indexed:
                self.values[(s.buffer, s.index)] = value


_INDEX_COMPARISONS = {OpCode.LT: sympy.Lt, OpCode.LE: sympy.Le, OpCode.GT: sympy.Gt, OpCode.GE: sympy.Ge,
                      OpCode.EQ: sympy.Eq, OpCode.NE: sympy.Ne}


def _folded_comparison(node: Op) -> Op | None:
    """A comparison of two index values that mapping made numbers (the index of a size-1
    dimension becomes 0: a slice's backward over it compares ``0 < 1``) as a constant, so no
    kernel compares two constants (Triton's interpreter cannot mask a load with that)."""
    a, b = node.src
    if a.op is OpCode.INDEX and b.op is OpCode.INDEX and sympy.sympify(a.arg).is_Integer \
            and sympy.sympify(b.arg).is_Integer:
        return Op.const(bool(_INDEX_COMPARISONS[node.op](a.arg, b.arg)), torch.bool)
    return None


def subs_index(op: Op, mapping: dict) -> Op:
    """``op`` with ``mapping`` (symbol -> expr) applied to every index expression;
    comparisons of two index values that become numbers fold to constants."""
    def direct_load(load: Op) -> Op | None:  # an indirect index / mask is an operand, already remapped
        buffer, index = load.arg
        return None if index is None else load.replace(arg=(buffer, index.xreplace(mapping)))
    return rewrite(op, {OpCode.LOAD: direct_load,
                        OpCode.INDEX: lambda node: node.replace(arg=node.arg.xreplace(mapping)),
                        **dict.fromkeys(_INDEX_COMPARISONS, _folded_comparison)})


def _as_epilogue(job: Job, n_outer: int) -> Job:
    """A pointwise job over ``(outer..., reduced...)`` re-indexed by ``(x..., r...)``."""
    mapping = {xvar(n_outer + i): rvar(i) for i in range(len(job.outer) - n_outer)}
    stores = [Store(s.buffer, sympy.sympify(s.index).xreplace(mapping), subs_index(s.value, mapping))
              for s in job.stores]
    return Job(job.outer, job.reduced, job.dims_key, job.reductions, stores, job.origins, job.roots)


def _rename_acc(op: Op, old: str, new: str) -> Op:
    """``op`` reading reduction ``new`` wherever it read ``old``."""
    return rewrite(op, {OpCode.ACC: lambda acc: acc.replace(arg=(new, *acc.arg[1:])) if acc.arg[0] == old else None})


#: How many earlier groups a job may join, the most recent first (each further one
#: costs a hoisting check per job).
FUSION_WINDOW = 4


def fuse(items: list, argument_limit: int | None = None) -> list:
    """Program items (lines and Jobs, in order) -> lines and Groups, in order.

    A job joins one of the last ``FUSION_WINDOW`` groups (the most recent that works)
    when the group accepts it and the job can move up over everything emitted since
    that group (``can_hoist``: lines and later groups), after lifting the
    metadata-only lines it needs above the group (``_liftable``); otherwise it starts
    a new group where it stands.  A barrier line closes every open group.

    A pointwise job also tries, past the window, the pointwise groups over its ranges that
    use a buffer it uses (``BufferUsers``), the most recent first, when only pointwise groups
    and metadata lines stand between (at most ``RANGES_LOOKBACK_ITEMS`` items): ``_foreach_*``
    ops and optimizer steps run op by op over every tensor, so the second op on a tensor comes
    one group per tensor after the first, however many tensors share its sizes; and the
    ``copy_`` back into each mutated input, which functionalization puts at the end of the
    graph, joins the kernel that computes it.

    ``argument_limit`` (the emitter's ``combo_kernels.max_arguments``): a job that uses no
    buffer of a group joins it only while the kernel keeps at most that many arguments
    (``argument_count``); more independent work is a combo member of its own, launched
    through the target's fast binding, in programs of its own on a GPU.
    """
    roots = view_roots(items)
    # values a collective's wait makes ready (and views of them): see _holds_until_wait
    waited = {b.name for item in items if not isinstance(item, Job) and getattr(item, "waits_collective", False)
              for b in item.defines()}
    out: list = []
    open_groups: list[Group] = []
    users = BufferUsers()  # the pointwise groups since the barrier, by buffer
    barrier: str | None = None  # the line that closed the open groups
    for item in items:
        whole = item  # a template group's epilogue runs over the template's sizes, 1s included
        if isinstance(item, Job) and item.template is None:
            item = _squeezed(item)
        if not isinstance(item, Job):
            out.append(item)
            if is_barrier(item):
                open_groups, users, barrier = [], BufferUsers(), item.label
            continue
        reason = f"after {barrier}" if barrier else "first kernel"
        reads, writes, _ = job_names(item)
        used = reads | writes
        related = [g for g in reversed(open_groups) if used & _footprint(g)[1]]
        unrelated = [g for g in reversed(open_groups) if not used & _footprint(g)[1]]
        refusals: dict[int, str] = {}
        # a kernel using the job's buffers first (the window's, then a far one: the same
        # tensor's earlier op), then independent work over the same ranges (horizontal)
        group = _join_open(related, item, whole, out, roots, waited, argument_limit, refusals) \
            or _join_far(item, users, open_groups, out, roots, waited) \
            or _join_open(unrelated, item, whole, out, roots, waited, argument_limit, refusals)
        if group is None:
            if open_groups:
                last = open_groups[-1]
                reason = f"not fused into the kernel of {', '.join(last.roots)}: {refusals[id(last)]}"
            group = Group(item.outer, item.reduced, item.dims_key, started_because=reason, template=item.template)
            group.add(item)
            out.append(group)
            open_groups = [*open_groups, group][-FUSION_WINDOW:]
        if _pointwise(group):
            users.add(group, item)
    return out


#: past the window, a pointwise job tries the groups over its ranges that use its buffers
#: emitted at most this many items before it (each costs a hoisting check over those items,
#: their footprints kept: ``Group.footprint``): an optimizer step puts about ten items a tensor
#: between a tensor's first op and the copy back into its last moment (400 tensors)
RANGES_LOOKBACK_ITEMS = 4096


def argument_count(items: list, kept: dict[int, set[str]] | None = None) -> int:
    """How many buffer and size arguments one kernel of ``items`` (jobs or groups) takes, at
    most; with ``kept`` (by id of each group: the buffers of its stores that the kernel keeps,
    those read elsewhere and the program's inputs), exactly that many (a store nobody reads
    later is dropped when the kernel is made: an optimizer's intermediate moments)."""
    names: set[str] = set()
    for item in items:
        reads, writes, symbols = job_names(item)
        if kept is not None:
            writes &= kept[id(item)]
        names |= reads | writes | {f"size:{s}" for s in symbols if not is_loop_var(sympy.Symbol(s))}
    return len(names)


def _too_wide(group: Group, job: Job, limit: int | None) -> str | None:
    """Why ``job``, sharing no buffer with ``group``, may not join it: the kernel would take
    more than ``limit`` arguments (None: it may)."""
    if limit is None or group.template is not None:
        return None
    reads, writes, _ = job_names(job)
    if (reads | writes) & _footprint(group)[1] or argument_count([group, job]) <= limit:
        return None
    return f"independent work past {limit} arguments (a combo member of its own)"


def _pointwise(item) -> bool:
    return not item.reductions and not item.reduced and item.template is None and not indexed(item)


def inert(line) -> bool:
    """A line that only describes storage (a view) or nothing at all (a comment)."""
    return line.metadata_only or not (line.reads() or line.writes() or line.defines())


class BufferUsers:
    """The pointwise groups ``fuse`` made since the last barrier, by each buffer they use
    (load or store), so that a job finds the earlier kernels of its own tensors however many
    groups of other tensors stand between: an optimizer's ``foreach`` step runs each op over
    every tensor, so a tensor's next op comes one group per tensor after its last::

        exp_avg0 = lerp(exp_avg0, g0)    # group A  (uses exp_avg0, g0)
        exp_avg1 = lerp(exp_avg1, g1)    # group B
        v0 = v0 * b2 + g0 * g0 * (1-b2)  # users.of(job) -> [A]: it shares g0 with A
    """

    def __init__(self):
        self._groups: dict[str, list[Group]] = {}
        self._serial: dict[int, int] = {}  # id(group) -> the order it was made in (its place in ``out``)

    def add(self, group: Group, job: Job) -> None:
        """``job`` is now part of ``group``: the group uses the job's buffers."""
        self._serial.setdefault(id(group), len(self._serial))
        reads, writes, _ = job_names(job)
        for name in sorted(reads | writes):
            users = self._groups.setdefault(name, [])
            if not any(g is group for g in users):
                users.append(group)

    def of(self, job: Job) -> list[Group]:
        """The groups using a buffer ``job`` uses, the most recent first."""
        reads, writes, _ = job_names(job)
        found: dict[int, Group] = {}
        for name in sorted(reads | writes):
            for group in self._groups.get(name, ()):
                found[id(group)] = group
        return sorted(found.values(), key=lambda g: self._serial[id(g)], reverse=True)


def _join_open(groups: list, job: Job, whole: Job, out: list, roots: dict, waited: set, argument_limit,
               refusals: dict) -> Group | None:
    """Join ``job`` to the first of ``groups`` (open groups, the most recent first) that accepts
    it; the group, or None with each one's refusal in ``refusals`` (by id)."""
    for group in groups:
        refused = _holds_until_wait(group, job, roots, waited) or _too_wide(group, job, argument_limit) or \
            _join(group, whole if group.template is not None else job, out, roots)
        if refused is None:
            return group
        refusals[id(group)] = refused
    return None


def _join_far(job: Job, users: BufferUsers, open_groups: list, out: list, roots: dict, waited: set) -> Group | None:
    """Join ``job`` (pointwise) to a pointwise group over its ranges outside the window that
    uses a buffer it uses (the same tensor's earlier op: ``users``), the most recent that
    accepts it, when only pointwise groups, metadata-only lines and comments lie between it
    and the job (at most ``RANGES_LOOKBACK_ITEMS`` items); the group it joined, or None."""
    if not _pointwise(job):
        return None
    for group in users.of(job):
        if any(group is g for g in open_groups) or group.outer != job.outer or not _pointwise(group):
            continue
        at = next((i for i in range(len(out) - 1, max(len(out) - RANGES_LOOKBACK_ITEMS, 0) - 1, -1)
                   if out[i] is group), None)
        if at is None:
            return None
        if not all(_pointwise(x) if isinstance(x, Group) else inert(x) for x in out[at + 1:]):
            return None
        if (_holds_until_wait(group, job, roots, waited) or _join(group, job, out, roots)) is None:
            return group
    return None


def view_roots(items: list) -> dict[str, str]:
    """For each buffer a line of ``items`` defines as a view, the buffer whose storage it
    views (through views of views)."""
    roots: dict[str, str] = {}
    for item in items:
        base = None if isinstance(item, (Job, Group)) else item.view_base
        if base is not None:
            for buf in item.defines():
                roots[buf.name] = roots.get(base.name, base.name)
    return roots


def _squeezed(job: Job) -> Job:
    """A pointwise job over sizes with some 1s, over the other sizes only (a per-row
    value stored as ``(rows, 1)`` iterates like the reduction over ``rows`` it follows)."""
    keep = [i for i, n in enumerate(job.outer) if sympy.sympify(n) != 1]
    if job.reductions or job.reduced or len(keep) == len(job.outer) or indexed(job):
        return job
    mapping = {xvar(i): (xvar(keep.index(i)) if i in keep else sympy.Integer(0)) for i in range(len(job.outer))}
    stores = [Store(s.buffer, sympy.expand(sympy.sympify(s.index).xreplace(mapping)), subs_index(s.value, mapping))
              for s in job.stores]
    return dataclasses.replace(job, outer=tuple(job.outer[i] for i in keep), stores=stores)


def _holds_until_wait(group: Group, job: Job, roots: dict, waited: set[str]) -> str | None:
    """Why ``job`` may not join ``group`` for the sake of overlap, or None.

    When exactly one of them reads a value a collective's wait makes ready and the job
    does not read what the group stores, fusing them would hold the other's independent
    work until the wait (the kernel runs after it), where ``core/overlap.py`` would
    otherwise run it while the communication is under way."""
    if not waited:
        return None
    root = lambda n: roots.get(n, n)  # noqa: E731
    job_reads, _, _ = job_names(job)
    _, group_reads, group_writes, _ = _footprint(group)
    if job_reads & group_writes:
        return None
    job_waits = any(root(b) in waited for b in job_reads)
    group_waits = any(root(b) in waited for b in group_reads)
    if job_waits != group_waits:
        return ("it reads a value a collective's wait makes ready and the kernel does not" if job_waits
                else "the kernel reads a value a collective's wait makes ready and it does not")
    return None


def _join(group: Group, job: Job, out: list, roots: dict) -> str | None:
    """Add ``job`` to ``group`` (an item of ``out``) if it accepts it and the job can
    move up to it, lifting the metadata-only lines that make the move possible: None;
    otherwise why not (the fusion log)."""
    if group.template is not None and tuple(job.outer) != tuple(group.outer):
        job = _reshaped(job, tuple(group.outer)) or job  # a reshape of the template's output (3-D linear)
    refused = group.refusal(job, roots)
    if refused is not None:
        return refused
    at = len(out) - 1 - next(i for i, x in enumerate(reversed(out)) if x is group)  # an open group is near the end
    since = out[at + 1:]
    if not can_hoist(job, since, roots):
        lifted = _liftable(job, since, group)
        rest = [x for x in since if not any(x is ln for ln in lifted)]
        if not lifted or not can_hoist(job, rest, roots):
            return "it cannot move up across " + ", ".join(_label(x) for x in since)
        out[at:] = [*lifted, group, *rest]
    group.add(job)
    return None


def _reshaped(job: Job, outer: tuple) -> Job | None:
    """A pointwise ``job`` over sizes that are a row-major reshape of ``outer`` with the same
    last size (a linear layer's ``(B, T, N)`` epilogue of its ``(B*T, N)`` product), iterated
    over ``outer`` instead: its variables through the flat index, its indices simplified
    over ``outer``'s ranges (``3072*(x0//32) + 96*(x0 % 32) + x1`` -> ``96*x0 + x1``).
    None when the sizes are not such a reshape."""
    if job.reductions or job.reduced or not job.outer or not outer or any(st.indexed for st in job.stores):
        return None  # an indexed store's offset is an int64 value computed in the kernel, no expression
    sizes = [sympy.sympify(n) for n in job.outer]
    target = [sympy.sympify(n) for n in outer]
    if sizes[-1] != target[-1] or sympy.expand(sympy.Mul(*sizes) - sympy.Mul(*target)) != 0:
        return None
    flat = sympy.Integer(0)
    for i, n in enumerate(target):
        flat = flat * n + xvar(i)
    mapping, div = {}, sympy.Integer(1)
    for i in range(len(sizes) - 1, -1, -1):
        mapping[xvar(i)] = ModularIndexing(flat, div, sizes[i]) if i else FloorDiv(flat, div)
        div = div * sizes[i]
    # each job var in terms of the new ones, at once (xreplace is simultaneous)
    ranges = {xvar(i): n for i, n in enumerate(target)}
    stores = [Store(st.buffer, sympy.sympify(st.index).xreplace(mapping), subs_index(st.value, mapping))
              for st in job.stores]
    _, stores = _simplified_indices((), stores, ranges)
    return dataclasses.replace(job, outer=tuple(outer), stores=list(stores))


def _label(item) -> str:
    return f"the kernel of {', '.join(item.roots)}" if isinstance(item, Group) else item.label


def _footprint(item) -> tuple[set, set, set, set]:
    """``(buffers defined, buffers used, buffers written, other names defined)`` of a
    line or of a group (which reads what it loads and writes what it stores)."""
    if isinstance(item, Group):
        used, written = item.footprint()
        return frozenset(), used, written, frozenset()
    return ({b.name for b in item.defines()}, {b.name for b in item.reads()}, {b.name for b in item.writes()},
            {*item.defines_values(), *(s.name for s in item.defines_symbols())})


def is_barrier(line) -> bool:
    return line.fusion_barrier


def _names_defined(line) -> set[str]:
    return {*(b.name for b in line.defines()), *line.defines_values(), *(s.name for s in line.defines_symbols())}


def _names_used(line) -> set[str]:
    return {*(b.name for b in line.reads()),
            *(s.name for e in line.size_exprs() for s in sympy.sympify(e).free_symbols)}


def job_names(job: "Job | Group") -> tuple[set[str], set[str], set[str]]:
    """``(buffers read, buffers written, symbol names used)`` by ``job`` (or a group)."""
    ops = [r.value for r in job.reductions] + [s.value for s in job.stores]
    reads = {b for op in ops for b, _ in loads_of(op)} | template_reads(job) | store_reads(job.stores)
    writes = {s.buffer for s in job.stores}
    exprs = [*job.outer, *job.reduced, *(e for s in job.stores for e in s.index_exprs())]
    exprs += [e for op in ops for e in direct_indices(op)]  # direct loads, index values
    return reads, writes, {s.name for e in exprs for s in sympy.sympify(e).free_symbols}


def _liftable(job: Job, items: list, group: Group) -> list:
    """The lines among ``items`` (emitted after ``group``) that define what ``job``
    reads, with the lines they need in turn, when every one of them is
    ``metadata_only`` and none uses a buffer a group among them (or ``group``)
    stores: moved above the group, they let ``job`` join it (an epilogue reading a
    view of a saved activation that the backward graph takes after the reduction).
    Empty when that is not so."""
    reads, writes, syms = job_names(job)
    wanted = reads | writes | syms
    stored = {s.buffer for g in (group, *items) if isinstance(g, Group) for s in g.stores}
    chosen: list = []
    for line in reversed(items):  # a definer comes before its users
        if isinstance(line, Group):
            continue
        if _names_defined(line) & wanted:
            if not line.metadata_only or _names_used(line) & stored:
                return []
            chosen.append(line)
            wanted |= _names_used(line)
    return list(reversed(chosen))


def can_hoist(job: "Job | Group", items: list, roots: dict) -> bool:
    """May ``job`` (or a pointwise group: ``core.combo``) run before ``items`` (lines and
    groups; that is, at the place of the group before them)?"""
    if not items:
        return True
    reads, writes, syms = job_names(job)
    root = lambda n: roots.get(n, n)  # noqa: E731
    read_roots = {root(b) for b in reads}
    write_roots = {root(b) for b in writes}
    for item in items:
        defined, used, written, names = _footprint(item)
        if defined & (reads | writes):
            return False
        if {root(b) for b in used} & write_roots:
            return False
        if {root(b) for b in written} & (read_roots | write_roots):
            return False
        if names & syms:
            return False
    return True


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
            for name in sorted(store_reads(item.stores)):
                readers.setdefault(name, set()).add(id(item))
            for name in sorted(template_reads(item)):
                readers.setdefault(name, set()).add(id(item))
        else:
            for buf in buffers_in_lines(item):
                readers.setdefault(buf.name, set()).add(-1)
    for item in groups_and_lines:
        if isinstance(item, Group):
            needed[id(item)] = {s.buffer for s in item.stores
                                if readers.get(s.buffer, set()) - {id(item)}}
    return needed


def _simplified_indices(reductions, stores, ranges: dict):
    """The reductions and stores with every index expression (stores, direct loads,
    ``index`` values) simplified over the loop ranges (``symbolic.simplify_index``): a
    reshape and its inverse leave ``768*x0 + x1``, not divisions and modulos that stop
    vectorizing."""
    def direct_load(load: Op) -> Op | None:  # an indirect index is an operand, rewritten already
        buffer, index = load.arg
        return None if index is None else load.replace(arg=(buffer, simplify_index(index, ranges)))

    rules = {OpCode.LOAD: direct_load,
             OpCode.INDEX: lambda node: node.replace(arg=simplify_index(node.arg, ranges))}
    memo: dict[Op, Op] = {}
    reductions = tuple(dataclasses.replace(r, value=rewrite(r.value, rules, memo)) for r in reductions)
    stores = tuple(dataclasses.replace(s, index=rewrite(s.index, rules, memo) if s.indexed
                                       else simplify_index(s.index, ranges), value=rewrite(s.value, rules, memo))
                   for s in stores)
    return reductions, stores


def read_reductions(reductions, stores) -> tuple[Reduction, ...]:
    """The ``reductions`` that ``stores`` read, directly or through a later reduction, in
    order: a reduction whose every store was dropped is not computed (``x.max(0).values``
    lowers to a max and an argmax, and only the max is stored)."""
    def accs(op: Op) -> set[str]:
        return {acc_key(n)[0] for n in walk(op) if n.op == OpCode.ACC}
    needed: set[str] = set()
    for s in stores:
        for root in s.roots():
            needed |= accs(root)
    for r in reversed(reductions):  # a reduction reads only earlier ones
        if r.name in needed:
            needed |= accs(r.value)
    return tuple(r for r in reductions if r.name in needed)


def to_kernel(group: Group, name: str, keep: set[str], buffers: dict, extra_keep: set[str]) -> ScheduledKernel:
    """The ``ScheduledKernel`` of a group, storing only buffers in ``keep | extra_keep`` and
    computing only the reductions those stores read."""
    stores = tuple(s for s in group.stores if s.buffer in keep or s.buffer in extra_keep)
    ranges = {**{xvar(i): n for i, n in enumerate(group.outer)},
              **{rvar(i): n for i, n in enumerate(group.reduced)}}
    reductions, stores = _simplified_indices(read_reductions(group.reductions, stores), stores, ranges)
    ops = [r.value for r in reductions] + [op for s in stores for op in s.roots()]
    input_names: list[str] = [b.name for b in group.template.operands] if group.template is not None else []
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
    for e in (*group.outer, *group.reduced, *(e for s in stores for e in s.index_exprs())):
        symbols |= sympy.sympify(e).free_symbols
    for op in ops:
        for expr in direct_indices(op):  # an indirect index's own nodes are walked too
            symbols |= expr.free_symbols
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
        reductions=reductions, stores=stores, origins=tuple(group.origins), template=group.template)

