"""``program.save`` / ``fxwrap.load`` / ``pickle``: a saved program runs in a fresh process
with eager's numbers, imports no compiler module and compiles nothing."""
from __future__ import annotations

import io
import json
import pickle
import re
import zipfile
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.programs.artifacts import HEADER

from shared_helpers import in_two_processes

from artifact_helpers import child_env, compile_entries, compiler_modules, load_in_fresh_process, run_python


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mlp_block(x, w):
    return torch.relu(x @ w) * 2 + x.sum(1, keepdim=True)


def two_outputs(x, w):
    h = torch.tanh(x @ w)
    return {"h": h, "norm": (h * h).sum(-1).sqrt()}


def _inputs(seed: int = 0):
    g = _gen(seed)
    return torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)


# target -> modules its kernels legitimately import when loaded
TARGETS = {"cpu": (), "triton-interpret": (), "mps_shim": (),
           # the reference target runs the loop IR itself (fxwrap.ir.loops over wrapper_ir.lines'
    # buffers, sympy sizes), never dynamo
           "reference": ("sympy", "fxwrap.core", "fxwrap.ir.lines", "fxwrap.wrapper_ir",
                         "fxwrap.targets.reference.emitter")}


# Triton's interpreter needs TRITON_INTERPRET=1 from triton's first import on: tests/conftest.py
# sets it on machines without a GPU only
INTERPRETER = pytest.mark.skipif(torch.cuda.is_available(), reason="triton-interpret runs where there is no GPU "
                                 "(tests/conftest.py sets TRITON_INTERPRET=1 only there)")


def _targets():
    return [pytest.param(t, marks=INTERPRETER) if t == "triton-interpret" else t for t in sorted(TARGETS)]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("target", _targets())
def test_inference_round_trip_in_a_fresh_process(target, dynamic, tmp_path):
    x, w = _inputs()
    program = fxwrap.lower(mlp_block, x, w, target=target, dynamic=dynamic)
    path = tmp_path / "program.fxwrap"
    program.save(path)
    x2, w2 = _inputs(1)  # other values than the example
    report = load_in_fresh_process(path, {"mode": "run", "args": (x2, w2), "expected": mlp_block(x2, w2)}, tmp_path)
    assert compiler_modules(report["modules"], TARGETS[target]) == []
    assert compile_entries(report) == []
    assert len(report["kernels"]) >= 1
    if target in ("cpu", "mps_shim"):
        assert set(report["kernels"]) == {"SharedObjectLoader"}


def scans_and_split_sums(x, y):
    return torch.cumsum(x * 2, 1), torch.cummax(x, 1), y.sum(0)


@pytest.mark.parametrize("target", _targets())
def test_scans_and_workspaces_round_trip_in_a_fresh_process(target, tmp_path):
    """Scan kernels and kernels with workspaces (a split column sum; on triton-interpret the
    long rows' split scan too): the workspace arguments are Allocate lines of the saved
    program, the kernels' launch metadata loads with them."""
    g = _gen(3)
    x, y = torch.randn(3, 300, generator=g), torch.randn(20000, 4, generator=g)
    program = fxwrap.lower(scans_and_split_sums, x, y, target=target)
    roles = [a.role for line in program.lines if type(line).__name__ == "CallKernel" for a in line.kernel.signature]
    if target in ("cpu", "triton-interpret"):
        assert "workspace" in roles, program.code()
    path = tmp_path / "program.fxwrap"
    program.save(path)
    x2, y2 = torch.randn(3, 300, generator=g), torch.randn(20000, 4, generator=g)
    report = load_in_fresh_process(path, {"mode": "run", "args": (x2, y2), "expected": scans_and_split_sums(x2, y2)},
                                   tmp_path)
    assert compiler_modules(report["modules"], TARGETS[target]) == []
    assert compile_entries(report) == []


