"""Distributed programs on the CPU: 2 processes, the gloo backend (``workers.py`` runs them).

* one program per ``_c10d_functional`` collective, lowered with ``fullgraph=True``: eager's
  results, the collective and its wait as lines with a kernel between them (the overlap
  pass moved the independent reduction there), and what the collective reads alive and
  unreused until its wait;
* DDP (dynamo's DDP graph splitting) and FSDP2 (``fully_shard`` per block) training of a
  small transformer, compiled with ``backend="fxwrap"``, against the same model run
  eagerly: the losses and gradients of 3 SGD steps.

Each test runs on the CPU with gloo, and again on two GPUs with nccl where there are
two (skipped, with the reason, elsewhere): on a 2-GPU machine
``python -m pytest -q -ra tests/distributed``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

WORKERS = Path(__file__).with_name("workers.py")

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available in this torch build",
                allow_module_level=True)


CASES = ("collectives", "ddp", "fsdp", "ddp_python_reducer")  # what workers.py's "all" runs (ALL)
# ranks of the process groups the tests start: FXWRAP_DIST_WORLD=4 runs every case on 4 (nccl: 4 GPUs)
WORLD = int(os.environ.get("FXWRAP_DIST_WORLD", "2"))


def run_case(case: str, out_dir: Path, backend: str = "gloo", world: int = 2, env_extra=None) -> list[dict]:
    """Run ``workers.py CASE`` in a fresh interpreter (``world`` processes); each rank's results.
    The run is bounded: each rank ends itself after ``FXWRAP_DIST_WATCHDOG`` seconds a case
    (``workers.py``); past that for every case, a start and a minute, the whole process group
    of the run (the spawned ranks included) is killed and the failure shows what it printed."""
    # os.environ whole: the machine's NCCL settings (NCCL_NVLS_ENABLE=0 ...) reach the workers
    env = dict(os.environ, FXWRAP_PROGRAM_CACHE="0", OMP_NUM_THREADS="1", **(env_extra or {}))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    out_dir.mkdir(parents=True, exist_ok=True)
    watchdog = float(env.get("FXWRAP_DIST_WATCHDOG", float(env.get("FXWRAP_DIST_TIMEOUT", "180")) + 60))
    limit = watchdog * (case.count(",") + 2) + 60
    process = subprocess.Popen([sys.executable, str(WORKERS), case, str(out_dir), backend, str(world)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its own process group: the ranks die with it
    try:
        stdout, stderr = process.communicate(timeout=limit)
        status = str(process.returncode)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        status = f"killed after {limit:.0f} s, the ranks' watchdogs did not end it"
    assert process.returncode == 0, (f"workers.py {case} {backend} failed (exit status {status}):\n"
                                     f"{stdout[-4000:]}\n{stderr[-8000:]}")
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world)]


def run_cases(out_dir: Path, backend: str, world: int = 2, cases: tuple[str, ...] = CASES) -> dict:
    """``{case: [rank 0's, rank 1's]}`` of every case, in one spawn (``workers.py all``).  Where
    that spawn dies (a worker killed by a signal: no case could record its error), each
    case runs again in a spawn of its own, so that only the tests of a case that fails
    fail, each with its own output."""
    try:
        results = run_case(",".join(cases), out_dir / "all", backend, world)
        return {case: [result[case] for result in results] for case in results[0]}
    except AssertionError as error:
        together = str(error)
    runs = {}
    for case in cases:
        try:
            runs[case] = run_case(case, out_dir / case, backend, world)
        except AssertionError as error:
            runs[case] = [{"error": f"{error}\n\n(the one-spawn run of every case failed too:\n"
                                    f"{together[-3000:]})"}] * world
    return runs


def _backend_params():
    nccl_missing = None
    if torch.cuda.device_count() < WORLD:
        nccl_missing = f"nccl variant: needs {WORLD} CUDA devices, this machine has {torch.cuda.device_count()}"
    elif not dist.is_nccl_available():
        nccl_missing = "nccl variant: this torch build has no nccl"
    return ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(nccl_missing is not None,
                                                                    reason=nccl_missing or ""))]


@pytest.fixture(scope="module", params=_backend_params())
def runs(request, tmp_path_factory) -> dict:
    """Every case of ``workers.py``, run once per backend in one spawn (``case_all``): each
    spawn imports torch and fxwrap in every process and joins a new group, which was most of
    the folder's time when each test spawned its own.  ``{case: [rank 0's, rank 1's]}``."""
    return run_cases(tmp_path_factory.mktemp(f"distributed-{request.param}"), request.param, WORLD)


