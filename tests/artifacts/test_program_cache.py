"""The whole-program cache: a second process compiling the same graph loads the
programs (no lowering, no kernel compile) and gets eager's numbers; any change misses."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import fxwrap
from fxwrap.programs import program_cache

from artifact_helpers import HERE, child_env, run_python


def _compile_in_fresh_process(case: str, cache_dir, **env) -> dict:
    env = child_env(cache_dir, **{"FXWRAP_PROGRAM_CACHE": "1", "CXX": os.environ.get("CXX", "g++"), **env})
    out = run_python([str(HERE / "compile_twice.py"), case], env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _entries(cache_dir) -> list:
    return sorted((cache_dir / "programs").rglob("*.pkl"))


@pytest.mark.parametrize("case", ["inference", "training", "dynamic"])
def test_a_second_process_loads_the_programs(case, tmp_path):
    cold = _compile_in_fresh_process(case, tmp_path)
    assert cold["kernel_builds"] == len(cold["programs"]) >= 1
    entries = _entries(tmp_path)
    assert len(entries) == len(set(cold["programs"])) if case != "dynamic" else len(entries) >= 1
    # warm: no lowering, no kernel compile (the kernel cache is gone: a compile would
    # write it again), and still eager's numbers
    shutil.rmtree(tmp_path / "cpu_cpp")
    warm = _compile_in_fresh_process(case, tmp_path)
    assert warm["kernel_builds"] == 0
    assert not (tmp_path / "cpu_cpp").exists()
    assert warm["programs"] == cold["programs"]
    assert _entries(tmp_path) == entries


def test_off_by_option_and_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    x = torch.randn(8, 16)
    fxwrap.lower(lambda t: t.sin() + 1, x, options={"cache": False})
    assert _entries(tmp_path) == []
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "0")
    fxwrap.lower(lambda t: t.sin() + 1, x)
    assert _entries(tmp_path) == []
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    fxwrap.lower(lambda t: t.sin() + 1, x)
    assert len(_entries(tmp_path)) == 1


def _count_builds(monkeypatch):
    from fxwrap.wrapper_ir import render
    builds = []
    original = render.Renderer.render

    def counting(self):
        builds.append(1)
        return original(self)
    monkeypatch.setattr(render.Renderer, "render", counting)
    return builds


def _deterministic(compile_):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        return compile_()
    finally:
        torch.use_deterministic_algorithms(previous)


def test_every_change_misses(tmp_path, monkeypatch):
    """Same graph again: a hit (no kernel build, the same numbers).  Another shape, dtype,
    option, constant value or target: a miss, and a new entry."""
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    builds = _count_builds(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g)
    scale = torch.randn(16, generator=g)

    def f(t):
        return torch.tanh(t) * scale

    first = fxwrap.lower(f, x)
    assert len(builds) == 1 and len(_entries(tmp_path)) == 1
    again = fxwrap.lower(f, x)
    assert len(builds) == 1 and len(_entries(tmp_path)) == 1  # a hit
    x2 = torch.randn(8, 16, generator=g)
    torch.testing.assert_close(again.run(x2), f(x2))
    torch.testing.assert_close(again.run(x2), first.run(x2))
    assert again.code() == first.code()
    changes = [lambda: fxwrap.lower(f, torch.randn(16, 8).t()),  # other strides
               lambda: fxwrap.lower(f, torch.randn(4, 16)),
               lambda: fxwrap.lower(f, x.double()),
               lambda: fxwrap.lower(f, x, options={"reuse": False}),
               lambda: fxwrap.lower(f, x, target="reference"),
               lambda: _deterministic(lambda: fxwrap.lower(f, x))]  # a long-row scan's plan depends on it
    for n, change in enumerate(changes, start=2):
        change()
        assert len(_entries(tmp_path)) == n, f"change {n - 1} hit an old entry"
    scale.add_(1.0)  # a captured tensor: a graph input, so the same entry serves the new value
    torch.testing.assert_close(fxwrap.lower(f, x).run(x2), f(x2))


def test_a_constant_in_the_graph_is_keyed_by_value(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    x = torch.randn(8, 4)
    gm = torch.fx.symbolic_trace(lambda t: t * 2)  # an ATen graph with a get_attr constant
    from fxwrap.api import compile_aten_graph, compile_session
    from fxwrap.core.capture import capture_backend  # noqa: F401  (the graphs of lower())

    def graph_with(constant):
        graph = torch.fx.Graph()
        t = graph.placeholder("arg0")
        c = graph.get_attr("_const")
        graph.output((graph.call_function(torch.ops.aten.add.Tensor, (t, c)),))
        module = torch.fx.GraphModule({"_const": constant}, graph)
        fake = torch._subclasses.FakeTensorMode()
        for node in graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = fake.from_tensor(x)
            elif node.op == "get_attr":
                node.meta["val"] = fake.from_tensor(constant)
        out = next(n for n in graph.nodes if n.op == "call_function")
        out.meta["val"] = fake.from_tensor(x + constant)
        return module
    del gm
    session = compile_session(fxwrap.get_plugin_manager().target("cpu"), {})
    one, two = torch.ones(8, 4), torch.full((8, 4), 2.0)
    p1 = compile_aten_graph(graph_with(one), session)
    p2 = compile_aten_graph(graph_with(two), session)
    assert len(_entries(tmp_path)) == 2
    torch.testing.assert_close(p1(x)[0], x + 1)
    torch.testing.assert_close(p2(x)[0], x + 2)


def test_a_damaged_entry_is_a_miss(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    x = torch.randn(8, 16)
    fxwrap.lower(lambda t: t.cos() * 3, x)
    (entry,) = _entries(tmp_path)
    entry.write_bytes(b"garbage")
    builds = _count_builds(monkeypatch)
    p = fxwrap.lower(lambda t: t.cos() * 3, x)
    assert len(builds) == 1 and "ignoring entry" in caplog.text
    torch.testing.assert_close(p.run(x), x.cos() * 3)
    assert entry.read_bytes() != b"garbage"  # rewritten


def test_concurrent_processes_share_one_entry(tmp_path):
    env = child_env(tmp_path, FXWRAP_PROGRAM_CACHE="1", CXX=os.environ.get("CXX", "g++"))
    procs = [subprocess.Popen([sys.executable, str(HERE / "compile_twice.py"), "inference"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-4000:]
    assert len(_entries(tmp_path)) == 1
    assert not list((tmp_path / "programs").rglob("*.tmp"))


def test_the_key_covers_fxwrap_sources():
    assert len(program_cache.package_digest()) == 64


def test_the_key_covers_plugin_sources(tmp_path, monkeypatch):
    """A vendor editing its plugin (here: a lowering rule's module) misses the cache: the
    key holds a digest of every registered plugin's package sources."""
    import importlib
    import importlib.metadata

    from fxwrap.plugins.manager import PluginManager, installed_entry_points

    package = tmp_path / "vendor_rules"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("SCALE = 2.0\n")
    (package / "plugin.py").write_text("from fxwrap.plugins.hookspecs import hookimpl\n\n"
                                       "@hookimpl\ndef fxwrap_decompositions(target):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    entry = importlib.metadata.EntryPoint("vendor_rules", "vendor_rules.plugin", group="fxwrap")
    manager = PluginManager([*installed_entry_points(), entry])
    manager.load()
    plugins = manager.pm.get_plugins()
    first = program_cache.plugin_digest(plugins)
    assert first == program_cache.plugin_digest(plugins)
    (package / "helpers.py").write_text("SCALE = 3.0\n")  # a file the plugin's package holds
    assert program_cache.plugin_digest(plugins) != first


def test_graph_constants_are_keyed_by_their_bytes(tmp_path, monkeypatch):
    """``torch.tensor([...])`` in the user's code is a real constant of the ATen graph; the
    key reads its bytes while AOTAutograd's fake mode is active (that used to fail the
    compile: "Please convert all Tensors to FakeTensors first", HF GPT-2 on CUDA); a
    constant of other values is another program."""
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")

    def make(values):
        def fn(x):
            empty = torch.tensor([], dtype=x.dtype)
            return torch.cat([x, empty]) * torch.tensor(values, dtype=x.dtype)
        return fn

    x = torch.randn(2)
    for values in ([1.5, -2.0], [1.5, -2.0], [0.25, 3.0]):
        torch._dynamo.reset()
        fn = make(values)
        got = torch.compile(fn, backend="fxwrap", fullgraph=True)(x)
        torch.testing.assert_close(got, fn(x))
    assert len(_entries(tmp_path)) == 2  # the second compile loaded the first's program


def test_fxwrap_log_cache_shows_program_cache_misses_and_hits(tmp_path):
    code = ("import torch, fxwrap\n"
            "x = torch.randn(8, 16)\n"
            "for _ in range(2):\n"
            "    torch.testing.assert_close(fxwrap.lower(lambda t: t.tan() * 2, x, target='cpu').run(x), x.tan() * 2)\n")
    env = child_env(tmp_path, FXWRAP_PROGRAM_CACHE="1", FXWRAP_LOG="cache", CXX=os.environ.get("CXX", "g++"))
    err = run_python(["-c", code], env).stderr
    lines = [line for line in err.splitlines() if "program cache" in line]
    assert [line.split(":", 1)[1].split()[0] for line in lines] == ["miss", "stored", "hit"], err[-3000:]
    assert all(line.startswith("[fxwrap.cache] fxwrap program cache:") for line in lines)


def test_keys_are_the_same_in_two_processes_and_differ_by_dtype_shape_and_option(tmp_path):
    """Both caches' keys (``fxwrap.programs.cache_key``, one encoder): the same program gives the same
    program key and warm-start key in two fresh interpreters (different hash seeds: no set or
    dict order, no object address reaches a key); a program differing in a dtype, a shape or an
    option gives other keys."""
    runs = []
    for seed in ("1", "2"):
        env = child_env(tmp_path / f"cache-{seed}", FXWRAP_PROGRAM_CACHE="1", PYTHONHASHSEED=seed)
        out = run_python([str(HERE / "cache_keys_child.py")], env)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first == second
    base = first["base"]
    assert len(base["program"]) == 1 and len(base["graph"]) == 1, base
    assert first["base again"] == {"graph": base["graph"], "program": []}  # a warm-start hit: no ATen graph
    for case in ("float64", "shape", "option"):
        for cache in ("program", "graph"):
            assert first[case][cache] and set(first[case][cache]).isdisjoint(base[cache]), (case, cache)


def test_the_key_encoder_writes_plain_data_only():
    """A value the encoder has no rule for is an error naming it, not a ``repr`` (which could
    hold an address: a key that changes every process)."""
    from fxwrap.programs.cache_key import encode
    assert encode((1, "1")) != encode(("1", 1)) and encode(("a", "b")) != encode(("a,b",))
    assert encode({"b": 1, "a": frozenset({"x", "y"})}) == encode({"a": frozenset({"y", "x"}), "b": 1})
    assert encode(1) != encode(1.0) != encode(True)
    with pytest.raises(TypeError, match="cannot encode a .*object"):
        encode(object())
