"""Shared by the scan tests of every target (tests/cpu, tests/mps, tests/cuda): the OpInfo
samples of the scan ops compiled through fxwrap, compared with eager, with a check that
every scan ran in a kernel of its own making (no ATen call of a scan op in the programs)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from fxwrap.testing.opinfo import Case, compare, dynamo_settings, select_ops
from fxwrap.ir.lines import CallExtern, CallKernel

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


# -- split scans of long rows (tests/cpu/test_scans.py, tests/mps/test_mps_scans.py) --------------

def workspaces(program) -> list[tuple[int, str]]:
    """``(numel, dtype)`` of every workspace argument of the program's kernel calls."""
    return [(int(arg.size[0]), str(arg.dtype)) for call in program.lines if isinstance(call, CallKernel)
            for a, arg in zip(call.kernel.signature, call.args) if a.role == "workspace"]


def scan_fn(name: str, dim: int = 1):
    if name in ("cummax", "cummin"):
        return lambda x: tuple(getattr(torch, name)(x, dim))
    return lambda x: getattr(torch, name)(x, dim)


def scan_input(name: str, shape, dtype: torch.dtype) -> torch.Tensor:
    if not dtype.is_floating_point:  # a product of +-1 stays +-1 (its sign tells a wrong prefix)
        return torch.randint(-3, 4, shape, dtype=dtype) if name != "cumprod" else \
            (torch.randint(0, 2, shape, dtype=dtype) * 2 - 1)
    if name == "cumprod":  # a long product stays finite when its factors are near 1
        return (1 + 0.01 * torch.randn(shape)).to(dtype)
    if name in ("cummax", "cummin"):  # many ties, and a NaN in the middle of one row
        x = torch.randint(-40, 40, shape).to(dtype)
        x.view(-1)[(x.numel() // 2 + 301) % x.numel()] = float("nan")
        return x
    return torch.randn(shape, dtype=dtype)


def check_float_scan(got: torch.Tensor, x: torch.Tensor, name: str, dim: int) -> None:
    """A float sum, product or logcumsumexp split into chunks rounds in another order than one
    serial pass (a chunk starts from the sum of the chunk totals before it), so it is compared
    with the float64 scan of the same inputs, within what float32 accumulation over ``n``
    steps may lose: ``4 * eps32 * sqrt(n)`` of the largest value (of each value for a product,
    whose magnitudes spread), plus the output dtype's rounding (bf16: one ulp of the value).
    A wrong prefix (a chunk missed or counted twice) is off by a chunk total, ~sqrt(chunk size)."""
    exact = scan_fn(name, dim)(x.double())
    n = x.shape[dim]
    accum = 4 * torch.finfo(torch.float32).eps * n ** 0.5
    scale = exact.abs() if name == "cumprod" else exact.abs().max()
    bound = torch.finfo(x.dtype).eps * exact.abs() + accum * scale
    err = (got.double() - exact).abs()
    assert got.dtype == x.dtype and bool((err <= bound).all()), (name, x.dtype, (err - bound).max().item())
