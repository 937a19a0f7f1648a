"""A program's temporaries in one storage kept across calls (the CPU target's runner).

Every call of a program allocates its temporaries afresh; where they are large, the
allocator hands the freed storage back to the system between calls (glibc trims the heap's
top, and maps big blocks on their own), and the next call faults every page in again and
zeroes it: 4,576 minor faults a call on a torchvision ResNet-18 at one image, about a sixth
of its time (``benchmarks/page_faults.py``).  ``arena_graph_module(gm)`` gives each fixed-size
allocation of ``gm`` that never leaves the call a range of one storage instead, placed by the
lifetimes the graph shows, and keeps that storage for the next call::

    gm                                                    arena_graph_module(gm)
                                                          arena = pool.take()
                                                          arena_0 = getitem(arena, 0)
    buf1 = empty_strided_cpu((512, 512, 3, 3), ...)       buf1 = arena_range(arena_0, (512, 512, 3, 3), ..., 0)
    fxwrap_pointwise_3(arg6, buf1)                        fxwrap_pointwise_3(arg6, buf1)
    buf2 = aten.convolution.default(buf0, buf1, ...)      buf2 = aten.convolution.default(buf0, buf1, ...)
    buf3 = empty_strided_cpu((1, 1000), ...)              buf3 = empty_strided_cpu((1, 1000), ...)
                                                          give_back = pool.give_back(arena)
    return (buf3,)                                        return (buf3,)

What stays a fresh allocation: a storage the program returns (through any view or any call
that may return an alias of it), one whose size depends on a size symbol, and anything an
extern allocates itself.  Whether a call's result may alias its arguments' storage is read
from the ATen schema (a return with alias information, a view op); a call of anything else
(a Python function, a kernel, ``out=`` bindings) counts as an alias of every tensor it takes,
which may keep a range busy longer or a storage out of the arena, never the reverse.

Calls that overlap (two threads, a call from inside a call) each take an arena of their own
from the program's ``ArenaPool``.  The byte storages behind the arenas are shared by every
program of the process (``IDLE_STORAGES``): a call takes the smallest idle storage that holds
its arena, or allocates one (letting the idle ones too small for it go), and gives it back at
the end; at most ``KEEP`` stay idle.  A training step's forward and backward programs, and
the programs of a model with graph breaks, run one after another and so hold one storage of
the largest arena between calls, not one each (a Llama training step on the CPU held both
arenas: peak 1.25x Inductor's).  A call that raises keeps its storage out of the pool.
"""
from __future__ import annotations

import operator
import random
import threading

import torch

from fxwrap.runtime.direct import empty_strided_cpu, storage_offset, view_of

#: byte alignment of each range (a cache line; oneDNN and the C++ kernels vectorize on it)
ALIGN = 64
#: idle storages the process keeps for the calls of its programs that overlap
KEEP = 2


class IdleStorages:
    """The byte storages no call holds, shared by every program's ``ArenaPool``.

    ``take(nbytes)`` returns the smallest idle storage of at least ``nbytes`` bytes (and
    whether it was allocated now); when none is large enough it allocates one and lets the
    smaller idle ones go (the new one serves every call they served).  ``give_back(storage)``
    keeps it for the next call while fewer than ``KEEP`` are idle.  Thread-safe: a storage is
    held by one call at a time."""

    def __init__(self):
        self._idle: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[torch.Tensor, bool]:
        with self._lock:
            fits = [s for s in self._idle if s.numel() >= nbytes]
            if fits:
                storage = min(fits, key=torch.Tensor.numel)
                self._idle.remove(storage)
                return storage, False
            self._idle.clear()
        return torch.empty(nbytes, dtype=torch.uint8), True

    def give_back(self, storage: torch.Tensor) -> None:
        with self._lock:
            if len(self._idle) < KEEP:
                self._idle.append(storage)

    @property
    def nbytes(self) -> int:
        """The bytes the idle storages hold (what stays allocated between calls)."""
        with self._lock:
            return sum(s.numel() for s in self._idle)


#: the storages of every program's arenas in this process
IDLE_STORAGES = IdleStorages()


class ArenaPool:
    """The arenas of one program's temporaries, one per call in flight.

    ``take()`` returns a tuple of views of a storage of at least ``nbytes`` bytes from
    ``storages`` (``IDLE_STORAGES``), one per dtype of ``dtypes`` (``(float32 view,)`` for a
    float32 net); ``give_back(arena)`` returns the storage."""

    def __init__(self, nbytes: int, dtypes: tuple[torch.dtype, ...], storages: IdleStorages | None = None):
        self.nbytes = nbytes
        self.dtypes = dtypes
        self.storages = IDLE_STORAGES if storages is None else storages
        self.made = 0  # storages allocated for this pool's calls (a test reads it)

    def take(self) -> tuple[torch.Tensor, ...]:
        storage, made = self.storages.take(self.nbytes)
        self.made += made
        return tuple(storage.view(dtype) for dtype in self.dtypes)

    def give_back(self, arena: tuple[torch.Tensor, ...]) -> None:
        base = arena[0]
        self.storages.give_back(base if base.dtype == torch.uint8 else base.view(torch.uint8))


