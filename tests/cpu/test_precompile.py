"""Precompiled functions (fxwrap/programs/precompile.py, ``fxwrap.aot_compile`` / ``load_compiled``):
a process with an empty cache directory loads a saved function and runs it with no dynamo
trace, no AOTAutograd and no lowering, with eager's numbers; inputs the saved guards exclude,
an artifact from elsewhere and a graph the warm-start cache cannot store are clear errors."""
import pickle
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.programs.precompile import PrecompiledGraph, has_aot_precompile
from shared_helpers import run_child

needs_precompile = pytest.mark.skipif(not has_aot_precompile(), reason=f"torch {torch.__version__}: torch.compile's "
                                      "result has no .aot_compile (torch's AOT precompile)")

CHILD = Path(__file__).with_name("precompile_child.py")


def child(cache_dir, *args) -> dict:
    return run_child(CHILD, cache_dir, *args)


@needs_precompile
@pytest.mark.parametrize("batch_norm", [False, True], ids=["plain", "batch_norm"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_loaded_function_runs_with_no_trace_and_no_lowering(tmp_path, mode, batch_norm):
    path = tmp_path / "model.fxaot"
    extra = ["--batch-norm"] if batch_norm else []
    made = child(tmp_path / "a", "save", path, mode, *extra)
    assert made["captured"] >= 1 and made["aot"] == 1, made  # the save traced and compiled
    assert made["lowered"] == (["inference"] if mode == "inference" else ["forward", "backward"]), made
    assert made["err"] < 1e-5, made
    loaded = child(tmp_path / "b", "load", path, mode, *extra)  # another, empty cache directory
    assert loaded["captured"] == 0 and loaded["frames"] == 0, loaded  # no dynamo trace
    assert loaded["aot"] == 0 and loaded["lowered"] == [], loaded  # no AOTAutograd, no lowering
    assert loaded["stats"] == {} and loaded["loaded"] == 1, loaded  # not through the warm-start cache
    assert loaded["err"] < 1e-5, loaded
    assert not (tmp_path / "b" / "graphs").exists() and not (tmp_path / "b" / "programs").exists()
    # nothing compiled: no kernel, and the C launch binding came with the file
    assert not (tmp_path / "b" / "cpu_cpp").exists(), list((tmp_path / "b").rglob("*"))
    assert sorted(p.suffix for p in (tmp_path / "b" / "launch").rglob("*.*")) == [".sha256", ".so"], \
        list((tmp_path / "b").rglob("*"))  # the binding and its seal


@needs_precompile
def test_inputs_the_saved_guards_exclude_are_refused(tmp_path):
    path = tmp_path / "model.fxaot"
    child(tmp_path / "a", "save", path, "inference")
    with pytest.raises(AssertionError, match="GuardManager check failed"):
        child(tmp_path / "b", "load", path, "inference", "--batch", 5)  # compiled for 8 rows


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


@needs_precompile
def test_in_process_round_trip_matches_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    model, x = _mlp(), torch.randn(6, 8)
    with torch.no_grad():
        compiled = fxwrap.aot_compile(model, (x,))
        torch.testing.assert_close(compiled(x), model(x))
    compiled.save(tmp_path / "f.fxaot")
    loaded = fxwrap.load_compiled(tmp_path / "f.fxaot", model)
    y = torch.randn(6, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(y), model(y))
        model[0].weight.mul_(2)  # the parameters are read at each call, not baked in
        torch.testing.assert_close(loaded(y), model(y))


@needs_precompile
def test_artifact_from_another_torch_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    model, x = _mlp(), torch.randn(6, 8)
    with torch.no_grad():
        compiled = fxwrap.aot_compile(model, (x,))
    graph = compiled.function._artifacts.compiled_fn
    assert isinstance(graph, PrecompiledGraph)
    state = pickle.loads(PrecompiledGraph.serialize_compile_artifacts(graph))
    state["header"]["torch_version"] = "2.0.0"
    with pytest.raises(fxwrap.CacheBundleError, match="another torch version"):
        PrecompiledGraph.deserialize_compile_artifacts(pickle.dumps(state))


@needs_precompile
def test_graph_the_cache_cannot_store_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")

    def aliasing(x):
        return x.view(-1), x.sin()  # an output aliasing an input: AOTAutograd's wrapper regenerates it

    with torch.no_grad(), pytest.raises(fxwrap.PrecompileError, match="aliases an input"):
        fxwrap.aot_compile(aliasing, (torch.randn(4, 4),))


@needs_precompile
def test_caches_off_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    with torch.no_grad(), pytest.raises(fxwrap.PrecompileError, match="caches are off"):
        fxwrap.aot_compile(_mlp(), (torch.randn(6, 8),), options={"cache": False})


def test_a_torch_without_aot_precompile_is_a_clear_error(monkeypatch):
    """torch 2.11's compiled functions have no ``.aot_compile``: ``fxwrap.aot_compile`` says so."""
    import fxwrap.api
    monkeypatch.setattr(fxwrap.api, "has_aot_precompile", lambda: False)
    with pytest.raises(fxwrap.PrecompileError, match=r"has no AOT precompile.*\.aot_compile"):
        fxwrap.aot_compile(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