def _case(runs: dict, case: str) -> list[dict]:
    """One case's per-rank results; a case that raised in a worker fails here with its traceback."""
    results = runs[case]
    for rank, result in enumerate(results):
        assert "error" not in result, f"workers.py {case} failed on rank {rank}:\n{result['error']}"
    return results


@pytest.fixture
def collectives(runs):
    return _case(runs, "collectives")


COLLECTIVES = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"]


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_matches_eager(collectives, name):
    for rank, result in enumerate(collectives):
        case = result[name]
        assert len(case["got"]) == len(case["expected"]) == 4
        for got, expected in zip(case["got"], case["expected"]):
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=f"{name} on rank {rank}")
    if name in ("all_reduce", "broadcast"):  # every rank holds the same value
        torch.testing.assert_close(collectives[0][name]["got"][0], collectives[1][name]["got"][0])


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_and_wait_are_lines_with_a_kernel_between(collectives, name):
    lines = collectives[0][name]["lines"]
    issued = [i for i, line in enumerate(lines) if line[0] == "collective"]
    waited = [i for i, line in enumerate(lines) if line[0] == "wait"]
    assert len(issued) == 1 and len(waited) == 1, collectives[0][name]["code"]
    between = lines[issued[0] + 1:waited[0]]
    assert any(line[0] == "kernel" and "reduction" in line[1] for line in between), \
        f"the independent reduction does not run between the {name} and its wait:\n{collectives[0][name]['code']}"
    # the kernel reading the collective's result runs after the wait
    ready = lines[waited[0]][3]
    readers = [i for i, line in enumerate(lines) if line[0] == "kernel" and ready in line[2]]
    assert readers and min(readers) > waited[0]
    fx = collectives[0][name]["fx_targets"]
    assert "_c10d_functional.wait_tensor.default" in fx
    assert any(f"_c10d_functional.{name}" in t for t in fx), fx