def test_a_module_with_parameters_and_a_dict_output(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    x = torch.randn(4, 16, generator=_gen(2))
    path = tmp_path / "model.fxwrap"
    fxwrap.lower(model, x).save(path)
    x2 = torch.randn(4, 16, generator=_gen(3))
    with torch.no_grad():
        expected = model(x2)
    report = load_in_fresh_process(path, {"mode": "run", "args": (x2,), "expected": expected}, tmp_path)
    assert compiler_modules(report["modules"]) == []

    w = torch.randn(16, 4, generator=_gen(4))
    path2 = tmp_path / "dict.fxwrap"
    fxwrap.lower(two_outputs, x, w).save(path2)
    report = load_in_fresh_process(path2, {"mode": "run", "args": (x2, w), "expected": two_outputs(x2, w)},
                                   tmp_path)
    assert compiler_modules(report["modules"]) == []


@pytest.mark.parametrize("target", ["cpu", pytest.param("triton-interpret", marks=INTERPRETER)])
def test_training_pair_round_trip_in_a_fresh_process(target, tmp_path):
    """Forward and backward saved together; the loaded pair gives eager's outputs and
    gradients (forward: primals -> outputs + saved values; backward: saved + tangents)."""
    x, w = (t.requires_grad_() for t in _inputs())
    pair = fxwrap.lower(mlp_block, x, w, training=True, target=target)
    path = tmp_path / "pair.fxwrap"
    pair.save(path)
    x2, w2 = (t.requires_grad_() for t in _inputs(5))
    out = mlp_block(x2, w2)
    tangent = torch.randn(out.shape, generator=_gen(6))
    out.backward(tangent)
    case = {"mode": "training", "args": (x2.detach(), w2.detach()), "expected": [out.detach()],
            "user_outputs": 1, "tangents": [tangent], "grads": [x2.grad, w2.grad]}
    report = load_in_fresh_process(path, case, tmp_path)
    assert compiler_modules(report["modules"]) == []
    assert compile_entries(report) == []


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_a_training_forward_runs_as_programs_md_says(target, tmp_path):
    """``.forward.run(*args)``: what the function returns; ``.forward(*graph_inputs)``: the outputs
    then the saved values; both with autograd on and parameters that require grad (the
    reference target runs its GraphModule, whose ``addmm(out=)`` autograd would refuse)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    pair = fxwrap.lower(model, torch.randn(5, 8, requires_grad=True), training=True, target=target)
    pair.save(tmp_path / "pair.fxwrap")
    loaded = fxwrap.load(tmp_path / "pair.fxwrap")
    x = torch.randn(5, 8)
    expected = model(x).detach()
    assert torch.is_grad_enabled()
    for forward in (pair.forward, loaded.forward):
        torch.testing.assert_close(forward.run(x), expected, rtol=1e-4, atol=1e-5)
        flat = forward(*forward.arguments((x,)))
        torch.testing.assert_close(flat[0], expected, rtol=1e-4, atol=1e-5)
        assert len(flat) == len(pair.forward.graph_module.graph.find_nodes(op="output")[0].args[0]) > 1


def test_pickle_of_a_program_is_the_saved_file(tmp_path):
    x, w = _inputs()
    program = fxwrap.lower(mlp_block, x, w)
    loaded = pickle.loads(pickle.dumps(program))
    assert isinstance(loaded, fxwrap.LoadedProgram)
    x2, w2 = _inputs(7)
    torch.testing.assert_close(loaded.run(x2, w2), mlp_block(x2, w2))
    # a loaded program pickles and saves again (its kernels keep their saved binaries)
    again = pickle.loads(pickle.dumps(loaded))
    torch.testing.assert_close(again.run(x2, w2), mlp_block(x2, w2))
    assert [type(k.loader).__name__ for k in again.kernels] == ["SharedObjectLoader"] * len(again.kernels)
    pair = fxwrap.lower(mlp_block, *(t.requires_grad_() for t in _inputs()), training=True)
    assert isinstance(pickle.loads(pickle.dumps(pair)), fxwrap.LoadedTrainingPrograms)


SAVE_IN_A_FRESH_PROCESS = """
import hashlib, os, torch, fxwrap
torch.manual_seed(int(os.environ["PYTHONHASHSEED"]))  # other values, the same program
def mlp_block(x, w):
    return torch.relu(x @ w) * 2 + x.sum(1, keepdim=True)
program = fxwrap.lower(mlp_block, torch.randn(8, 16), torch.randn(16, 4), target="cpu")
program.save("p.fxwrap")
print(hashlib.sha256(open("p.fxwrap", "rb").read()).hexdigest())
"""


def test_the_same_program_saves_to_the_same_bytes(tmp_path):
    """Two processes that share nothing (hash seeds, kernel caches, input values) lower the
    same function and save the same bytes: kernel binaries included (their builds name the
    source file by its key alone)."""
    first, second = in_two_processes(SAVE_IN_A_FRESH_PROCESS)
    assert len(first) == 64 and first == second
    program = fxwrap.lower(mlp_block, *_inputs())
    assert pickle.dumps(program) == pickle.dumps(program)


def test_a_loaded_program_is_guarded(tmp_path):
    x, w = _inputs()
    path = tmp_path / "p.fxwrap"
    fxwrap.lower(mlp_block, x, w).save(path)
    loaded = fxwrap.load(path)
    with pytest.raises(fxwrap.InputMismatchError, match="strides"):
        loaded.run(torch.randn(16, 8).t(), w)
    with pytest.raises(TypeError, match="takes 2 positional arguments"):
        loaded.run(x)


def _rewrite_header(path, **changes):
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    header = json.loads(members[HEADER])
    header.update(changes)
    members[HEADER] = json.dumps(header).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    path.write_bytes(buffer.getvalue())


def test_another_version_or_an_absent_device_is_a_clear_error(tmp_path):
    path = tmp_path / "p.fxwrap"
    fxwrap.lower(mlp_block, *_inputs()).save(path)
    _rewrite_header(path, torch_version="2.11.0")
    with pytest.raises(fxwrap.ProgramFileError,
                       match=r"saved by fxwrap .* with torch 2.11.0; this is fxwrap .* with torch .*lower the "
                             r"function again here"):
        fxwrap.load(path)
    fxwrap.lower(mlp_block, *_inputs()).save(path)
    _rewrite_header(path, fxwrap_version="0.0.1")
    with pytest.raises(fxwrap.ProgramFileError, match="saved by fxwrap 0.0.1"):
        fxwrap.load(path)
    fxwrap.lower(mlp_block, *_inputs()).save(path)
    _rewrite_header(path, format_version=99)
    with pytest.raises(fxwrap.ProgramFileError, match="format version 99"):
        fxwrap.load(path)
    if not torch.cuda.is_available():
        fxwrap.lower(mlp_block, *_inputs()).save(path)
        _rewrite_header(path, target="cuda", device_type="cuda")
        with pytest.raises(fxwrap.ProgramFileError,
                           match=r"program for target 'cuda', which runs on cuda devices: this machine has "
                                 r"no cuda device \(torch.get_device_module\('cuda'\).is_available\(\) is False\)"):
            fxwrap.load(path)
        _rewrite_header(path, target="vpu", device_type="vpu")  # a PrivateUse1 device never registered here
        with pytest.raises(fxwrap.ProgramFileError,
                           match=r"which runs on vpu devices: torch knows no 'vpu' device in this process: import "
                                 r"the package that registers it"):
            fxwrap.load(path)
    path.write_bytes(b"not a zip")
    with pytest.raises(fxwrap.ProgramFileError, match="is not an fxwrap program file"):
        fxwrap.load(path)


def test_a_target_plugin_missing_at_load_names_the_target_and_the_package(tmp_path):
    pytest.importorskip("fxwrap_arena", reason="the example plugin examples/fxwrap-arena is not installed")
    path = tmp_path / "arena.fxwrap"
    fxwrap.lower(mlp_block, *_inputs(), target="arena").save(path)
    header = json.loads(zipfile.ZipFile(path).read(HEADER))
    assert header["target_package"] == {"module": "fxwrap_arena", "distribution": "fxwrap-arena"}
    code = ("import sys\nsys.modules['fxwrap_arena'] = None  # the plugin is not installed\n"
            "import fxwrap\ntry:\n    fxwrap.load(sys.argv[1])\nexcept fxwrap.ProgramFileError as e:\n    print(e)\n")
    out = run_python(["-c", code, str(path)], child_env(tmp_path / "cache")).stdout
    assert re.search(rf"{path} is a program for target 'arena', and loading it needs the module 'fxwrap_arena[.\w]*'",
                     out), out
    assert "install the package 'fxwrap-arena' (pip install fxwrap-arena)" in out


def test_a_binary_built_for_another_cpu_is_compiled_again_with_a_warning(tmp_path):
    x, w = _inputs()
    program = fxwrap.lower(mlp_block, x, w)
    data = pickle.dumps(program)
    loaded = pickle.loads(data)
    for kernel in loaded.kernels:  # as if another machine had saved it
        kernel.loader.host = "another cpu"
    from fxwrap.programs.artifacts import dumps, loads
    with pytest.warns(UserWarning, match="built for another CPU"):
        again = loads(dumps(loaded))
    torch.testing.assert_close(again.run(x, w), mlp_block(x, w))


SAVED_BY_FORMAT_1 = Path(__file__).with_name("saved_by_format_1.fxwrap")  # fxwrap at 863c3ad: cpu, sin, softmax


def test_a_file_saved_with_one_launch_record_for_every_target_is_refused_clearly():
    """Format 1 kept one ``KernelLaunch`` of every target's fields; format 2 keeps a record per
    target (``runtime/launch.py``).  A format-1 file fails at its header, naming the versions and
    what to do; its pickled launch records, unpickled anyway, fail naming the cause."""
    with pytest.raises(fxwrap.ProgramFileError, match=r"format version 1; this fxwrap reads version 3: lower "
                                                      r"the function again and save it"):
        fxwrap.load(SAVED_BY_FORMAT_1)
    with zipfile.ZipFile(SAVED_BY_FORMAT_1) as archive:
        payload = archive.read("program.pkl")
    with pytest.raises(TypeError, match=r"launch metadata of a KernelLaunch holds fields it does not declare "
                                        r"\['autotune_reused'.*saved by an older fxwrap.*lower the function again"):
        _FormerModules(io.BytesIO(payload)).load()


class _FormerModules(pickle.Unpickler):
    """Reads a pickle written before format 3 moved ``fxwrap.arguments`` and ``fxwrap.artifacts``
    into ``fxwrap/programs/`` (``fxwrap.load`` refuses such a file at its header)."""

    def find_class(self, module, name):
        if module in ("fxwrap.arguments", "fxwrap.artifacts"):
            module = "fxwrap.programs." + module.partition(".")[2]
        return super().find_class(module, name)


# fuzz seed 941408's program: a kernel that reads a view of a buffer it writes (``i9[2].mul_(2)``
# after ``i6.index_put_``) marks the two as sharing storage
_SHARED_STORAGE_CHILD = """
import sys, tempfile
import torch, fxwrap
from fxwrap.testing.fuzz import generate, harness, load
ns = load(generate(941408))
module = harness.make_module(ns)
args = [harness.make_tensor((*s[:6], False), ns["SEED"], i) for i, s in enumerate(ns["INPUTS"])]
program = fxwrap.lower(module, *[a.clone() for a in args], target=sys.argv[1], options={"cache": False})
assert any(call.kernel.launch.kernel.shared_storage for call in program.lines
           if type(call).__name__ == "CallKernel" and hasattr(call.kernel.launch, "kernel")), program.code()
with tempfile.TemporaryDirectory() as directory:
    program.save(directory + "/program.fxwrap")
    loaded = fxwrap.load(directory + "/program.fxwrap")
fresh = [harness.make_tensor((*s[:6], False), ns["SEED"] + 1, i) for i, s in enumerate(ns["INPUTS"])]
got = loaded.run(*[a.clone() for a in fresh])
want = module(*[a.clone() for a in fresh])
for g, w in zip(got, want):
    torch.testing.assert_close(g, w)
print("OK")
"""


@pytest.mark.parametrize("hash_seed", ["7", "16"])
def test_a_kernel_with_shared_storage_loads_under_any_hash_seed(hash_seed, tmp_path):
    """Fuzz seed 941408 (reference, bad-input fuzzer): a saved kernel's digest covers its
    launch record's repr, which held the names of its buffers that share storage as a
    frozenset; unpickled, the set could iterate in another order (string hashes differ per
    process: PYTHONHASHSEED 7, 16 and 21 did), so ``fxwrap.load`` called a whole program
    damaged (``ProgramFileError``).  The names are a sorted tuple now."""
    env = child_env(tmp_path / "cache", PYTHONHASHSEED=hash_seed)
    out = run_python(["-c", _SHARED_STORAGE_CHILD, "reference"], env)
    assert out.stdout.strip().endswith("OK"), out.stdout[-2000:]