def arena_range(arena: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """``buf1 = arena_range(arena_0, size, stride, offset)``: the storage an allocation takes,
    ``offset`` elements into the arena (``view_of``, unchecked: ``plan_arena`` sized it)."""
    return view_of(arena, size, stride, offset)


def _fixed_allocation(node: torch.fx.Node) -> bool:
    """``empty_strided_cpu(size, stride, dtype)`` with integer sizes and strides."""
    return (empty_strided_cpu is not None and node.op == "call_function" and node.target is empty_strided_cpu
            and all(isinstance(v, int) for v in (*node.args[0], *node.args[1])))


#: ATen ops whose schema marks no alias though the result shares its input's storage
_UNMARKED_VIEWS = frozenset({torch.ops.aten._unsafe_view.default})


def _fresh_result(node: torch.fx.Node) -> bool:
    """``node``'s result is never an alias of a tensor it takes: an ATen op whose schema
    returns no alias (``convolution``); not ``out=`` forms, views, ``_unsafe_view``, a
    composite (``type_as`` returns ``self`` itself) or a Python call."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target in _UNMARKED_VIEWS:
        return False
    if target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return False
    return all(ret.alias_info is None for ret in target._schema.returns)


#: views whose offset counts from their storage's start; reads of that offset
_VIEWS = (view_of, torch.as_strided)
_OFFSET_READS = (storage_offset, torch.ops.aten.sym_storage_offset.default)


def _explicit_offset(node: torch.fx.Node):
    """The storage offset a view call gives (``view_of(buf2, size, stride, 16)``: 16), else None."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return None
    return node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")


def _nbytes(node: torch.fx.Node) -> int:
    size, stride, dtype = node.args
    if 0 in size:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(size, stride))) * dtype.itemsize


