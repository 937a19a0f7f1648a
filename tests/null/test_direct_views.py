"""``fxwrap.runtime.direct.direct_graph_module(pointer_kernel=...)`` on hand-made graphs: which
views it leaves out.  A view whose first element is its base's and whose readers are kernels
that take data pointers -- or other views, which then view the base -- is not made; a view an
extern reads is.  The memory plan's reuse of a storage chains such views (``buf1`` reused as
``buf2`` for the next layer's attention): the chain's head goes, the view the extern reads
stays.  Kernels here are ``Kernel`` objects bound to Python launchers: no compiler."""
from __future__ import annotations

import torch

from fxwrap.runtime.direct import direct_graph_module, view_of
from fxwrap.runtime.kernel import Kernel


def _kernel(name, fn):
    kernel = Kernel(name, f"// {name}", "cpu", ())
    kernel.bind(fn)
    return kernel


def _copy_doubled(x, out):
    out.view(-1).copy_(x.reshape(-1) * 2)


def _add_one_in_place(buf):
    buf.add_(1)


DOUBLE = _kernel("double", _copy_doubled)
ADD_ONE = _kernel("add_one", _add_one_in_place)


def _chain_graph() -> torch.fx.GraphModule:
    """x -> buf0 (8 floats, a kernel writes it) -> buf1 = view (2, 4), a kernel adds 1 through it
    -> buf2 = view of buf1 (4, 2) read by an ATen op -> its result."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    buf0 = graph.call_function(torch.empty_strided, ((8,), (1,)), {"dtype": torch.float32, "device": torch.device("cpu")})
    graph.call_function(DOUBLE, (x, buf0))
    buf1 = graph.call_function(torch.as_strided, (buf0, (2, 4), (4, 1), 0))
    graph.call_function(ADD_ONE, (buf1,))
    buf2 = graph.call_function(torch.as_strided, (buf1, (4, 2), (2, 1), 0))
    out = graph.call_function(torch.ops.aten.mul.Tensor, (buf2, 3.0))
    graph.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _views(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (torch.as_strided, view_of)]


def test_a_view_kernels_and_a_view_read_is_not_made():
    gm = _chain_graph()
    runner = direct_graph_module(gm, pointer_kernel=lambda kernel: True)
    (kept,) = _views(runner)  # the view the ATen op reads, now over the allocation itself
    assert kept.args[0].target is not view_of and kept.args[0].target is not torch.as_strided, runner.code
    add_one = next(n for n in runner.graph.nodes if n.target is ADD_ONE)
    assert add_one.args[0] is kept.args[0], runner.code  # the kernel gets the allocation
    x = torch.randn(8)
    torch.testing.assert_close(runner(x), ((x * 2 + 1) * 3).view(4, 2))
    torch.testing.assert_close(gm(x), ((x * 2 + 1) * 3).view(4, 2))


def test_a_kernel_that_reads_tensors_keeps_its_views():
    gm = _chain_graph()
    runner = direct_graph_module(gm, pointer_kernel=lambda kernel: kernel is not ADD_ONE)
    assert len(_views(runner)) == 2, runner.code
    x = torch.randn(8)
    torch.testing.assert_close(runner(x), ((x * 2 + 1) * 3).view(4, 2))
