"""Programs of many small independent tensors, for the combo-kernel tests of each target
(``tests/cpu/test_combo_kernels.py``, ``tests/cuda/test_triton_combo_kernels.py``):
optimizer steps compiled as ``torch.compile(lambda: opt.step())`` and ``_foreach_*`` lists,
run on a target, with the kernels each launched and eager's numbers beside."""
from __future__ import annotations

import contextlib

import torch
import torch._dynamo

import fxwrap
from fxwrap.ir.lines import Allocate
from shared_helpers import kernels

#: parameter shapes: odd sizes, a 0-d and a 1-element tensor, no two alike but the 1-D ones
PARAM_SHAPES = [(7, 3), (5,), (), (4, 4, 2), (9,), (1,), (3, 5), (11,), (13, 17), (2, 3, 5)]
#: a small transformer's parameters: three layers of the same six shapes (a shape's tensors
#: lie one layer, six tensors, apart in the optimizer's lists: more than the fusion window)
LAYER_SHAPES = [(13, 6)] + [(6,), (6,), (18, 6), (18,), (6, 6), (24, 6)] * 3 + [(6,)]


def parameters(device, seed: int = 0, shapes=PARAM_SHAPES) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen).to(device)
    return params


def clones(params) -> list[torch.nn.Parameter]:
    out = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, q in zip(params, out):
        q.grad = p.grad.detach().clone()
    return out


@contextlib.contextmanager
def no_combo_kernels(*emitters):
    """The block with ``combo_kernels`` None on each emitter class: one kernel a group."""
    saved = [e.__dict__.get("combo_kernels") for e in emitters]
    try:
        for e in emitters:
            e.combo_kernels = None
        yield
    finally:
        for e, value in zip(emitters, saved):
            e.combo_kernels = value


def optimizer_step(target: str, device, optimizer: str, foreach: bool, steps: int = 2, shapes=PARAM_SHAPES,
                   programs: list | None = None):
    """``steps`` compiled steps of ``torch.optim.<optimizer>`` over ``shapes`` and as many
    eager ones on copies: ``(compiled params, eager params, compiled state, eager state,
    kernels launched by one step)``; the compiled programs are appended to ``programs``."""
    torch._dynamo.reset()
    params = parameters(device, shapes=shapes)
    ref = clones(params)
    cls = getattr(torch.optim, optimizer)
    opt = cls(params, lr=0.05, weight_decay=0.01, foreach=foreach)
    opt_ref = cls(ref, lr=0.05, weight_decay=0.01, foreach=foreach)
    programs = [] if programs is None else programs
    step = torch.compile(lambda: opt.step(), backend=fxwrap.Backend(target, {"on_program": programs.append,
                                                                              "cache": False}))
    for _ in range(steps):
        step()
        opt_ref.step()
    state = [opt.state[p] for p in params]
    state_ref = [opt_ref.state[p] for p in ref]
    return params, ref, state, state_ref, kernels(programs)


def few_kernels_a_step(target: str, device, emitter, optimizer: str, foreach: bool) -> list:
    """Compiled steps of ``optimizer`` on ``target`` give eager's numbers in at most 3 launches
    a step, where one kernel a parameter (or a parameter and a stage) runs without combo
    kernels (``emitter.combo_kernels`` None): the kernels launched."""
    *result, launched = optimizer_step(target, device, optimizer, foreach)
    assert_same_step(*result)
    with no_combo_kernels(emitter):
        *_, separate = optimizer_step(target, device, optimizer, foreach, steps=1)
    assert len(separate) >= len(PARAM_SHAPES)
    assert len(launched) <= 3, [k.name for k in launched]
    return launched


def one_kernel_a_parameter(target: str, device, optimizer: str) -> tuple[list, list]:
    """A compiled ``foreach`` step of ``optimizer`` over ``LAYER_SHAPES`` (19 tensors, each shape
    three times, a layer apart) gives eager's numbers, allocates nothing but the step counts (each
    parameter's update, both moments and the parameter, is one loop nest writing them in place:
    no moment goes through a buffer of its own), and launches no more kernels than the for-loop
    step: ``(kernels of the foreach step, of the for-loop step)``."""
    programs: list = []
    *result, launched = optimizer_step(target, device, optimizer, True, shapes=LAYER_SHAPES, programs=programs)
    assert_same_step(*result)
    allocated = [line.buf for p in programs for line in p.lines if isinstance(line, Allocate)]
    assert all(not buf.size for buf in allocated), [(b.name, b.size) for b in allocated if b.size]
    *result, loop = optimizer_step(target, device, optimizer, False, shapes=LAYER_SHAPES)
    assert_same_step(*result)
    assert len(launched) <= len(loop), ([k.name for k in launched], [k.name for k in loop])
    return launched, loop


def assert_same_step(params, ref, state, state_ref) -> None:
    for p, q in zip(params, ref):
        torch.testing.assert_close(p.detach(), q.detach())
    for s, t in zip(state, state_ref):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            # a compiled step keeps ``step`` on the parameters' device (dynamo moves a CPU step
            # counter there when it traces an optimizer, whatever the backend); eager keeps it on the CPU
            torch.testing.assert_close(s[key], t[key], check_device=False)


def foreach_lists(target: str, device, count: int = 10, dynamic: bool = False):
    """``torch._foreach_add_(xs, ys)`` then ``torch._foreach_mul(xs, 0.5)`` over ``count``
    tensors of ``count`` sizes, compiled and eager: ``(got, expected, kernels launched)``; the
    ``_foreach_*`` ops must become kernels (no extern call)."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(3 * i + 1, generator=gen).to(device) for i in range(count)]
    ys = [torch.randn(3 * i + 1, generator=gen).to(device) for i in range(count)]

    def fn(xs, ys):
        torch._foreach_add_(xs, ys)
        return torch._foreach_mul(xs, 0.5)

    xs_ref = [x.clone() for x in xs]
    expected = fn(xs_ref, ys)
    programs: list = []
    got = torch.compile(fn, dynamic=dynamic,
                        backend=fxwrap.Backend(target, {"on_program": programs.append, "cache": False}))(xs, ys)
    for a, b in zip(xs, xs_ref):  # the in-place add
        torch.testing.assert_close(a, b)
    externs = [str(line.op) for p in programs for line in p.lines if type(line).__name__ == "CallExtern"]
    assert not externs, externs
    return got, expected, kernels(programs)
