"""Shared by the scan tests of every target (tests/cpu, tests/mps, tests/cuda): the OpInfo
samples of the scan ops compiled through fxwrap, compared with eager, with a check that
every scan ran in a kernel of its own making (no ATen call of a scan op in the programs)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from fxwrap.testing.opinfo import Case, compare, dynamo_settings, select_ops
from fxwrap.wrapper_ir.lines import CallExtern, CallKernel

SCAN_OPS = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
ACCUMULATING = ("cumsum", "cumprod", "logcumsumexp")  # rounding accumulates along the row
aten = torch.ops.aten
SCAN_OVERLOADS = {aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default, aten.cummax.default,
                  aten.cummin.default}


def scan_samples(name: str, dtype: torch.dtype, device: str = "cpu"):
    """``(case, eager output)`` for each OpInfo sample of scan op ``name`` in ``dtype``."""
    if importlib.util.find_spec("expecttest") is None:
        pytest.skip("torch's OpInfo database needs expecttest: pip install expecttest (or fxwrap's [test] extra)")
    (op,) = [o for o in select_ops([name]) if not o.variant_test_name]
    out = []
    for sample in op.sample_inputs(device, dtype):
        case = Case.from_sample(op, sample)
        out.append((case, case.function()(*case.fresh_inputs())))
    return out


def scan_externs(programs) -> list[str]:
    """The ATen scan calls left in the programs' lines (there must be none)."""
    return [str(line.op) for p in programs for line in p.lines
            if isinstance(line, CallExtern) and line.op in SCAN_OVERLOADS]


def scan_kernels(programs) -> list[str]:
    return [line.kernel.name for p in programs for line in p.lines
            if isinstance(line, CallKernel) and "_scan_" in line.kernel.name]


def close_to_eager(got, expected, case, name: str, dtype: torch.dtype, what: str) -> None:
    """Eager's numbers; for an accumulating scan in bf16/fp16 that differs from eager, at
    least eager's accuracy: eager's CUDA kernels accumulate those dtypes in the dtype itself,
    so its error against the exact (float64) scan can exceed the dtype's tolerance, and a
    scan that accumulates in float32 (as fxwrap's do) differs from it by more than that."""
    try:
        compare(got, expected, what)
        return
    except AssertionError:
        if name not in ACCUMULATING or dtype not in (torch.bfloat16, torch.float16):
            raise
    exact = case.function()(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                              for t in case.fresh_inputs()])
    ours = (got.double() - exact).abs().max().item()
    eagers = (expected.double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    # one rounding to the dtype of the largest value on top of eager's own error
    assert ours <= eagers + torch.finfo(dtype).eps * scale, \
        f"{what}: error {ours:.3g} against the float64 scan, eager's {eagers:.3g}"


def check_scan_op(name: str, dtype: torch.dtype, target: str, dynamic: bool, device: str = "cpu") -> int:
    """Every sample of ``name`` compiled for ``target``: eager's numbers, no scan extern;
    returns how many scan kernels ran (a sample of a 0-d or empty tensor needs none)."""
    ran = 0
    for case, expected in scan_samples(name, dtype, device):
        programs: list = []
        torch._dynamo.reset()
        with dynamo_settings():
            fn = torch.compile(case.function(), backend="fxwrap", dynamic=dynamic,
                               options={"target": target, "on_program": programs.append})
            got = fn(*case.fresh_inputs())
        close_to_eager(got, expected, case, name, dtype, f"{name} {dtype} on {target} "
                       f"(input {tuple(case.tensors[0].shape)})")
        assert programs, f"{name}: nothing was compiled"
        assert not scan_externs(programs), f"{name} on {target}: {scan_externs(programs)} ran as ATen"
        kernels = scan_kernels(programs)
        if case.tensors[0].dim() and case.tensors[0].numel():
            assert kernels, f"{name} on {target}: no scan kernel for input {tuple(case.tensors[0].shape)}"
        ran += len(kernels)
    return ran
