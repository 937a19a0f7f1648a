"""A ``Kernel`` lives as long as a program holds it: FX's set of side-effectful
functions (which keeps launch nodes alive through dead-code elimination) holds one
entry for every kernel, not the kernels themselves."""
import gc
import weakref

import torch

import fxwrap


def _kernels(program):
    return [n.target for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


def test_kernels_are_freed_with_their_program():
    x = torch.randn(8, 16)
    program = fxwrap.lower(lambda x: (x.sin() * 2).sum(1), x, target="cpu")
    got = program.run(x)
    torch.testing.assert_close(got, (x.sin() * 2).sum(1))
    refs = [weakref.ref(k) for k in _kernels(program)]
    assert refs
    del program, got
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_launch_nodes_survive_dead_code_elimination():
    x = torch.randn(8, 16)
    program = fxwrap.lower(lambda x: torch.exp(x) + 1, x, target="cpu")
    gm = program.graph_module
    launches = [n for n in gm.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert launches and all(not n.users for n in launches)  # nothing reads a launch's result
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert [n for n in gm.graph.nodes if isinstance(n.target, fxwrap.Kernel)] == launches
    torch.testing.assert_close(gm(x)[0], torch.exp(x) + 1)
    other = fxwrap.lower(lambda x: torch.cos(x), x, target="cpu")
    a, b = _kernels(program)[0], _kernels(other)[0]
    assert a != b and a == a and len({a, b}) == 2  # kernels stay distinct as keys
