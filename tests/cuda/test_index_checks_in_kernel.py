"""Index bounds checked inside the Triton kernels (``capabilities()["index_checks"] ==
"in_kernel"``): an embedding, a gather and ``x[idx]`` (negative indices wrap) compile to
kernels that pass every index value through ``_fx_index_check`` (``tl.device_assert``,
the kernel compiled with ``debug``), with no ``check_index_bounds`` extern (five ATen
calls on the GPU) before them, and give eager's numbers.  On the GPU an index out of
range fails the stream with a device-side assert, as eager does (in a subprocess: the
assert poisons the CUDA context).  Without a GPU the same lowering runs on
``triton-interpret`` with the capability switched on (the interpreter drops the assert
itself: structure and numbers only), and the capability off keeps the extern.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fxwrap
from fxwrap.plugins.session import CompileSession
from fxwrap.runtime.checks import check_index_bounds
from fxwrap.ir.lines import CallExtern, CallKernel

pytest.importorskip("triton")
CUDA = torch.cuda.is_available()
TARGET = "cuda" if CUDA else "triton-interpret"
DEVICE = "cuda" if CUDA else "cpu"


def indexing(w, tokens, x, idx, rows):
    emb = torch.nn.functional.embedding(tokens, w) * 2           # lazy consumer of the gather
    pos = torch.nn.functional.embedding(torch.arange(tokens.shape[1], device=w.device), w)  # lazy index
    return emb + pos, torch.gather(x, 1, idx), x[rows] + 1        # rows: negative values wrap


def make_inputs(gen):
    w = torch.randn(50, 16, generator=gen)
    tokens = torch.randint(0, 50, (3, 7), generator=gen)
    x = torch.randn(9, 12, generator=gen)
    idx = torch.randint(0, 12, (9, 5), generator=gen)
    rows = torch.randint(-9, 9, (6,), generator=gen)
    return [t.to(DEVICE) for t in (w, tokens, x, idx, rows)]


@pytest.fixture
def in_kernel(monkeypatch):
    """The session's capabilities with in-kernel index checks (what a CUDA device says)."""
    if CUDA:
        return
    original = CompileSession.capabilities

    def capabilities(self):
        return dataclasses.replace(original.fget(self), index_checks="in_kernel")
    monkeypatch.setattr(CompileSession, "capabilities", property(capabilities))


def _check_externs(program):
    return [ln for ln in program.lines if isinstance(ln, CallExtern) and ln.op is check_index_bounds]


def test_index_values_are_checked_inside_the_kernels(in_kernel):
    args = make_inputs(torch.Generator().manual_seed(0))
    program = fxwrap.lower(indexing, *args, target=TARGET)
    for got, want in zip(program.run(*args), indexing(*args)):
        torch.testing.assert_close(got, want)
    assert not _check_externs(program)
    launches = [ln for ln in program.lines if isinstance(ln, CallKernel)]
    checked = [ln for ln in launches if "_fx_index_check(" in ln.kernel.source]
    assert checked and all(("debug", True) in ln.kernel.launch.config for ln in checked)
    # three index tensors, each checked where it is read: tokens, idx, rows (the lazy arange's
    # values are proven in range from its index expression: no check, core.rules.indexing._proven)
    calls = sum(ln.kernel.source.count("_fx_index_check(") for ln in launches)
    assert calls == 3 + len(checked)  # each kernel also defines the helper once
    # the positions' arange stays lazy: no kernel of its own stores it
    assert len(launches) <= 3


def test_without_the_capability_the_extern_checks_on_the_host():
    if CUDA:
        pytest.skip("the CUDA device declares in-kernel checks")
    args = make_inputs(torch.Generator().manual_seed(1))
    program = fxwrap.lower(indexing, *args, target=TARGET)
    assert len(_check_externs(program)) == 3  # tokens, idx, rows: the arange is proven in range
    bad = list(args)
    bad[1] = bad[1].clone()
    bad[1][1, 2] = 50
    with pytest.raises(IndexError, match="out of bounds"):
        program.run(*bad)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: the device-side assert of a compiled kernel")
@pytest.mark.parametrize("case", ["embedding_too_big", "gather_negative", "index_below_minus_size"])
def test_an_index_out_of_range_fails_the_stream_like_eager(case):
    script = textwrap.dedent(f"""
        import torch, fxwrap
        w, x = torch.randn(50, 16, device="cuda"), torch.randn(9, 12, device="cuda")
        tokens = torch.randint(0, 50, (3, 7), device="cuda")
        idx = torch.randint(0, 12, (9, 5), device="cuda")
        rows = torch.randint(-9, 9, (6,), device="cuda")
        fns = {{"embedding_too_big": lambda t: torch.nn.functional.embedding(t, w) * 2,
               "gather_negative": lambda i: torch.gather(x, 1, i) + 1,
               "index_below_minus_size": lambda r: x[r] + 1}}
        good = {{"embedding_too_big": tokens, "gather_negative": idx, "index_below_minus_size": rows}}
        case = {case!r}
        fn, arg = fns[case], good[case]
        f = torch.compile(fn, backend="fxwrap")
        torch.testing.assert_close(f(arg), fn(arg))
        bad = arg.clone()
        bad.view(-1)[3] = {{"embedding_too_big": 50, "gather_negative": -1, "index_below_minus_size": -10}}[case]
        try:
            f(bad)
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("ASSERTED", "device-side assert" in str(e))
        else:
            print("NO ERROR")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "ASSERTED True" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]


def _unpool(x, i):
    return torch.nn.functional.max_unpool1d(x, i, 3, 2, 1, (6,))


def test_lanes_past_the_end_do_not_fire_the_check(in_kernel):
    """max_unpool1d's flat index adds each row's offset (an arange) to the index: lanes past
    the last element computed an offset past the plane, and the assert fired on the H200
    where eager returns a result (OpInfo bf16 sweep), killing the CUDA context.  The check is
    made in the lanes that hold elements only: ``_fx_index_check(v, low, high, xmask)``."""
    x = torch.randn(2, 3, 3).to(DEVICE)
    i = torch.tensor([0, 3, 5]).repeat(2, 3, 1).to(DEVICE)
    program = fxwrap.lower(_unpool, x, i, target=TARGET)
    torch.testing.assert_close(program.run(x, i), _unpool(x, i))
    sources = [ln.kernel.source for ln in program.lines if isinstance(ln, CallKernel)]
    calls = [line for s in sources for line in s.splitlines() if "_fx_index_check(" in line and "def " not in line]
    assert calls and all(line.rstrip(")").rstrip().endswith("xmask") or ", xmask)" in line for line in calls), calls


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device: the device-side assert of a compiled kernel")
def test_max_unpool1d_opinfo_samples_match_eager_without_a_device_assert():
    script = textwrap.dedent("""
        import torch, fxwrap
        from torch.testing._internal.common_methods_invocations import op_db
        op = [o for o in op_db if o.name == "nn.functional.max_unpool1d"][0]
        for dtype in (torch.bfloat16, torch.float32):
            for s in op.sample_inputs("cuda", dtype):
                fn = lambda inp, *args: op.op(inp, *args, **s.kwargs)
                got = torch.compile(fn, backend="fxwrap")(s.input, *s.args)
                torch.testing.assert_close(got, fn(s.input, *s.args))
                torch._dynamo.reset()
        torch.cuda.synchronize()
        print("ALL MATCH")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "ALL MATCH" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
