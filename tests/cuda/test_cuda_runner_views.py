"""The CUDA runner (``targets/cuda_triton/wrapper.CudaWrapper``) does not make the views that
only compiled Triton kernels read and whose first element is their base's: the launcher passes
data pointers, the same for both.  Views an extern reads (the matrix products' transposed
weights, SDPA's operands) or the program returns are made; ``free`` markers stay.  Structure of
the runner's graph and numbers against eager, on a GPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.runtime.direct import view_of
from fxwrap.runtime.kernel import Kernel
from fxwrap.runtime.launch import CppLaunch, TritonLaunch, UserTritonLaunch
from fxwrap.runtime.memory import free
from fxwrap.targets.cuda_triton.wrapper import reads_device_pointers

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuda target's runner needs a GPU")


def _views(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in (torch.as_strided, view_of)]


def _reduce_then_view(x):
    """A reduction's result viewed and read by the next kernel: a view only kernels read."""
    return x.sum(-1).view(4, 16).softmax(-1) * 3


def _block(x, w1, w3, w2, cache, pos):
    """A decode step's shapes: views read by matrix products (externs), an in-place cache write."""
    h = F.silu(F.linear(x, w1)) * F.linear(x, w3)
    y = (F.linear(h, w2) + x).view(1, 4, 8)
    cache.index_copy_(1, pos, y.transpose(0, 1))
    return y.reshape(1, 32).sin() * 2, cache.sum(1)


@needs_gpu
def test_views_only_compiled_kernels_read_are_not_made():
    torch.manual_seed(0)
    x = torch.randn(64, 32, device="cuda")
    program = fxwrap.lower(_reduce_then_view, x, target="cuda", options={"cache": False})
    contract, runner = program.graph_module, program.runner
    kernel_only = [n for n in _views(contract) if n.users and all(
        isinstance(u.target, Kernel) and reads_device_pointers(u.target) for u in n.users)]
    assert kernel_only, contract.code
    assert len(_views(runner)) == len(_views(contract)) - len(kernel_only), runner.code
    for seed in range(2):
        x = torch.randn(64, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        torch.testing.assert_close(program.run(x), _reduce_then_view(x), rtol=1e-5, atol=1e-5)


@needs_gpu
def test_views_externs_read_are_made_and_the_numbers_are_eagers():
    torch.manual_seed(0)
    w1, w3, w2 = (torch.randn(48, 32, device="cuda"), torch.randn(48, 32, device="cuda"),
                  torch.randn(32, 48, device="cuda"))
    x, pos = torch.randn(1, 32, device="cuda"), torch.tensor([3], device="cuda")
    cache = torch.randn(4, 16, 8, device="cuda")
    program = fxwrap.lower(_block, x, w1, w3, w2, cache.clone(), pos, target="cuda",
                           options={"cache": False})
    contract, runner = program.graph_module, program.runner
    assert len(_views(runner)) == len(_views(contract)) > 0, runner.code  # the products read them
    assert [n for n in runner.graph.nodes if n.op == "call_function" and n.target is free] or not [
        n for n in contract.graph.nodes if n.op == "call_function" and n.target is free]
    for seed in range(2):
        torch.manual_seed(seed + 1)
        x = torch.randn(1, 32, device="cuda")
        mine, theirs = cache.clone(), cache.clone()
        got, want = program.run(x, w1, w3, w2, mine, pos), _block(x, w1, w3, w2, theirs, pos)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine, theirs)


def test_the_runner_rule_on_a_program_rendered_as_cuda_renders_it():
    """No GPU: the cuda target's program rendered offline (``fxwrap.testing.offline_cuda``), run
    through the runner's rule (a Triton kernel reads pointers only; ``keep_free``): the view only
    kernels read goes, ``free`` markers stay, views the products read stay."""
    from fxwrap.runtime.direct import direct_graph_module
    from fxwrap.testing.offline_cuda import offline_programs

    def rule(gm):
        return direct_graph_module(gm, pointer_kernel=lambda k: k.launch.language == "triton", keep_free=True)

    def frees(gm):
        return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is free]

    (reduced,) = offline_programs(_reduce_then_view, torch.randn(64, 32))
    assert len(_views(reduced.graph_module)) == 1 and _views(rule(reduced.graph_module)) == []
    w = [torch.randn(48, 32), torch.randn(48, 32), torch.randn(32, 48)]
    (block,) = offline_programs(_block, torch.randn(1, 32), *w, torch.randn(4, 16, 8), torch.tensor([3]))
    runner = rule(block.graph_module)
    assert len(_views(runner)) == len(_views(block.graph_module)) == 3
    assert len(frees(runner)) == len(frees(block.graph_module)) > 0


def test_only_compiled_triton_kernels_read_pointers_only():
    def kernel(record=TritonLaunch, target="cuda", **launch):
        return Kernel("k", "src", target=target, signature=(), launch=record(symbol="k", pointers=1, **launch))
    assert reads_device_pointers(kernel(language="triton"))
    assert not reads_device_pointers(kernel(language="triton", interpret=True))
    assert not reads_device_pointers(kernel(UserTritonLaunch, language="triton"))
    assert not reads_device_pointers(kernel(CppLaunch, language="c++", target="cpu"))
