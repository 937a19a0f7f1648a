"""User-written Triton kernels inside compiled functions: ``kernel[grid](...)`` and
``torch.library.triton_op`` + ``wrap_triton``, compiled with ``fullgraph=True`` for ``cuda`` on
a GPU, or for ``triton-interpret`` (CPU tensors, Triton's interpreter) without one.

Each launch is a ``CallUserKernel`` line and, in FX, a node whose target is an
``fxwrap.Kernel`` (no extern call of the higher-order op); the ``relu`` after it is an
fxwrap kernel.  Numbers are eager PyTorch's (the same math written with torch ops: on CPU
tensors the eager launch itself cannot run, Triton has no CPU driver).

Without a GPU dynamo does not turn Triton launches into graph nodes at all
(``torch.utils._triton.has_triton()`` is False: it asks for a GPU), so the fixture below tells
it a Triton device is present; the kernels are ``JITFunction``s (``TRITON_INTERPRET=1``
makes ``@triton.jit`` return an ``InterpretedFunction``, which dynamo does not trace).

    python -m pytest -q tests/cuda/test_user_triton_kernels.py
"""
from __future__ import annotations

import logging
import pickle

import pytest
import torch
import triton
import triton.language as tl
from torch._dynamo.exc import BackendCompilerFailed
from torch.library import triton_op, wrap_triton
from triton.runtime.jit import JITFunction

import fxwrap
from fxwrap.ir.user_kernels import CallUserKernel
from fxwrap.runtime.debug import NonFiniteValueError
from fxwrap.runtime.launch import UserTritonLaunch
from triton_helpers import DEVICE, GPU, TARGET_NAME


@pytest.fixture(autouse=True)
def dynamo_traces_triton_kernels(monkeypatch):
    """Without a GPU, tell dynamo a Triton device is present (it would not trace the launch),
    and quiet torch's warning that its mutation analysis (which needs a GPU) assumed every
    tensor argument written."""
    if not GPU:
        import torch.utils._triton
        monkeypatch.setattr(torch.utils._triton, "has_triton", lambda: True)
    logger = logging.getLogger("torch._higher_order_ops.triton_kernel_wrap")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _jit(fn):
    """``@triton.jit`` that makes a ``JITFunction`` under ``TRITON_INTERPRET=1`` too."""
    return JITFunction(fn)


@_jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@_jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask), mask=mask)