def plan_arena(gm: torch.fx.GraphModule) -> tuple[dict[torch.fx.Node, int], int, dict[torch.fx.Node, int]]:
    """The byte offset of each allocation of ``gm`` that goes into the arena, the arena's
    size, and the elements each view of such an allocation adds to the storage offset it
    gives (the Wrapper IR counts a view's offset from its buffer's start, which is now
    ``offset`` bytes into the arena), packed by ``_pack`` (module docstring: what stays out; also an allocation
    whose storage offset is read, or that a view at a computed offset takes)."""
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    roots: dict[torch.fx.Node, tuple[torch.fx.Node, ...]] = {}  # node -> the allocations it may alias
    last: dict[torch.fx.Node, int] = {}
    for node in nodes:
        inputs = node.all_input_nodes
        for arg in inputs:
            for root in roots.get(arg, ()):
                last[root] = position[node]
        if _fixed_allocation(node):
            roots[node] = (node,)
            last[node] = position[node]
        elif not _fresh_result(node):
            roots[node] = tuple(dict.fromkeys(r for arg in inputs for r in roots.get(arg, ())))
    escaping = {root for node in nodes if node.op == "output" for arg in node.all_input_nodes
                for root in roots.get(arg, ())}
    view_root: dict[torch.fx.Node, torch.fx.Node] = {}  # views of views of an allocation: same dtype
    for node in nodes:
        if _fixed_allocation(node):
            view_root[node] = node
        elif node.op == "call_function" and node.target in _OFFSET_READS:
            escaping.update(r for arg in node.all_input_nodes for r in roots.get(arg, ()))
        elif node.op == "call_function" and node.target in _VIEWS:
            base, offset = node.args[0], _explicit_offset(node)
            if base in view_root and (offset is None or isinstance(offset, int)):
                view_root[node] = view_root[base]
            elif offset is not None:
                escaping.update(roots.get(base, ()))
    blocks = [(node, position[node], last[node], -(-max(_nbytes(node), 1) // ALIGN) * ALIGN)
              for node in nodes if _fixed_allocation(node) and node not in escaping]
    offsets, size = _pack(blocks)
    shifts = {node: offsets[root] // root.args[2].itemsize for node, root in view_root.items()
              if root in offsets and _explicit_offset(node) is not None}
    return offsets, size, shifts


def _best_gap(taken: list[tuple[int, int]], need: int) -> int:
    """The offset of the smallest gap between the byte ranges ``taken`` ((offset, bytes),
    any order, possibly overlapping each other) that holds ``need`` bytes; past the last
    range when none does."""
    best, best_gap, start = None, None, 0
    for offset, nbytes in sorted(taken):
        gap = offset - start
        if gap >= need and (best_gap is None or gap < best_gap):
            best, best_gap = start, gap
        start = max(start, offset + nbytes)
    return start if best is None else best


def _place_in_order(blocks) -> tuple[dict[torch.fx.Node, int], int]:
    """Offsets of ``blocks`` ((allocation, first use, last use, bytes), in program order):
    each at the best gap among the ranges still in use when it is allocated."""
    offsets: dict[torch.fx.Node, int] = {}
    live: list[tuple[int, int, int]] = []  # (offset, bytes, last use)
    size = 0
    for node, first, last, need in blocks:
        live = [block for block in live if block[2] >= first]
        offsets[node] = offset = _best_gap([(o, n) for o, n, _ in live], need)
        size = max(size, offset + need)
        live.append((offset, need, last))
    return offsets, size


#: orders the packing tries (ties: program order): largest first, longest-lived first,
#: largest bytes x lifetime first
_ORDERS = (lambda b: (-b[3], b[1]), lambda b: (b[1] - b[2], b[1]), lambda b: ((b[1] - b[2]) * b[3], b[1]))
#: the most (blocks x blocks x tries) the shuffled tries may cost (about 0.1 s of Python)
_SHUFFLE_BUDGET = 400_000


def _pack(blocks) -> tuple[dict[torch.fx.Node, int], int]:
    """Offsets of ``blocks`` ((allocation, first use, last use, bytes), in program order) and
    the arena's size: the smallest of best fit in program order and of placements in a few
    orders (``_place``), then, while above the lower bound (the most bytes live at once),
    orders shuffled by a seeded generator within ``_SHUFFLE_BUDGET``.  Deterministic: the
    same blocks give the same offsets.  (Packing intervals into the fewest bytes is
    NP-hard; on a Llama block's 17 allocations program order needs 8.7 MiB, largest first
    8.9, and a shuffled order reaches the bound, 7.0.)"""
    if not blocks:
        return {}, 0
    bound = max(sum(n for _, f, l, n in blocks if f <= t <= l) for _, t, _, _ in blocks)
    best = min((_place_in_order(blocks), *(_place(sorted(blocks, key=key)) for key in _ORDERS)),
               key=operator.itemgetter(1))
    rng = random.Random(len(blocks))
    order = list(blocks)
    for _ in range(min(200, _SHUFFLE_BUDGET // len(blocks) ** 2)):
        if best[1] <= bound:
            break
        rng.shuffle(order)
        best = min(best, _place(order), key=operator.itemgetter(1))
    return best


def _place(order) -> tuple[dict[torch.fx.Node, int], int]:
    """Offsets of blocks placed in ``order``, each at the best gap among the already placed
    blocks whose lifetimes overlap its own, and the bytes they span."""
    offsets: dict[torch.fx.Node, int] = {}
    placed: list[tuple[int, int, int, int]] = []  # (first, last, offset, bytes)
    size = 0
    for node, first, last, need in order:
        overlapping = [(o, n) for f, l, o, n in placed if f <= last and first <= l]
        offsets[node] = offset = _best_gap(overlapping, need)
        size = max(size, offset + need)
        placed.append((first, last, offset, need))
    return offsets, size


def arena_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with its temporaries in an arena of an ``ArenaPool`` (module docstring);
    ``gm`` itself when none qualifies.  The pool is the new module's ``arena_pool``."""
    offsets, nbytes, shifts = plan_arena(gm)
    if not offsets:
        return gm
    dtypes = tuple(dict.fromkeys(node.args[2] for node in offsets))
    pool = ArenaPool(nbytes, dtypes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    views: dict[torch.dtype, torch.fx.Node] = {}
    arena = None
    for node in gm.graph.nodes:
        if node in offsets and arena is None:  # after the input check: a refused call takes none
            arena = graph.create_node("call_function", pool.take, (), name="arena")
            views = {dtype: graph.create_node("call_function", operator.getitem, (arena, i), name=f"arena_{i}")
                     for i, dtype in enumerate(dtypes)}
        if node in offsets:
            size, stride, dtype = node.args
            new = graph.create_node("call_function", arena_range, (views[dtype], size, stride,
                                                              offsets[node] // dtype.itemsize), name=node.name)
            new.meta.update(node.meta)
            env[node] = new
            continue
        if node.op == "output":
            graph.create_node("call_function", pool.give_back, (arena,), name="give_back")
        new = env[node] = graph.node_copy(node, lambda n: env[n])
        if node in shifts:  # the view's offset counted from the arena's start
            if len(new.args) > 3:
                new.args = (*new.args[:3], new.args[3] + shifts[node], *new.args[4:])
            else:
                new.kwargs = {**new.kwargs, "storage_offset": new.kwargs["storage_offset"] + shifts[node]}
    arena_gm = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    arena_gm.meta.update(gm.meta)
    arena_gm.arena_pool = pool
    return arena_gm
