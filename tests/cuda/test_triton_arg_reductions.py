"""Arg-reductions on the Triton target: ``argmax``/``argmin`` and ``max``/``min`` over a dim
(values and indices) give eager's numbers (the FIRST index of the best value, a NaN is the
best, the first NaN wins) in every plan, and cost a plain max's reads: one kernel, lanes
that keep an index in the plan's index dtype, no (value, index) pair combine on every
element, the split plans for few long rows and for columns.

Numbers run on the target under test (``triton-interpret`` here, ``cuda`` on a GPU); the
structure of the GPU's kernels is read from ``cuda-offline`` renders (never run), at the
sizes the issue names (logits of a batch, GPT-2's and Llama 3's vocabularies).
"""
from __future__ import annotations

import pytest
import torch

import fxwrap

from fxwrap.testing.offline_cuda import offline_programs
from offline_sass import row_loop_instructions, instructions, sm90_sass, unavailable
from triton_helpers import DEVICE, GPU, check, compiled, kernels

# (shape, the plans its kernels take on the target under test): under the interpreter,
# persistent up to 64 elements a row, looped beyond; a row split for at most 4 rows of 128 or
# more, a column split for 128 or more rows (tiling.Planner); on the GPU the plans differ
ROW_SHAPES = [((6, 37), {"persistent"}), ((5, 301), {"looped", "persistent"}),
              ((3, 1000), {"split-outer"}), ((70, 9), {"persistent"}), ((2, 700), {"split-outer"}),
              ((300, 5), {"persistent", "split-outer"})]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def special_rows(shape, dtype):
    """Integers 0-3 (ties everywhere) with, where there are rows enough: two NaNs in row 1
    (the first must win), every element -inf in row 2, +inf in row 3, and -inf/+inf mixed
    with numbers in row 4."""
    rows, cols = shape
    x = torch.randint(0, 4, shape, device=DEVICE).to(dtype)
    if rows > 1:
        x[1, cols // 3] = float("nan")
        x[1, cols - 1] = float("nan")
    if rows > 2:
        x[2] = float("-inf")
    if rows > 3:
        x[3] = float("inf")
    if rows > 4:
        x[4, ::2] = float("-inf")
        x[4, 1::3] = float("inf")
    return x


def arg_ops(x):
    return (x.argmax(-1), x.argmin(-1), *x.max(-1), *x.min(1), x.argmax(0), x.argmin(0), *x.max(0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,plans", ROW_SHAPES, ids=lambda v: str(sorted(v)) if isinstance(v, set) else str(v))
def test_arg_reductions_are_eagers_first_index(shape, plans, dtype):
    x = special_rows(shape, dtype)
    ks = check(arg_ops, (x,), tol=dict(rtol=0, atol=0))
    if not GPU:
        assert plans <= {k.launch.plan for k in ks}
    y = special_rows(shape, dtype).t()  # rows and columns swap their strides
    check(lambda y: (y.argmax(1), y.argmin(0), *y.max(1)), (y,), tol=dict(rtol=0, atol=0))


@pytest.mark.parametrize("shape", [(4, 50), (2, 300), (3, 1000)], ids=str)
def test_random_rows_match_eager(shape):
    x = torch.randn(shape, device=DEVICE)
    check(lambda x: (x.argmax(-1), *x.max(-1), x.argmin(0)), (x,), tol=dict(rtol=0, atol=0))
    check(lambda x: (x.argmax(-1), *x.max(-1)), (x,), dynamic=True, tol=dict(rtol=0, atol=0))


def test_integer_and_three_dim_arg_reductions():
    x = torch.randint(-5, 5, (3, 40, 7), device=DEVICE, dtype=torch.int32)
    check(lambda x: (x.argmax(1), x.argmin(-1), *x.max(1), x.argmax(0)), (x,), tol=dict(rtol=0, atol=0))


def test_sampling_epilogue_max_of_softmax():
    """``torch.max(probs, dim=1)`` after a softmax with a temperature: numbers, and the
    values and indices come from the kernels (no ATen ``max.dim`` call)."""
    x = torch.randn(4, 301, device=DEVICE)
    fn = lambda x: torch.max(torch.softmax(x / 0.7, -1), dim=1)  # noqa: E731
    torch._dynamo.reset()
    f, programs = compiled(fn)
    for got, want in zip(f(x), fn(x)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (program,) = programs
    assert _externs(program) == []


@pytest.mark.parametrize("fn", [lambda x: x.max(-1).values * 2, lambda x: x.min(0).values],
                         ids=["max_values", "min_values"])
def test_values_only_compute_no_indices(fn):
    """Where only the values of ``x.max(dim)`` are used, the kernel reduces a plain max: the
    arg-reduction, whose index nothing stores, is dropped (``scheduler.read_reductions``)."""
    x = special_rows((6, 301), torch.float32)
    ks = check(fn, (x,), tol=dict(rtol=0, atol=0))
    reductions = [ln for k in ks for ln in k.source.splitlines() if ln.startswith("# reduction acc")]
    assert reductions and not any(": arg" in ln for ln in reductions), reductions


def _externs(program) -> list[str]:
    return [str(n.target) for n in program.graph_module.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def _kernels(program):
    return kernels([program])


@pytest.mark.parametrize("fn", [lambda x: x.argmax(-1), lambda x: x.max(-1), lambda x: x.min(-1)],
                         ids=["argmax", "max_dim", "min_dim"])
def test_max_over_a_dim_is_one_kernel_on_the_target(fn):
    """Values and indices of ``x.max(-1)`` come from one kernel: no ATen ``max.dim`` extern."""
    x = torch.randn(16, 301, device=DEVICE)
    torch._dynamo.reset()
    f, programs = compiled(fn)
    got, want = f(x), fn(x)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    (program,) = programs
    assert _externs(program) == []
    assert len(_kernels(program)) == 1


def test_the_cpu_target_keeps_atens_max_dim():
    """``x.max(dim)`` is one kernel only on targets that opt in (the Triton ones: the rule is not
    a default): on the C++ target the values and indices stay ATen's ``max.dim``, 2.7x faster
    at one thread than the C++ kernel's max and argmax of a 2048x4096 float32 (56 vs 21 ms)."""
    x = torch.randn(16, 301)
    programs = []
    torch._dynamo.reset()
    f = torch.compile(lambda x: x.max(-1), backend=fxwrap.Backend("cpu", {"on_program": programs.append}))
    for got, want in zip(f(x), x.max(-1)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    (program,) = programs
    assert _externs(program) == ["aten.max.dim_max"] and _kernels(program) == []


# -- the GPU's kernels (rendered offline) ------------------------------------------------------

def _gpu_kernels(fn, *inputs):
    (program,) = offline_programs(fn, *inputs)
    assert _externs(program) == []
    return _kernels(program)


@pytest.mark.parametrize("shape,dtype,plan", [
    ((4096, 32000), torch.bfloat16, "looped"),   # logits of a batch of 4096 tokens
    ((8192, 1024), torch.float32, "persistent"),
    ((32, 50257), torch.float32, "looped"),      # GPT-2's vocabulary, 32 rows
    ((1, 128256), torch.float32, "split-outer"),  # Llama 3's vocabulary, one row: split
], ids=str)
def test_gpu_argmax_over_rows_is_a_plain_max_with_lane_indices(shape, dtype, plan):
    """One kernel whose per-element work is a strictly-better test and two selects on
    int32 lane indices; the lanes finished by a NaN-propagating max and an index ``tl.min``;
    no (value, index) pair reduced anywhere (the old form combined pairs of int64 indices on
    every element)."""
    x = torch.empty(shape, dtype=dtype)
    for fn in (lambda x: x.argmax(-1), lambda x: x.max(-1)):
        (k,) = _gpu_kernels(fn, x)
        assert k.launch.plan == plan, k.launch.plan
        src = k.source
        assert "tl.reduce((" not in src and "_fx_argmax" not in src  # no pair combine
        assert "tl.min(tl.where((_red" in src and "2147483647" in src  # least index holding the max
        assert "rindex.to(tl.int64)" not in src and "tl.full([XBLOCK, RBLOCK], 0, tl.int64)" not in src
        if plan == "persistent":
            assert "for roffset" not in src
        else:
            body = src.split("for roffset", 1)[1].split("\n    _red", 1)[0]
            assert "_take = xrmask & (" in body and "~(tmp" in body and "tl.int64" not in body
            assert "tl.full([XBLOCK, RBLOCK], 0, tl.int32)" in src
        if plan == "split-outer":  # partials: (int32 first index, value) per chunk
            assert "torch.int32" in k.launch.workspace_dtypes


@pytest.mark.parametrize("shape", [(6, 37), (5, 301)], ids=str)
def test_softmax_and_argmax_share_the_row_max(shape):
    """A softmax's row max and an argmax of the same rows are one reduction (the softmax reads
    the argmax lanes' max): numbers with NaNs, ties and infinite rows."""
    x = special_rows(shape, torch.bfloat16)
    check(lambda x: (torch.softmax(x, -1), x.argmax(-1), *x.max(-1)), (x,), tol=dict(rtol=0, atol=0))


@pytest.mark.parametrize("fn,shape", [
    (lambda x: x.max(-1), (4096, 32000)),
    (lambda x: (torch.softmax(x, -1), x.argmax(-1)), (4096, 32000)),
    (lambda x: x.max(-1), (1, 128256)),  # split: the max's partials are the argmax's
], ids=["max_dim", "softmax_argmax", "max_dim_split"])
def test_gpu_max_values_come_from_the_argmax_lanes(fn, shape):
    """``x.max(-1)``'s values (and a softmax's max beside an argmax) are the argmax lanes' max:
    one reduction of the row's values, not a plain max accumulated beside the argmax."""
    (k,) = _gpu_kernels(fn, torch.empty(shape, dtype=torch.bfloat16))
    src = k.source
    assert src.count("_take = ") == 1 and "_fx_max(_red" not in src
    if k.launch.plan != "split-outer":
        assert src.count("tl.reduce(") == 1


def test_gpu_column_argmax_splits_like_a_column_max():
    """``x.argmax(0)`` of few columns and many rows takes the split-outer plan a column
    ``amax`` takes (before, arg-reductions were never split: one program per column tile)."""
    x = torch.empty(8192, 64)
    (amax,) = _gpu_kernels(lambda x: x.amax(0), x)
    (argmax,) = _gpu_kernels(lambda x: x.argmax(0), x)
    assert amax.launch.plan == argmax.launch.plan == "split-outer"
    assert argmax.launch.nsplit == amax.launch.nsplit


SASS_MISSING = unavailable()


@pytest.mark.skipif(SASS_MISSING is not None, reason=str(SASS_MISSING))
@pytest.mark.parametrize("shape,dtype,budget", [
    ((4096, 32000), torch.bfloat16, 1.1),  # looped, 16-byte loads
    ((32, 50257), torch.float32, 1.1),     # looped, odd rows: scalar loads
    ((8192, 1024), torch.float32, 1.5),    # persistent: the max's tree, then the index's
], ids=str)
def test_gpu_argmax_executes_about_what_a_row_max_does(shape, dtype, budget):
    """The sm_90 machine code (compiled offline): a step of argmax's (and ``max(dim)``'s) row
    loop is at most ``budget`` times a row amax's; a persistent kernel's whole body too.  The
    pair combine with int64 indices took 148 instructions a step against amax's 67 (bf16 logits),
    181 against 121 (fp32, odd rows), and 240 against 128 for a persistent row of 1024."""
    x = torch.empty(shape, dtype=dtype)
    cost = {}
    for name, fn in (("amax", lambda x: x.amax(-1)), ("argmax", lambda x: x.argmax(-1)),
                     ("max_dim", lambda x: x.max(-1))):
        (k,) = _gpu_kernels(fn, x)
        sass = sm90_sass(k)
        cost[name] = row_loop_instructions(sass) if k.launch.plan == "looped" else len(instructions(sass))
    assert cost["argmax"] <= budget * cost["amax"] and cost["max_dim"] <= budget * cost["amax"], cost


@pytest.mark.skipif(not GPU, reason="times kernels on a CUDA GPU (the interpreter's times mean nothing)")
def test_gpu_argmax_runs_near_a_row_max():
    """On the GPU, argmax over the rows of bf16 logits takes at most 1.3x a row amax's time
    (the same bytes read)."""
    x = torch.randn(4096, 32000, device="cuda", dtype=torch.bfloat16)
    am, _ = compiled(lambda x: x.argmax(-1))
    mx, _ = compiled(lambda x: x.amax(-1))
    torch.testing.assert_close(am(x), x.argmax(-1), rtol=0, atol=0)

    def time(f):
        for _ in range(3):
            f(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            f(x)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 50
    t_arg, t_max = time(am), time(mx)
    assert t_arg <= 1.3 * t_max, (t_arg, t_max)
