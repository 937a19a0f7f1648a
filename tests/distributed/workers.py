"""Worker processes of the distributed tests: ``python workers.py CASE OUT_DIR [BACKEND] [WORLD]``.

Spawns ``WORLD`` (default 2) processes (``torch.multiprocessing.spawn``) that join one
process group (``gloo`` on CPU, ``nccl`` on CUDA; a file store in ``OUT_DIR``, so no
port is needed), run ``CASE`` and each save what the test checks to
``OUT_DIR/rank<r>.pt`` (``torch.save`` of a dict).  The test (``test_distributed.py``,
or ``tests/cuda/test_distributed_cuda.py``) reads them in its own process: a failure in
a worker is its exit status and traceback.

Cases:
* ``collectives``: one program per ``_c10d_functional`` collective (all_reduce,
  all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, broadcast), lowered
  with ``fxwrap.lower`` (``fullgraph=True``), its results and eager's, and its lines'
  structure (where the collective, its wait and the kernels are).
* ``ddp``: a small transformer under ``DistributedDataParallel`` (small buckets: dynamo's
  DDP optimizer splits the graph), compiled with ``backend="fxwrap"``, against the same
  model run eagerly: losses and gradients of a few SGD steps.
* ``fsdp``: the same with FSDP2 (``fully_shard`` per block and on the root).
* ``ddp_python_reducer``: DDP with the backward compiled too (compiled autograd,
  ``optimize_ddp="python_reducer"``): the gradient all-reduces are collectives inside
  fxwrap's backward program.
* ``all``: every case above in turn, in one spawn and one process group (what the tests run);
  ``collectives,ddp``: those cases so.  ``noop`` and ``crash`` (the last rank dies of
  SIGSEGV) and ``hang`` (the last rank never joins the first collective) test the runner.

Nothing waits forever (a hung NCCL collective must not hold the GPU machine): every wait of
the process group (collectives, barriers, the file store's rendezvous) times out after
``FXWRAP_DIST_TIMEOUT`` seconds (default 180), and each rank has a watchdog
(``faulthandler.dump_traceback_later``), armed from its start and again for each case, that
prints every thread's stack and ends the rank after ``FXWRAP_DIST_WATCHDOG`` seconds (default:
that time and a minute more), wherever it is stuck (CUDA synchronize, a destroy of the group whose peer is gone).  The spawn then ends
the other ranks; ``test_distributed.run_case`` bounds the whole run and ends its process group.
"""
from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """``blocks`` pre-norm blocks (MultiheadAttention, GELU MLP) and a linear head."""

    def __init__(self, width: int = 32, heads: int = 4, blocks: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(blocks))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


TIMEOUT = float(os.environ.get("FXWRAP_DIST_TIMEOUT", "180"))  # seconds a wait of the group may take
# seconds one case (or the start, or the end) of a rank may take
WATCHDOG = float(os.environ.get("FXWRAP_DIST_WATCHDOG", TIMEOUT + 60))


def _arm_watchdog() -> None:
    """End this rank with every thread's stack if it is still here after ``WATCHDOG`` seconds."""
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)


