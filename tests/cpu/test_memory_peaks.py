"""The memory plan of small programs, in exact bytes (issue 30: a plan that never peaks
above Inductor's).  Each test compiles for the C++ target, checks the numbers against
eager, and asserts the planned peak (``program.peak_bytes``) and the storage hand-overs
that give it.

MLP hidden layer: ``linear`` on a (2, 32, 64) input is an ``addmm`` extern on the
(64, 256) view; the GELU kernel reads its result reshaped to (2, 32, 256) and writes its
own output over it (in place), so one 64 KiB hidden buffer is live, not two::

    aten.addmm.out(arg1, buf1, buf2, out=buf3)              # (64, 256)
    buf5 = as_strided(buf3, (2, 32, 256), (8192, 256, 1), 0)  # reuse (in place)
    fxwrap_pointwise_0(buf4, buf5)                           # buf4: buf3 as (2, 32, 256)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, Reuse

HIDDEN = 2 * 32 * 256 * 4      # the (2, 32, 256) float32 hidden activation
OUT = 2 * 32 * 64 * 4          # the (2, 32, 64) result


def _mlp(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2)


def _mlp_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 32, 64, generator=g), torch.randn(256, 64, generator=g) / 8,
            torch.randn(256, generator=g), torch.randn(64, 256, generator=g) / 16)


def _lower(fn, args, **options):
    return fxwrap.lower(fn, *args, options={"cache": False, "templates": "off", **options})


def test_gelu_after_an_addmm_writes_over_its_reshaped_result():
    args = _mlp_inputs(0)
    program = _lower(_mlp, args)
    gelu = next(line for line in program.lines if isinstance(line, CallKernel))
    mm = [line for line in program.lines if isinstance(line, CallExtern) and "mm" in str(line.op)]
    assert len(mm) == 2, program.code()
    hidden = mm[0].out if mm[0].out is not None else dict(mm[0].kwargs)["out"]
    (written,) = gelu.writes()
    # the kernel reads the addmm result through a (2, 32, 256) view and takes its storage
    assert Reuse(hidden, written) in program.lines, program.code()
    assert program.peak_bytes == HIDDEN + OUT, program.code()
    assert program.memory.peak_bytes_frees_only == 2 * HIDDEN
    for seed in (1, 2):
        x = _mlp_inputs(seed)
        torch.testing.assert_close(program.run(*x), _mlp(*x), rtol=1e-4, atol=1e-4)


def test_a_kernel_never_writes_over_an_input_it_reads_at_other_offsets():
    """``h + h.t()`` after a matmul: the kernel reads the matmul's result transposed too,
    so its output needs a storage of its own (and the numbers stay eager's)."""
    def fn(a, b):
        h = (a @ b).relu()
        return h + h.t()

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(48, 48, generator=g), torch.randn(48, 48, generator=g)
    program = _lower(fn, (a, b))
    torch.testing.assert_close(program.run(a, b), fn(a, b), rtol=1e-4, atol=1e-4)
    for seed in (4, 5):
        g = torch.Generator().manual_seed(seed)
        a, b = torch.randn(48, 48, generator=g), torch.randn(48, 48, generator=g)
        torch.testing.assert_close(program.run(a, b), fn(a, b), rtol=1e-4, atol=1e-4)


def test_the_epilogue_of_a_chosen_extern_writes_over_its_result(monkeypatch):
    """Where the timing picks the ATen call over the GEMM template (``templates="auto"``),
    the GELU epilogue runs as a kernel over the product's (64, 256) iteration while it
    stores the (2, 32, 256) result: still in place, one hidden buffer live."""
    from fxwrap.wrapper_ir import template_choice

    def extern_fastest(builder, emitter, candidates, extern):
        return {**{name: 1.0 for name, _ in candidates}, template_choice.EXTERN: 0.5}
    monkeypatch.setattr(template_choice, "time_candidates", extern_fastest)
    args = _mlp_inputs(6)
    program = _lower(_mlp, args, templates="auto")
    assert any(isinstance(line, CallExtern) and "addmm" in str(line.op) for line in program.lines)
    (gelu,) = [line for line in program.lines if isinstance(line, CallKernel)]
    (written,) = gelu.writes()
    assert any(isinstance(line, Reuse) and line.new == written for line in program.lines), program.code()
    assert program.peak_bytes == HIDDEN + OUT, program.code()
    x = _mlp_inputs(7)
    torch.testing.assert_close(program.run(*x), _mlp(*x), rtol=1e-4, atol=1e-4)