def test_independent_pointwise_work_is_not_fused_past_the_wait(collectives):
    """``relu(x) * 3`` has the shape of the kernel reading the all-reduce's result (``y + 1``),
    but reads nothing of it: it is its own kernel, run before the wait, not fused into the
    kernel after it."""
    case = collectives[0]["all_reduce_beside_pointwise"]
    for result in collectives:
        for got, expected in zip(result["all_reduce_beside_pointwise"]["got"],
                                 result["all_reduce_beside_pointwise"]["expected"]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    lines = case["lines"]
    issued = next(i for i, line in enumerate(lines) if line[0] == "collective")
    waited = next(i for i, line in enumerate(lines) if line[0] == "wait")
    ready = lines[waited][3]
    between = [line for line in lines[issued + 1:waited] if line[0] == "kernel"]
    assert between and all(ready not in line[2] for line in between), case["code"]


def test_coalesced_collective_has_a_wait_per_result(collectives):
    for result in collectives:
        case = result["all_reduce_coalesced"]
        for got, expected in zip(case["got"], case["expected"]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    case = collectives[0]["all_reduce_coalesced"]
    lines = case["lines"]
    issued = [line for line in lines if line[0] == "collective"]
    waits = [line for line in lines if line[0] == "wait"]
    assert len(issued) == 1 and len(waits) == 2, case["code"]
    for wait in waits:  # both inputs stay alive until each wait
        assert set(wait[2]) == set(issued[0][2]), case["code"]


def test_check_nan_checks_a_collective_result_after_its_wait(collectives):
    case = collectives[0]["all_reduce_check_nan"]
    for got, expected in zip(case["got"], case["expected"]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    lines = case["lines"]
    issued = next(i for i, line in enumerate(lines) if line[0] == "collective")
    waited = next(i for i, line in enumerate(lines) if line[0] == "wait")
    assert lines[waited + 1][0] == "CheckFinite", case["code"]  # the ready value, checked
    assert lines[issued + 1][0] != "CheckFinite", case["code"]  # not the buffer in flight


@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_buffers_live_until_the_wait(collectives, name):
    """What the collective reads and writes is neither freed nor handed to another buffer
    before its wait (the communication may use it until then)."""
    lines = collectives[0][name]["lines"]
    at = next(i for i, line in enumerate(lines) if line[0] == "collective")
    wait_at = next(i for i, line in enumerate(lines) if line[0] == "wait")
    in_use = set(lines[at][2]) | set(lines[at][3])
    for line in lines[at + 1:wait_at]:
        if line[0] in ("free", "reuse"):
            assert not set(line[1:]) & in_use, f"{line} before the wait:\n{collectives[0][name]['code']}"
    if name == "all_gather_into_tensor":  # reads its input asynchronously: in flight until the wait
        assert lines[wait_at][2], collectives[0][name]["code"]


def _compare_training(results, kind: str):
    for rank, result in enumerate(results):
        eager, compiled = result["eager"], result["fxwrap"]
        torch.testing.assert_close(torch.stack(compiled["losses"]), torch.stack(eager["losses"]),
                                   rtol=1e-4, atol=1e-5, msg=f"{kind} losses on rank {rank}")
        assert len(compiled["grads"]) == len(eager["grads"])
        for step, (got, expected) in enumerate(zip(compiled["grads"], eager["grads"])):
            assert got.keys() == expected.keys()
            for name in expected:
                torch.testing.assert_close(got[name], expected[name], rtol=1e-3, atol=1e-4,
                                           msg=f"{kind} gradient of {name}, step {step}, rank {rank}")
    # the gradients are averaged over the ranks: equal everywhere
    for name, grad in results[0]["fxwrap"]["grads"][-1].items():
        torch.testing.assert_close(grad, results[1]["fxwrap"]["grads"][-1][name], rtol=1e-4, atol=1e-5)
    assert results[0]["eager"]["losses"][0] != results[1]["eager"]["losses"][0]  # each rank its own data


def test_ddp_training_matches_eager(runs):
    results = _case(runs, "ddp")
    _compare_training(results, "DDP")
    kinds = results[0]["program_kinds"]
    # small buckets: dynamo's DDP optimizer split the model into several graphs, each compiled
    assert results[0]["ddp_split"] and kinds.count("forward") > 1 and kinds.count("backward") > 1, kinds


def test_fsdp2_training_matches_eager(runs):
    results = _case(runs, "fsdp")
    _compare_training(results, "FSDP2")
    assert results[0]["program_kinds"].count("backward") >= 1


def test_ddp_python_reducer_overlaps_gradient_all_reduces_with_backward(runs):
    """Compiled autograd with DDP's Python reducer: the gradient all-reduces are collectives
    in fxwrap's backward program, each issued as soon as its gradient exists, with backward
    kernels between it and its wait."""
    results = _case(runs, "ddp_python_reducer")
    _compare_training(results, "DDP (python_reducer)")
    structures = results[0]["structures"]
    assert structures, f"no program with collectives: {results[0]['program_kinds']}"
    lines = structures[0]["lines"]
    issued = [i for i, line in enumerate(lines) if line[0] == "collective"]
    waited = [i for i, line in enumerate(lines) if line[0] == "wait"]
    assert len(issued) > 1 and len(waited) == len(issued), structures[0]["code"]
    first_wait = min(waited)
    overlapped = [line for line in lines[issued[0] + 1:first_wait] if line[0] == "kernel"]
    assert len(overlapped) > 1, structures[0]["code"]
    assert issued[-1] < first_wait, "every all-reduce is issued before the first wait"


def test_a_crashing_case_fails_alone_with_its_stack(tmp_path):
    """The runner itself (gloo): a worker killed by SIGSEGV in one case (as rank 1 was under
    nccl, which errored all 21 tests) fails that case only, with faulthandler's stack."""
    runs = run_cases(tmp_path, "gloo", cases=("noop", "crash"))
    assert [r["rank"] for r in runs["noop"]] == [0, 1]
    error = runs["crash"][0]["error"]
    assert "workers.py crash gloo failed" in error and "Segmentation fault" in error, error[-3000:]


def test_a_collective_that_waits_too_long_fails_the_case(tmp_path):
    """The runner itself (gloo): the last rank never joins a barrier; the other's wait ends
    after ``FXWRAP_DIST_TIMEOUT`` (the group's timeout, which nccl's collectives have too)
    and the run fails, instead of hanging the machine."""
    with pytest.raises(AssertionError, match=r"workers.py hang gloo failed") as failure:
        run_case("hang", tmp_path, env_extra={"FXWRAP_DIST_TIMEOUT": "5", "FXWRAP_DIST_WATCHDOG": "300"})
    message = str(failure.value)
    assert "Timed out waiting 5000ms" in message and "Timeout (0:" not in message, message[-3000:]


def test_a_rank_stuck_outside_any_collective_is_ended_with_its_stack(tmp_path):
    """The runner itself: a rank stuck where no timeout of the group reaches (a sleep here; a
    CUDA synchronize or a destroy of the group on a GPU machine) is ended by its watchdog
    after ``FXWRAP_DIST_WATCHDOG`` seconds, with every thread's stack."""
    with pytest.raises(AssertionError, match=r"workers.py hang gloo failed") as failure:
        run_case("hang", tmp_path, env_extra={"FXWRAP_DIST_TIMEOUT": "300", "FXWRAP_DIST_WATCHDOG": "8"})
    assert "Timeout (0:00:08)!" in str(failure.value) and "in case_hang" in str(failure.value), \
        str(failure.value)[-3000:]
