"""Saved ``cuda`` programs: the cubins run in a fresh process through the CUDA driver,
with no Triton compile and no fxwrap compiler module; a training pair; a split-outer
reduction (two cubins per kernel); a call the cubin was not compiled for (an input not
16-byte aligned) takes Triton's path with a warning and still gives eager's numbers.

    python -m pytest -q tests/cuda/test_save_load_cuda.py
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import fxwrap

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "artifacts"))
from artifact_helpers import compile_entries, compiler_modules, load_in_fresh_process  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: saved cubins run through the CUDA driver")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def mlp_block(x, w):
    return torch.relu(x @ w) * 2 + x.sum(1, keepdim=True)


def _inputs(seed=0, rows=64):
    g = _gen(seed)
    return torch.randn(rows, 128, generator=g).cuda(), torch.randn(128, 32, generator=g).cuda()


def _fresh(tmp_path, program_file, case):
    triton_cache = tmp_path / "triton-cache"
    report = load_in_fresh_process(program_file, case, tmp_path, TRITON_CACHE_DIR=str(triton_cache))
    assert compiler_modules(report["modules"]) == []
    assert compile_entries(report) == []
    # Triton compiled nothing: it writes every compile into its cache dir
    assert not triton_cache.exists() or not any(p.is_file() for p in triton_cache.rglob("*"))
    return report


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_inference_round_trip(dynamic, tmp_path):
    x, w = _inputs()
    path = tmp_path / "p.fxwrap"
    fxwrap.lower(mlp_block, x, w, dynamic=dynamic).save(path)
    x2, w2 = _inputs(1)
    report = _fresh(tmp_path, path, {"mode": "run", "args": (x2, w2), "expected": mlp_block(x2, w2)})
    assert set(report["kernels"]) == {"CubinLoader"}


def test_training_pair_round_trip(tmp_path):
    x, w = (t.requires_grad_() for t in _inputs())
    path = tmp_path / "pair.fxwrap"
    fxwrap.lower(mlp_block, x, w, training=True).save(path)
    x2, w2 = (t.requires_grad_() for t in _inputs(2))
    out = mlp_block(x2, w2)
    tangent = torch.randn(out.shape, generator=_gen(3)).cuda()
    out.backward(tangent)
    _fresh(tmp_path, path, {"mode": "training", "args": (x2.detach(), w2.detach()), "expected": [out.detach()],
                            "user_outputs": 1, "tangents": [tangent], "grads": [x2.grad, w2.grad]})


def test_split_outer_reduction_round_trip(tmp_path):
    x = torch.randn(8192, 37, generator=_gen(4)).cuda()
    program = fxwrap.lower(lambda t: t.sum(0), x)
    assert any(k.launch.plan == "split-outer" for k in program.graph_module._fxwrap_kernels)
    path = tmp_path / "split.fxwrap"
    program.save(path)
    x2 = torch.randn(8192, 37, generator=_gen(5)).cuda()
    _fresh(tmp_path, path, {"mode": "run", "args": (x2,), "expected": x2.sum(0)})


def test_lookback_scan_round_trip(tmp_path, monkeypatch):
    """A saved look-back scan: its zero-filled workspace is a line of the program, its cubin
    runs in a fresh process with the grid of one program per (row, chunk)."""
    from fxwrap.targets.cuda_triton.tiling import Planner
    monkeypatch.setattr(Planner, "lookback_min_elements", 0)  # the planner takes it from 8M elements on
    x = torch.randn(2, 1 << 20, generator=_gen(7)).cuda()
    program = fxwrap.lower(lambda t: torch.cumsum(t, -1), x)
    assert any(k.launch.plan == "lookback-scan" for k in program.graph_module._fxwrap_kernels)
    path = tmp_path / "lookback.fxwrap"
    program.save(path)
    x2 = torch.randint(-100, 100, (2, 1 << 20), generator=_gen(8)).float().cuda()  # exact float sums
    _fresh(tmp_path, path, {"mode": "run", "args": (x2,), "expected": torch.cumsum(x2, -1)})


def test_an_unaligned_input_takes_tritons_path_with_a_warning(tmp_path):
    x = torch.randn(64, 129, generator=_gen(6)).cuda()
    program = fxwrap.lower(lambda t: t.sin() + 1, x[:, :128])   # row stride 129, aligned start
    path = tmp_path / "p.fxwrap"
    program.save(path)
    loaded = fxwrap.load(path)
    y = torch.randn(64 * 129 + 1, generator=_gen(7)).cuda()[1:].view(64, 129)[:, :128]  # 4-byte offset
    with pytest.warns(UserWarning, match="not 16-byte aligned"):
        got = loaded.run(y)
    torch.testing.assert_close(got, y.sin() + 1)


def test_cudagraphs_mode_round_trip(tmp_path):
    x, w = _inputs()
    path = tmp_path / "p.fxwrap"
    fxwrap.lower(mlp_block, x, w, options={"mode": "cudagraphs"}).save(path)
    loaded = fxwrap.load(path)
    for seed in (8, 9, 10):
        x2, w2 = _inputs(seed)
        torch.testing.assert_close(loaded.run(x2, w2), mlp_block(x2, w2))


def test_program_cache_warm_process_on_cuda(tmp_path):
    """Cold then warm process through torch.compile: the warm one builds no kernel."""
    import json
    import subprocess
    here = Path(__file__).resolve().parent.parent / "artifacts"
    env = dict(os.environ, FXWRAP_CACHE_DIR=str(tmp_path), FXWRAP_PROGRAM_CACHE="1",
               PYTHONPATH=os.pathsep.join([str(Path(fxwrap.__file__).resolve().parent.parent),
                                           os.environ.get("PYTHONPATH", "")]))
    script = here / "compile_twice.py"
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, str(script), "training", "cuda"], capture_output=True, text=True,
                             env=env, timeout=600)
        assert out.returncode == 0, out.stderr[-4000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0]["kernel_builds"] >= 1 and runs[1]["kernel_builds"] == 0