def _device(backend: str, rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _settle(backend: str, rank: int) -> None:
    """Both ranks done with everything queued: this rank's GPU work finished, then a barrier
    on this rank's own GPU (nccl's barrier otherwise guesses the device)."""
    if backend == "nccl":
        torch.cuda.synchronize(rank)
        dist.barrier(device_ids=[rank])
    else:
        dist.barrier()


# -- functional collectives ------------------------------------------------------------
def _collective_programs(world: int):
    c10d = torch.ops._c10d_functional
    group = dist.group.WORLD.group_name

    def independent(w):  # work that reads nothing of the collective: a reduction kernel
        return (w.exp() * 3).sum(-1)

    def all_reduce(x, w):
        y = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", group))
        return y + 1, independent(w)

    def all_gather_into_tensor(x, w):
        y = c10d.wait_tensor(c10d.all_gather_into_tensor(x * 2, world, group))
        return y + 1, independent(w)

    def reduce_scatter_tensor(x, w):
        y = c10d.wait_tensor(c10d.reduce_scatter_tensor(x * 2, "sum", world, group))
        return y + 1, independent(w)

    def all_to_all_single(x, w):
        splits = [x.shape[0] // world] * world
        y = c10d.wait_tensor(c10d.all_to_all_single(x * 2, splits, splits, group))
        return y + 1, independent(w)

    def broadcast(x, w):
        y = c10d.wait_tensor(c10d.broadcast(x * 2, 0, group))
        return y + 1, independent(w)

    def all_reduce_beside_pointwise(x, w):  # independent work of the post-wait kernel's shape
        y = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", group))
        return y + 1, torch.relu(x) * 3

    def all_reduce_coalesced(x, w):  # one collective, a list of results, a wait for each
        a, b = c10d.all_reduce_coalesced([x * 2, w + 1], "sum", group)
        return c10d.wait_tensor(a) + 1, c10d.wait_tensor(b) * 3

    return {f.__name__: f for f in (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
                                    all_to_all_single, broadcast, all_reduce_beside_pointwise,
                                    all_reduce_coalesced)}


def _structure(program) -> dict:
    """Where the collective, its wait and the kernels are in the program's lines, and the
    memory plan's lines between them (what the test checks)."""
    lines = program.lines
    kinds = []
    for line in lines:
        if getattr(line, "issues_collective", False):
            kinds.append(("collective", str(line.op), [b.name for b in line.reads()],
                          [b.name for b in line.defines()]))
        elif getattr(line, "waits_collective", False):
            kinds.append(("wait", line.tensor.name, [b.name for b in line.in_flight], line.buf.name))
        elif type(line).__name__ == "CallKernel":
            kinds.append(("kernel", line.kernel.name, [b.name for b in line.reads()]))
        elif type(line).__name__ in ("Free", "Reuse"):
            kinds.append((type(line).__name__.lower(), *(b.name for b in line.reads())))
        else:
            kinds.append((type(line).__name__,))
    fx_targets = [str(n.target) for n in program.graph_module.graph.nodes if n.op == "call_function"]
    return {"lines": kinds, "code": program.code(), "fx_targets": fx_targets}


def case_collectives(rank: int, world: int, backend: str) -> dict:
    import fxwrap
    device = _device(backend, rank)
    torch.manual_seed(1234 + rank)
    out = {}
    for name, fn in _collective_programs(world).items():
        x = torch.randn(4 * world, 6, device=device) + rank
        w = torch.randn(5, 7, device=device)
        target = "cpu" if device.type == "cpu" else None
        program = fxwrap.lower(fn, x, w, target=target)
        got = program.run(x, w)
        x2, w2 = torch.randn_like(x) - rank, torch.randn_like(w)  # a second call, fresh inputs
        got2 = program.run(x2, w2)
        expected, expected2 = fn(x, w), fn(x2, w2)
        out[name] = {"got": [t.cpu() for t in (*got, *got2)],
                     "expected": [t.cpu() for t in (*expected, *expected2)], **_structure(program)}
    # check_nan: a check after the wait, none of the in-flight buffer before it
    fn = _collective_programs(world)["all_reduce"]
    checked = fxwrap.lower(fn, x, w, target=target, options={"check_nan": True})
    out["all_reduce_check_nan"] = {"got": [t.cpu() for t in checked.run(x, w)],
                                   "expected": [t.cpu() for t in fn(x, w)], **_structure(checked)}
    return out


# -- training ----------------------------------------------------------------------------
def _train(model, steps: int, batches, lr: float = 0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, grads = [], []
    for x, y in batches[:steps]:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.detach().cpu())
        grads.append({n.replace("_orig_mod.", ""): _full(p.grad).cpu() for n, p in model.named_parameters()})
        opt.step()
    return losses, grads


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def case_training(rank: int, world: int, backend: str, kind: str, width: int = 32, steps: int = 3,
                  blocks: int = 2) -> dict:
    import contextlib
    import copy
    import fxwrap
    device = _device(backend, rank)
    if kind == "ddp_python_reducer":
        torch._dynamo.config.optimize_ddp = "python_reducer"
    torch.manual_seed(0)
    base = Transformer(width, blocks=blocks).to(device)
    torch.manual_seed(100 + rank)  # each rank its own data
    batches = [(torch.randn(2, 8, width, device=device), torch.randn(2, 8, width, device=device))
               for _ in range(steps)]
    programs = []
    backend_fn = fxwrap.Backend(options={"on_program": programs.append,
                                         "target": "cpu" if device.type == "cpu" else None})
    models = {}
    for which in ("eager", "fxwrap"):
        model = copy.deepcopy(base)
        if kind in ("ddp", "ddp_python_reducer"):
            from torch.nn.parallel import DistributedDataParallel as DDP
            # dynamo's DDP optimizer splits the graph at DDP's buckets; its first bucket is
            # dist._DEFAULT_FIRST_BUCKET_BYTES (1 MB), which must not exceed the others:
            # small buckets for a small model, so that it splits
            dist._DEFAULT_FIRST_BUCKET_BYTES = 8192
            model = DDP(model, device_ids=[rank] if device.type == "cuda" else None, bucket_cap_mb=0.01)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            # the mesh on the test's device (fully_shard's default is CUDA wherever there is
            # one, which a gloo test on CPU tensors must not use)
            mesh = init_device_mesh(device.type, (world,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        if which == "fxwrap":
            model = torch.compile(model, backend=backend_fn)
        models[which] = model
    out = {}
    for which, model in models.items():
        context = contextlib.nullcontext()
        if kind == "ddp_python_reducer" and which == "fxwrap":
            # the backward compiled too (compiled autograd, a private API of torch 2.11-2.13),
            # with DDP's gradient all-reduces inside it as functional collectives
            context = torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend_fn))
        with context:
            losses, grads = _train(model, steps, batches)
        out[which] = {"losses": losses, "grads": grads}
    out["program_kinds"] = [p.kind for p in programs]
    out["ddp_split"] = torch._dynamo.config.optimize_ddp
    out["structures"] = [_structure(p) for p in programs if "collective" in p.code()]
    return out


ALL = ("collectives", "ddp", "fsdp", "ddp_python_reducer")  # python_reducer last: it sets optimize_ddp


def case_all(rank: int, world: int, backend: str, names=ALL) -> dict:
    """Every case of ``names`` in turn, in one process group: one spawn of the processes
    (each spawn imports torch and fxwrap again and joins a new group: most of the folder's
    time).  A case that raises records its traceback (``{"error": ...}``) and the next
    runs; dynamo and its DDP setting are reset between cases (restored below)."""
    out = {}
    for name in names:
        print(f"workers.py rank {rank}: case {name} ({backend})", file=sys.stderr, flush=True)
        optimize_ddp = torch._dynamo.config.optimize_ddp
        _arm_watchdog()  # each case its own WATCHDOG seconds
        try:
            out[name] = CASES[name](rank, world, backend)
        except Exception:
            traceback.print_exc()
            out[name] = {"error": traceback.format_exc()}
        finally:
            torch._dynamo.config.optimize_ddp = optimize_ddp
            _settle(backend, rank)  # no collective of this case in flight while dynamo resets
            torch._dynamo.reset()
    return out


def case_noop(rank: int, world: int, backend: str) -> dict:
    """Nothing but the group (the runner's own tests)."""
    return {"rank": rank}


def case_hang(rank: int, world: int, backend: str) -> dict:
    """The last rank never joins the first collective (the runner's own tests: the others'
    wait times out, the last rank's watchdog ends it, and the run fails instead of hanging)."""
    if rank == world - 1:
        import time
        time.sleep(10 * WATCHDOG)
    dist.barrier()
    return {"rank": rank}


def case_crash(rank: int, world: int, backend: str) -> dict:
    """The last rank dies of SIGSEGV, as a crashing NCCL or kernel would (the runner's own
    tests: a crash is the case's failure, with the stack faulthandler prints)."""
    if rank == world - 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return {"rank": rank}


CASES = {
    "all": case_all,
    "noop": case_noop,
    "crash": case_crash,
    "hang": case_hang,
    "collectives": case_collectives,
    "ddp": lambda rank, world, backend: case_training(rank, world, backend, "ddp"),
    "fsdp": lambda rank, world, backend: case_training(rank, world, backend, "fsdp"),
    "ddp_python_reducer": lambda rank, world, backend: case_training(rank, world, backend, "ddp_python_reducer",
                                                                     width=16, blocks=1),
}


def _worker(rank: int, world: int, case: str, out_dir: str, backend: str) -> None:
    faulthandler.enable(all_threads=True)  # a crash (SIGSEGV) prints every thread's Python stack
    _arm_watchdog()
    options = {"timeout": datetime.timedelta(seconds=TIMEOUT)}
    if backend == "nccl":
        # before the group exists: this rank's GPU is its current device, and the group is
        # bound to it (device_id: NCCL's communicator is made now, on that GPU, not at the
        # first collective on whatever device is current then)
        if torch.cuda.device_count() < world:
            raise RuntimeError(f"nccl with {world} ranks needs {world} GPUs, {torch.cuda.device_count()} visible")
        torch.cuda.set_device(rank)
        options["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, init_method=f"file://{os.path.join(out_dir, 'store')}",
                            rank=rank, world_size=world, **options)
    try:
        if "," in case:  # several cases in this one spawn: "collectives,ddp"
            result = case_all(rank, world, backend, case.split(","))
        else:
            result = CASES[case](rank, world, backend)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        _settle(backend, rank)  # neither rank tears the group down under the other's last collective
    except Exception:
        traceback.print_exc()
        raise
    finally:
        _arm_watchdog()  # the destroy too: nccl's may wait on a peer that is gone
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()


def main(argv: list[str]) -> None:
    case, out_dir = argv[0], argv[1]
    backend = argv[2] if len(argv) > 2 else "gloo"
    world = int(argv[3]) if len(argv) > 3 else 2
    torch.set_num_threads(1)
    # spawn (never fork): a fresh interpreter per rank, with no CUDA state of this process;
    # this process itself touches no GPU
    mp.start_processes(_worker, args=(world, case, out_dir, backend), nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main(sys.argv[1:])
