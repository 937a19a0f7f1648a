"""C++ target: fusion across lines, reduction prologues, vectorizable exp, and regressions
of the C++ emitter (symbolic sizes in reduction index math, run-time scalars, saved
expanded tensors).  Every test compares with eager on fresh random inputs."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallKernel


def compiled(fn, dynamic):
    programs: list = []
    c = torch.compile(fn, backend=fxwrap.Backend("cpu", {"on_program": programs.append}),
                      dynamic=dynamic, fullgraph=True)
    return c, programs


def kernels(programs) -> int:
    return sum(isinstance(n.target, fxwrap.Kernel)
               for p in programs for n in p.graph_module.graph.nodes if n.op == "call_function")


def sources(programs) -> list[str]:
    return [n.target.source for p in programs for n in p.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, fxwrap.Kernel)]


# ---------------------------------------------------------------- fusion / kernel counts
def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


@pytest.mark.parametrize("dynamic", [False, True])
def test_attention_one_kernel(dynamic):
    """max, sum and the normalizing epilogue are one kernel although views of ``v``
    (and its storage-offset read) sit between the reductions and the epilogue."""
    c, programs = compiled(attention, dynamic)
    for shape in [(3, 40, 16), (2, 33, 16)] if dynamic else [(3, 40, 16)]:
        q, k, v = (torch.randn(*shape) for _ in range(3))
        torch.testing.assert_close(c(q, k, v), attention(q, k, v))
    assert kernels(programs[:1]) == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_mlp_training_step_prologue_fusion(dynamic):
    """Forward: GELU, MSE loss.  Backward: each bias gradient (a column sum) is one kernel
    with the pointwise gradient it sums (prologue), across the mm extern between them."""
    model = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 24))

    def step(x, t):
        return F.mse_loss(model(x), t)

    c, programs = compiled(step, dynamic)
    for n in (16, 11) if dynamic else (16,):
        x, t = torch.randn(n, 24), torch.randn(n, 24)
        model.zero_grad()
        ref = step(x, t)
        ref.backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        got = c(x, t)
        got.backward()
        torch.testing.assert_close(got, ref)
        for g, w in zip([p.grad for p in model.parameters()], want):
            torch.testing.assert_close(g, w)
    # forward 2 + backward 2 (Inductor: 4); dynamic: + the host scalar 1/numel of the mean
    assert kernels(programs[:2]) == (5 if dynamic else 4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_pointwise_then_row_sum_one_kernel(dynamic):
    """A stored pointwise result and a reduction over it: one kernel, both outputs right."""
    def fn(x, y):
        h = torch.tanh(x) * y
        return h, h.sum(-1)

    c, programs = compiled(fn, dynamic)
    for shape in [(9, 70), (5, 130)] if dynamic else [(9, 70)]:
        x, y = torch.randn(*shape), torch.randn(*shape)
        got, want = c(x, y), fn(x, y)
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert kernels(programs[:1]) == 1


def test_hoist_blocked_by_mutation():
    """A job may not move up, into the group before it, over an extern that writes what
    it reads (scheduler-level: after functionalization no compiled graph of plain
    PyTorch code puts an in-place extern between two jobs)."""
    from fxwrap.ir.loops import Store, xvar
    from fxwrap.core.scheduler import Job, fuse
    from fxwrap.ir.lines import CallExtern
    from shared_helpers import buf, ld

    x, y = buf("x", (8,)), buf("y", (8,))
    i = xvar(0)
    first = Job((8,), stores=[Store("a", i, ld("x", i))])
    bump = CallExtern(torch.ops.aten.add_.Tensor, (y, x))  # writes y in place
    reads_y = Job((8,), stores=[Store("b", i, ld("y", i))])
    reads_x = Job((8,), stores=[Store("b", i, ld("x", i))])  # reads nothing the extern writes
    kinds = lambda items: [type(item).__name__ for item in items]  # noqa: E731
    assert kinds(fuse([first, bump, reads_x])) == ["Group", "CallExtern"]  # hoisted: one group
    blocked = fuse([first, bump, reads_y])
    assert kinds(blocked) == ["Group", "CallExtern", "Group"]  # stays after the write
    assert [st.buffer for st in blocked[0].stores] == ["a"] and [st.buffer for st in blocked[2].stores] == ["b"]


def test_input_mutation_between_reductions_matches_eager():
    def fn(x, y):
        m = x.amax(-1, keepdim=True)
        y.add_(1.0)                      # in-place on a graph input between the two jobs
        return torch.exp(x - m) * y

    x, y = torch.randn(6, 20), torch.randn(6, 20)
    y1, y2 = y.clone(), y.clone()
    c, _ = compiled(fn, False)
    torch.testing.assert_close(c(x, y1), fn(x, y2))
    torch.testing.assert_close(y1, y2)


# ---------------------------------------------------------------- vectorizable exp
def test_exp_float32_matches_eager_and_special_values():
    x = torch.cat([torch.randn(20000) * 30, torch.linspace(-110.0, 95.0, 20001),
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 88.72, 88.73,
                                 -87.3, -103.9, -104.0, -150.0, 1e-30, -1e-30])])
    x = x[torch.randperm(x.numel())]
    c, programs = compiled(lambda t: (torch.exp(t), torch.sigmoid(t)), False)
    e, s = c(x)
    torch.testing.assert_close(e, torch.exp(x), equal_nan=True)
    torch.testing.assert_close(s, torch.sigmoid(x), equal_nan=True)
    assert torch.equal(torch.isinf(e), torch.isinf(torch.exp(x)))
    assert torch.equal(e == 0, torch.exp(x) == 0)
    assert "fx_exp(" in sources(programs)[0]


def test_erf_gelu_float32_matches_eager_and_special_values():
    x = torch.cat([torch.randn(20000) * 2, torch.linspace(-6.0, 6.0, 20001),
                   torch.logspace(-30, 0, 500), -torch.logspace(-30, 0, 500),
                   torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0,
                                 3.92, -3.9199])])
    x = x[torch.randperm(x.numel())]
    c, programs = compiled(lambda t: (torch.erf(t), F.gelu(t)), False)
    e, g = c(x)
    torch.testing.assert_close(e, torch.erf(x), equal_nan=True)
    finite = torch.isfinite(x)  # gelu(-inf): the lowering's x * (1 + erf) gives nan, eager 0
    torch.testing.assert_close(g[finite], F.gelu(x)[finite])
    assert torch.equal(torch.signbit(e), torch.signbit(torch.erf(x)))
    assert "fx_erf(" in sources(programs)[0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_exp_other_dtypes(dtype):
    x = (torch.randn(300, 17) * 8).to(dtype)
    c, _ = compiled(lambda t: torch.exp(t) - 1, False)
    torch.testing.assert_close(c(x), torch.exp(x) - 1)


# ---------------------------------------------------------------- emitter regressions
def sliced_sum(x):
    return x[:, :, 1:].sum((1, 2))


def sliced_sum_outer(x):
    return x[:, 1:, 1:].sum((0, 1))


def cat_sum(x):
    return torch.cat([x, x], 2).sum((1, 2))


@pytest.mark.parametrize("fn", [sliced_sum, sliced_sum_outer, cat_sum])
def test_dynamic_multi_dim_reduction_compound_sizes(fn):
    """The last reduced range is ``s - 1`` or ``2*s``: the r-segment decomposition must
    divide by the whole size (it printed ``rbase % s2 - 1``)."""
    c, _ = compiled(fn, True)
    for shape in [(4, 5, 6), (3, 7, 9), (2, 3, 300), (5, 2, 4000), (70, 3, 5)]:
        x = torch.randn(*shape, dtype=torch.float64)
        torch.testing.assert_close(c(x), fn(x))


@pytest.mark.parametrize("dynamic", [False, True])
def test_run_time_scalar_in_pointwise(dynamic):
    """An ``.item()`` value used as a scalar operand: the op runs as an extern, numbers right."""
    def fn(x, y):
        return torch.where(x > 0, x, y.item()) * 2

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        c, _ = compiled(fn, dynamic)
        for shape in [(4, 5), (7, 3)] if dynamic else [(4, 5)]:
            x, y = torch.randn(*shape), torch.randn(())
            torch.testing.assert_close(c(x, y), fn(x, y))


@pytest.mark.parametrize("dynamic", [False, True])
def test_normalize_gradient(dynamic):
    """The forward saves ``expand(clamp_min(norm))`` (stride 0); the backward was traced
    against that layout, so the saved tensor must keep it (it came back contiguous)."""
    def fn(x):
        return F.normalize(x, dim=-1)

    c = torch.compile(fn, backend=fxwrap.Backend("cpu"), dynamic=dynamic)
    for shape in [(5, 7), (6, 9)] if dynamic else [(5, 7)]:
        x = torch.randn(*shape, requires_grad=True)
        g = torch.randn(*shape)
        got = c(x)
        (gx,) = torch.autograd.grad(got, x, g)
        want = fn(x)
        (wx,) = torch.autograd.grad(want, x, g)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(gx, wx)


# ---------------------------------------------------------------- softmax: exp computed once
@pytest.mark.parametrize("dynamic", [False, True])
def test_softmax_exp_stashed_in_output(dynamic):
    """The sum pass stores ``exp(x - max)`` into the output, the epilogue divides it in
    place: one exp per element (lane loop + tail loop: two in the source)."""
    def fn(x):
        return torch.softmax(x, dim=-1)

    c, programs = compiled(fn, dynamic)
    shapes = [(7, 1), (5, 15), (9, 17), (3, 4097), (2, 20000)] if dynamic else [(9, 33)]
    for shape in shapes:
        x = torch.randn(*shape) * 4
        torch.testing.assert_close(c(x), fn(x))
    if not dynamic:
        src = sources(programs)[0]
        assert src.count("fx_exp(tmp") == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_softmax_stash_dtypes(dtype):
    """float64 stashes (exact), bf16 does not (the output would round the stored exp)."""
    x = (torch.randn(6, 45) * 3).to(dtype)
    c, _ = compiled(lambda t: (torch.softmax(t, -1), torch.log_softmax(t, -1)), False)
    got = c(x)
    torch.testing.assert_close(got[0], torch.softmax(x, -1))
    if dtype == torch.float64:
        torch.testing.assert_close(got[1], torch.log_softmax(x, -1))
    else:
        # bf16 log_softmax: values near 0 come from a cancellation (x - max - logsumexp), so
        # eager and fxwrap round them apart; fxwrap must be as close to float64 as eager
        exact = torch.log_softmax(x.double(), -1)
        fx_err = (got[1].double() - exact).abs().max().item()
        eager_err = (torch.log_softmax(x, -1).double() - exact).abs().max().item()
        assert fx_err <= eager_err + 2 ** -9, (fx_err, eager_err)


def test_softmax_in_place_into_input():
    """``x.copy_(softmax(x) + x)``: the output is the input, so the sum pass must not
    store its exp there early (the epilogue still reads ``x``)."""
    def fn(x):
        return x.copy_(torch.softmax(x, dim=-1) + x)

    x = torch.randn(7, 50)
    x1, x2 = x.clone(), x.clone()
    c, _ = compiled(fn, False)
    c(x1)
    fn(x2)
    torch.testing.assert_close(x1, x2)


@pytest.mark.parametrize("exponent", [2, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_square_and_cube_are_multiplies_and_match_eager_bitwise(dtype, exponent):
    """``x.pow(2)`` (RMSNorm's mean of squares) renders as ``x * x`` and ``x.pow(3.0)`` (a
    written-out tanh GELU) as ``(x * x) * x``, as eager's pow kernels compute them: no pow
    call, and eager's numbers (bit-exact in float32/float64; bf16: eager's CPU cube rounds
    its products to bf16, fxwrap rounds once, so it is closer to the exact cube)."""
    x = torch.randn(257, 33, dtype=dtype) * 3
    program = fxwrap.lower(lambda t: t.pow(exponent) + 1, x)
    (kernel,) = [line.kernel for line in program.lines if isinstance(line, CallKernel)]
    assert "pow" not in kernel.source.split("extern \"C\"")[1]
    y = torch.randn(257, 33, dtype=dtype) * 3
    got, want = program.graph_module(y)[0], y.pow(exponent) + 1
    if dtype == torch.bfloat16 and exponent == 3.0:
        exact = y.double().pow(3) + 1
        assert ((got.double() - exact).abs() <= (want.double() - exact).abs() + 2 ** -7 * exact.abs()).all()
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_zero_and_negative_zero_constants_stay_two_values():
    """``0.0 == -0.0`` in Python, but one fused kernel must not share them: ``x - -0.0``
    at ``x = -0.0`` is ``+0.0`` (it was ``-0.0`` when the constants were merged)."""
    def fn(x):
        return x * 0.0, x - -0.0

    c, programs = compiled(fn, False)
    x = torch.tensor([-0.0, 1.5, -2.0])
    got = c(x)
    assert kernels(programs) == 1
    for g, w in zip(got, fn(x)):
        torch.testing.assert_close(g, w)
        assert torch.equal(torch.signbit(g), torch.signbit(w))


# ---------------------------------------------------------------- shared lazy values
def _kernel_reads(programs) -> list[int]:
    """For each kernel launch, how many distinct inputs it reads."""
    counts = []
    for p in programs:
        for n in p.graph_module.graph.nodes:
            if n.op == "call_function" and isinstance(n.target, fxwrap.Kernel):
                counts.append(sum(a.role == "input" for a in n.target.signature))
    return counts


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("dynamic", [False, True])
def test_residual_stream_is_stored_not_recomputed(dynamic):
    """``x = x + f(norm(x))`` over many layers: the residual sum is stored once its
    inlined form reads many buffers, so no kernel re-reads every earlier layer's output
    (before: the last norm read all ``layers + 1`` terms); the normalizing epilogue stays
    in the kernel that stores the residual."""
    layers = 8
    ws = [torch.randn(32, 32) / 6 for _ in range(layers)]
    gains = [torch.rand(32) + 0.5 for _ in range(layers)]

    def net(x):
        for w, g in zip(ws, gains):
            x = x + _rms(x, g) @ w
        return _rms(x, gains[0])

    c, programs = compiled(net, dynamic)
    for rows in (24, 17) if dynamic else (24,):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(c(x), net(x), rtol=1e-4, atol=1e-4)
    reads = _kernel_reads(programs[:1])
    assert max(reads) <= 7, reads  # 5 shared terms + the gain + one stored value at most
    assert len(reads) <= layers + 1, reads  # one norm kernel per layer + the last


def test_view_chain_of_a_stored_value_is_a_view():
    """Rotary embedding's ``stack(...).flatten(-2).transpose(1, 2)`` read by an extern
    (SDPA): the stacked values are stored once, in the stack's layout, and the
    transposed flatten is a view of that storage (before: a second kernel stored the
    same values again in the transposed layout)."""
    def rotate(q, cos, sin):
        x1, x2 = q[..., ::2], q[..., 1::2]
        s = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).transpose(1, 2)
        return F.scaled_dot_product_attention(s, s, s)

    c, programs = compiled(rotate, False)
    q, cos, sin = torch.randn(2, 8, 3, 8), torch.randn(8, 1, 4), torch.randn(8, 1, 4)
    torch.testing.assert_close(c(q, cos, sin), rotate(q, cos, sin), rtol=1e-5, atol=1e-5)
    assert kernels(programs[:1]) == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_norm_backward_epilogue_joins_across_a_view_of_a_saved_activation(dynamic):
    """RMSNorm's backward: the input gradient is a row reduction and an epilogue that
    reads the saved ``rsqrt`` through a view emitted after the reduction.  The view
    (metadata only) moves above the reduction so the epilogue joins it: two kernels
    (the weight gradient's column sum, and the row reduction with its epilogue)."""
    weight = torch.nn.Parameter(torch.rand(32) + 0.5)

    def step(x, g):
        y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight
        return (y * g).sum()

    c, programs = compiled(step, dynamic)
    for rows in (16, 13) if dynamic else (16,):
        x, g = torch.randn(4, rows, 32), torch.randn(4, rows, 32)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        c(xa, g).backward()
        got_w, weight.grad = weight.grad, None
        step(xb, g).backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got_w, weight.grad, rtol=1e-4, atol=1e-5)
        weight.grad = None
    backward = [p for p in programs if p.kind == "backward"]
    assert backward and all(kernels([p]) == 2 for p in backward), [kernels([p]) for p in backward]
