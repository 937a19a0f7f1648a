"""GraphModules pickle, reload and still run: in this process and in a fresh one."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor

import fxwrap
from fxwrap.wrapper_ir.fx import to_graph_module

import null_helpers as H

HERE = Path(__file__).resolve().parent


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _structure(gm):
    """What must survive a pickle: ops, targets, arguments, comments, value layouts.

    Symbolic sizes are written over the size inputs' placeholder names, so graphs
    whose SymInts come from different ShapeEnvs compare equal.
    """
    names = {}
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if n.op == "placeholder" and isinstance(val, torch.SymInt):
            names[val.node.expr] = sympy.Symbol(n.name)

    def expr(x):
        if isinstance(x, torch.SymInt):
            e = x.node.expr
            return str(e.xreplace({s: names.get(s, s) for s in e.free_symbols}))
        return str(int(x))

    rows = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            val = (tuple(map(expr, val.shape)), tuple(map(expr, val.stride())),
                   expr(val.storage_offset()), val.dtype, val.device)
        elif isinstance(val, torch.SymInt):
            val = expr(val)
        rows.append((n.op, n.name, str(n.target), str(n.args), str(n.kwargs), n.meta.get("comment"),
                     n.meta.get("fxwrap_origins"), n.meta.get("stack_trace"), val))
    return rows


def _symbolic(t):
    return any(isinstance(x, torch.SymInt) for x in (*t.shape, *t.stride()))


def test_extern_only_program_round_trips():
    program = H.lower(H.mlp, *H.mlp_inputs(_gen(1)))
    gm = program.graph_module
    loaded = pickle.loads(pickle.dumps(gm))
    assert _structure(loaded) == _structure(gm)
    assert loaded.code == gm.code
    calls = [n for n in loaded.graph.nodes if isinstance(n.target, torch._ops.OpOverload) and "out" in n.kwargs]
    assert calls and all(n.meta["fxwrap_origins"] for n in calls)  # provenance survives the round trip
    assert not any("fxwrap_origins" in n.meta for n in loaded.graph.nodes if n.target is torch.empty_strided)
    assert type(loaded).__name__ == "FxwrapProgram"
    allocs = [n for n in loaded.graph.nodes if n.target is torch.empty_strided]
    assert allocs and all(isinstance(n.meta["val"], FakeTensor) for n in allocs)
    assert sum(n.target is fxwrap.runtime.free for n in loaded.graph.nodes) == \
        sum(n.target is fxwrap.runtime.free for n in gm.graph.nodes) >= 1
    assert not list(loaded.buffers())  # no buffer baked in as a constant
    first_args, second_args = H.mlp_inputs(_gen(2)), H.mlp_inputs(_gen(3))
    first = loaded(*first_args)[0]
    kept = first.clone()
    second = loaded(*second_args)[0]
    torch.testing.assert_close(first, kept)  # the second call did not write into the first result
    torch.testing.assert_close(first, H.mlp(*first_args))
    torch.testing.assert_close(second, H.mlp(*second_args))


@pytest.mark.parametrize("mode", list(H.MODES))
def test_views_and_multi_output_programs_round_trip(mode):
    for fn, shape in ((H.views, (6, 8)), (H.topk, (5, 10)), (H.split, (6, 5))):
        gm = H.lower(fn, torch.randn(*shape, generator=_gen(4)), mode=mode).graph_module
        loaded = pickle.loads(pickle.dumps(gm))
        assert _structure(loaded) == _structure(gm)
        x = torch.randn(*shape, generator=_gen(5))
        H.assert_close_all(loaded(x), fn(x))


def test_reference_kernels_round_trip():
    gm = H.lower(H.mlp, *H.mlp_inputs(_gen(17)), mode="reference").graph_module
    kernels = [n.target for n in gm.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert len(kernels) >= 2
    loaded = pickle.loads(pickle.dumps(gm))
    assert _structure(loaded) == _structure(gm)
    reloaded = [n.target for n in loaded.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert [(k.key, k.source, k.signature) for k in reloaded] == [(k.key, k.source, k.signature) for k in kernels]
    assert loaded._fxwrap_kernels == tuple(reloaded)
    for seed in (18, 19):
        args = H.mlp_inputs(_gen(seed))
        H.assert_close_all(loaded(*args), (H.mlp(*args),))


def _with_constant(x):
    return x * torch.tensor([1.0, 2.0, 3.0]) + 1


def test_program_with_constants_round_trips():
    program = H.lower(_with_constant, torch.randn(4, 3, generator=_gen(8)))
    assert list(program.constants) == ["const0"]
    loaded = pickle.loads(pickle.dumps(program.graph_module))
    assert _structure(loaded) == _structure(program.graph_module)
    torch.testing.assert_close(loaded.const0, torch.tensor([1.0, 2.0, 3.0]))
    x = torch.randn(4, 3, generator=_gen(9))
    H.assert_close_all(loaded(x), (_with_constant(x),))


def test_symbolic_program_round_trips_and_runs_at_two_sizes():
    program = H.lower(H.mlp, *H.mlp_inputs(_gen(10)), dynamic=True)
    gm = program.graph_module
    loaded = pickle.loads(pickle.dumps(gm))
    assert loaded.code == gm.code
    assert _structure(loaded) == _structure(gm)
    size_phs = [n for n in loaded.graph.nodes if n.op == "placeholder" and isinstance(n.meta["val"], torch.SymInt)]
    assert len(size_phs) == 4
    allocs = [n for n in loaded.graph.nodes if n.target is torch.empty_strided]
    assert allocs and all(_symbolic(n.meta["val"]) for n in allocs)
    for sizes in ((5, 12, 20, 3), (9, 7, 11, 6)):
        tensors = H.mlp_inputs(_gen(sum(sizes)), *sizes)
        args = H.graph_args(program.inputs, tensors)
        H.assert_close_all(loaded(*args), (H.mlp(*tensors),))


def test_kernel_program_round_trips_in_process():
    kernel = H.double_plus_one_kernel()
    inputs, lines = H.kernel_program(kernel)
    gm = to_graph_module(inputs, lines)
    loaded = pickle.loads(pickle.dumps(gm))
    launches = [n for n in loaded.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert len(launches) == 2 and launches[0].target is launches[1].target
    k = launches[0].target
    assert (k.name, k.source, k.target, k.signature, k.launch, k.loader) == \
        (kernel.name, kernel.source, kernel.target, kernel.signature, kernel.launch, H.exec_loader)
    assert loaded._fxwrap_kernels == (k,)
    assert getattr(fxwrap.runtime.kernel, k.key) is k
    x = torch.randn(4, 6, generator=_gen(11))
    H.assert_close_all(loaded(x), H.kernel_program_eager(x))
    assert _structure(loaded) == _structure(gm)


FRESH = textwrap.dedent("""
    import pickle, sys
    import torch
    with open(sys.argv[1], "rb") as f:
        blobs = pickle.load(f)
    import fxwrap
    for blob in blobs:
        gm = blob["gm"]
        launches = [n for n in gm.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
        assert len(launches) == blob["n_launches"], launches
        for n in launches:
            assert getattr(fxwrap.runtime.kernel, n.target.key) is n.target, "kernel not registered"
            assert n.target.loader.__module__ == blob["loader_module"]
        for args, expected in blob["runs"]:
            out = gm(*args)
            for got, want in zip(out, expected, strict=True):
                torch.testing.assert_close(got, want)
        frees = sum(n.target is fxwrap.runtime.free for n in gm.graph.nodes)
        print("OK", len(launches), frees)
""")


def test_kernel_and_extern_programs_load_in_a_fresh_process(tmp_path):
    kernel_inputs, kernel_lines = H.kernel_program()
    kernel_gm = to_graph_module(kernel_inputs, kernel_lines)
    xs = [torch.randn(4, 6, generator=_gen(seed)) for seed in (12, 13)]
    mlp_gm = H.lower(H.mlp, *H.mlp_inputs(_gen(14))).graph_module
    mlp_args = [H.mlp_inputs(_gen(seed)) for seed in (15, 16)]
    reference_gm = H.lower(H.mlp, *H.mlp_inputs(_gen(20)), mode="reference").graph_module
    blobs = [
        {"gm": kernel_gm, "n_launches": 2, "loader_module": "null_helpers",
         "runs": [((x,), H.kernel_program_eager(x)) for x in xs]},
        {"gm": mlp_gm, "n_launches": 0, "runs": [(a, (H.mlp(*a),)) for a in mlp_args]},
        {"gm": reference_gm, "n_launches": 2, "loader_module": "fxwrap.plugins.manager",
         "runs": [(a, (H.mlp(*a),)) for a in mlp_args]},
    ]
    path = tmp_path / "programs.pkl"
    with open(path, "wb") as f:
        pickle.dump(blobs, f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", FRESH, str(path)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert lines[0] == ["OK", "2", "1"]
    assert lines[1][:2] == ["OK", "0"] and int(lines[1][2]) >= 1
    assert lines[2][:2] == ["OK", "2"] and len(lines) == 3