@_jit
def scale_in_place(x_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


@_jit
def _twice(value):
    return value * 2


@_jit
def twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, _twice(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, num_warps=1), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"])
@_jit
def autotuned_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@_jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2)
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@_jit
def autotuned_double(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) * 2)
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton_op("fxwrap_tests::user_add", mutates_args=())
def user_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(add_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


def add_then_relu(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return torch.relu(out)


def _compile(fn, dynamic=False, target=TARGET_NAME):
    programs = []
    compiled = torch.compile(fn, backend=fxwrap.Backend(target, {"on_program": programs.append}),
                             fullgraph=True, dynamic=dynamic)
    return compiled, programs


def _launches(program) -> list:
    return [n for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


def _user_launches(program) -> list:
    return [n for n in _launches(program) if isinstance(n.target.launch, UserTritonLaunch)]


def _rand(*shape):
    return torch.randn(*shape, device=DEVICE)


def _assert_structure(program, kernel_name: str):
    """One launch of the user kernel, as a Kernel node; no extern call of the higher-order op;
    and (the relu after it) at least one fxwrap kernel of its own."""
    user = _user_launches(program)
    assert [n.target.name for n in user] == [kernel_name]
    assert not [n for n in program.graph_module.graph.nodes
                if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert len(_launches(program)) > len(user)
    assert any(isinstance(line, CallUserKernel) for line in program.lines)
    assert f"{kernel_name}[" in program.code()


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_user_kernel_then_relu(dynamic):
    compiled, programs = _compile(add_then_relu, dynamic)
    for n in (100, 257):  # the second size: a new trace (static) or the same program (dynamic)
        x, y = _rand(n), _rand(n)
        torch.testing.assert_close(compiled(x, y), torch.relu(x + y))
    _assert_structure(programs[-1], "add_kernel")
    launch = _user_launches(programs[-1])[0]
    roles = {a.name: a.role for a in launch.target.signature}
    assert roles["out_ptr"] == "inout"
    if dynamic:
        assert len(programs) == 1
        assert "(s" in programs[0].code().split("add_kernel[")[1].split("]")[0]  # a symbolic grid


def test_user_kernel_mutates_an_input_in_place():
    def f(x, y):
        n = x.numel()
        scale_in_place[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, n, 3.0, BLOCK=32)
        return x + y

    compiled, programs = _compile(f)
    x, y = _rand(100), _rand(100)
    x0 = x.clone()
    got = compiled(x, y)
    torch.testing.assert_close(x, x0 * 3)
    torch.testing.assert_close(got, x0 * 3 + y)
    program = programs[0]
    (launch,) = _user_launches(program)
    assert [a.role for a in launch.target.signature if a.name == "x_ptr"] == ["inout"]
    # written in place: the input itself is the kernel's argument, with no clone and no copy back
    assert launch.args[0].op == "placeholder"
    assert len(_launches(program)) == 2 and "copy_" not in program.graph_module.code


def test_aliased_arguments_are_cloned():
    """The same tensor as input and output: each written argument is cloned (its clone is what
    the kernel writes), as the functional op says; the result is 2 * t.  (Without a GPU torch's
    mutation analysis cannot run and every argument counts as written.)"""
    def f(x):
        t = x * 1.5
        n = t.numel()
        add_kernel[(triton.cdiv(n, 64),)](t, t, t, n, BLOCK=64)
        return t + 1

    compiled, programs = _compile(f)
    x = _rand(130)
    torch.testing.assert_close(compiled(x), 2 * (x * 1.5) + 1)
    (launch,) = _user_launches(programs[0])
    roles = [a.role for a in launch.target.signature[:3]]
    names = [a.name for a in launch.args[:3]]
    assert roles[2] == "inout"
    for i, role in enumerate(roles):  # a written argument is a buffer of its own: a clone
        if role == "inout":
            assert names.count(names[i]) == 1, (roles, names)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_triton_op_with_wrap_triton(dynamic):
    def f(x, y):
        return torch.relu(user_add(x, y) * 2)

    compiled, programs = _compile(f, dynamic)
    for n in (96, 200):
        x, y = _rand(n), _rand(n)
        torch.testing.assert_close(compiled(x, y), torch.relu((x + y) * 2))
    _assert_structure(programs[-1], "add_kernel")


def test_autotuned_kernel():
    def f(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        autotuned_add[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
        return torch.relu(out)

    compiled, programs = _compile(f)
    x, y = _rand(300), _rand(300)
    torch.testing.assert_close(compiled(x, y), torch.relu(x + y))
    _assert_structure(programs[0], "autotuned_add")
    assert "autotuned_add[autotuned: (10, 1, 1), (3, 1, 1)]" in programs[0].code()


@pytest.mark.parametrize("n", [96, 100])
def test_heuristics(n):
    """``triton.heuristics`` alone (dynamo evaluates it: a constant of the launch) and under
    ``autotune`` (dynamo folds it into each config): EVEN is true for 96 and false for 100."""
    def f(x):
        out, out2 = torch.empty_like(x), torch.empty_like(x)
        size = x.numel()
        double_kernel[(triton.cdiv(size, 32),)](x, out, size, BLOCK=32)
        autotuned_double[lambda meta: (triton.cdiv(size, meta["BLOCK"]),)](x, out2, size)
        return out + 1, out2 - 1

    compiled, programs = _compile(f)
    x = _rand(n)
    got, got2 = compiled(x)
    torch.testing.assert_close(got, 2 * x + 1)
    torch.testing.assert_close(got2, 2 * x - 1)
    assert [n.target.name for n in _user_launches(programs[0])] == ["double_kernel", "autotuned_double"]
    assert f"EVEN={n % 32 == 0}" in programs[0].code()


def test_kernel_calling_another_jit_function():
    def f(x):
        out = torch.empty_like(x)
        twice_kernel[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), BLOCK=32)
        return out - 3

    compiled, _ = _compile(f)
    x = _rand(77)
    torch.testing.assert_close(compiled(x), 2 * x - 3)
    assert isinstance(_twice, JITFunction)  # the interpreted copy was only for the launch


def test_other_targets_say_what_to_do():
    x, y = torch.randn(64), torch.randn(64)
    for target in ("cpu", "reference"):
        torch._dynamo.reset()
        compiled, _ = _compile(add_then_relu, target=target)
        with pytest.raises(BackendCompilerFailed, match=rf"add_kernel .*cannot run on target '{target}'.*"
                                                        r"triton-interpret"):
            compiled(x, y)


def test_save_and_load(tmp_path):
    x, y = _rand(100), _rand(100)
    program = fxwrap.lower(add_then_relu, x, y, target=TARGET_NAME)
    path = tmp_path / "user_kernel.fxwrap"
    program.save(path)
    loaded = fxwrap.load(path)
    (launch,) = [k for k in loaded.kernels if isinstance(k.launch, UserTritonLaunch)]
    assert launch.loader.__name__ == "user_kernel_loader"  # imports the kernel again by name
    x2, y2 = _rand(100), _rand(100)
    torch.testing.assert_close(loaded.run(x2, y2), torch.relu(x2 + y2))
    torch.testing.assert_close(pickle.loads(pickle.dumps(program)).run(x2, y2), torch.relu(x2 + y2))


def _add_body(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


add_renamed = JITFunction(_add_body)  # module global add_renamed; its function is _add_body


def test_save_and_load_a_kernel_held_under_another_name(tmp_path):
    def f(x, y):
        out = torch.empty_like(x)
        add_renamed[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
        return out * 3

    x, y = _rand(100), _rand(100)
    program = fxwrap.lower(f, x, y, target=TARGET_NAME)
    (launch,) = [k for k in program.graph_module.graph.nodes if isinstance(k.target, fxwrap.Kernel)
                 and isinstance(k.target.launch, UserTritonLaunch)]
    assert launch.target.launch.qualname == "add_renamed"
    program.save(tmp_path / "renamed.fxwrap")
    loaded = fxwrap.load(tmp_path / "renamed.fxwrap")
    x2, y2 = _rand(100), _rand(100)
    torch.testing.assert_close(loaded.run(x2, y2), (x2 + y2) * 3)


def test_a_kernel_defined_in_a_function_cannot_be_saved(tmp_path):
    @_jit
    def local_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

    def f(x, y):
        out = torch.empty_like(x)
        local_add[(2,)](x, y, out, x.numel(), BLOCK=64)
        return out

    x, y = _rand(100), _rand(100)
    program = fxwrap.lower(f, x, y, target=TARGET_NAME)
    torch.testing.assert_close(program.run(x, y), x + y)
    with pytest.raises(RuntimeError, match="user Triton kernel local_add .*defined inside a function"):
        program.save(tmp_path / "local.fxwrap")


def test_program_cache_keys_on_the_kernel(tmp_path, monkeypatch):
    """Two graphs alike but for the kernel they launch: the side table's index (per process, here
    reset between them) is the same, the programs are not."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    monkeypatch.setenv("FXWRAP_PROGRAM_CACHE", "1")
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))

    def launcher(kernel):
        def f(x, y):
            out = torch.empty_like(x)
            kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
            return out
        return f

    x, y = _rand(100), _rand(100)
    saved = (dict(kernel_side_table.id_to_kernel), dict(kernel_side_table.kernel_to_id),
             dict(kernel_side_table.constant_args))
    try:
        for kernel, want in ((add_kernel, x + y), (sub_kernel, x - y)):
            kernel_side_table.reset_table()
            torch._dynamo.reset()
            compiled, _ = _compile(launcher(kernel))
            torch.testing.assert_close(compiled(x, y), want)
    finally:
        kernel_side_table.id_to_kernel, kernel_side_table.kernel_to_id, kernel_side_table.constant_args = saved


def test_values_computed_before_the_launch_keep_their_values():
    """``b`` is computed from the input ``x`` before the kernel overwrites ``x`` in place;
    fxwrap keeps ``b`` lazy (it would fuse into a later kernel), so it must be stored before
    the launch."""
    def f(x):
        b = x + 1
        n = x.numel()
        scale_in_place[(triton.cdiv(n, 32),)](x, n, -1.0, BLOCK=32)
        return b, x * 3

    compiled, _ = _compile(f)
    x = _rand(100)
    x0 = x.clone()
    got_b, got_x3 = compiled(x)
    torch.testing.assert_close(got_b, x0 + 1)
    torch.testing.assert_close(got_x3, -x0 * 3)
    torch.testing.assert_close(x, -x0)


def test_check_nan_sees_what_the_user_kernel_wrote():
    """The launch declares the tensors it writes: ``check_nan`` checks them after it and names it."""
    def f(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
        return torch.relu(out)

    programs = []
    compiled = torch.compile(f, backend=fxwrap.Backend(TARGET_NAME, {"on_program": programs.append,
                                                                      "check_nan": True}), fullgraph=True)
    x, y = _rand(100), _rand(100)
    torch.testing.assert_close(compiled(x, y), torch.relu(x + y))
    y[7] = float("nan")
    with pytest.raises(NonFiniteValueError) as info:
        compiled(x, y)
    # the user kernel is the launch that wrote the NaN (the relu after it would propagate it,
    # but the check stops at the first launch): one NaN value.  On a GPU that is out_ptr; under
    # the interpreter every tensor argument counts as written, so y_ptr's NaN is found first
    assert info.value.launch == "user Triton kernel add_kernel", info.value.launch
    assert (info.value.nan, info.value.inf) == (1, 0)
    assert str(info.value).startswith(f"fxwrap check_nan: user Triton kernel add_kernel (target {TARGET_NAME}) "
                                      "wrote 1 NaN into")


def test_mutation_form_without_functionalization():
    """An ATen graph traced without functionalization (``make_fx``) keeps
    ``triton_kernel_wrapper_mutation``: the launches write their arguments in place."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from fxwrap.api import compile_aten_graph
    from fxwrap.plugins.manager import get_plugin_manager

    def f(x, y):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(add_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
        wrap_triton(scale_in_place)[(triton.cdiv(n, 64),)](out, n, 2.0, BLOCK=64)
        return (torch.relu(out),)

    x, y = _rand(100), _rand(100)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    assert "triton_kernel_wrapper_mutation" in gm.code
    program = compile_aten_graph(gm, get_plugin_manager().target(TARGET_NAME), "inference", {"cache": False})
    torch.testing.assert_close(program.graph_module(x, y)[0], torch.relu(2 * (x + y)))
    add, scale = _user_launches(program)
    assert {a.name: a.role for a in add.target.signature}["out_ptr"] == "inout"
    assert {a.name: a.role for a in scale.target.signature}["x_ptr"] == "inout"
    assert add.args[2] is scale.args[0]  # the same buffer, written in place twice
