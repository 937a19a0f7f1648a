"""C++ pointwise kernels whose inner-loop loads are masked by conditions the inner loop does not
change (a max-pool window's rows and columns inside a padded image, over channels-last
channels) test those masks once per row and run an unmasked ``omp simd`` loop where they all
hold: gcc vectorized none of the masked loops (ResNet's stem, batch norm + ReLU + max-pool,
took 58 ms against Inductor's 3 ms at one thread), and the masked loop stays for the borders."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import DefineKernel


def _kernel_source(program) -> str:
    (source,) = [line.kernel.source for line in program.lines if isinstance(line, DefineKernel)]
    return source[source.index('extern "C"'):]


def _branches(source: str) -> tuple[str, str, str]:
    """The mask test, the loop under it and the loop of its ``else``."""
    match = re.search(r"\n(\s*)if \(([^\n]*)\) \{\n(.*?)\n\1\}\n\1else(?: \[&\]\(\) FX_NO_IFCVT)? \{\n(.*?)\n\1\}(?:\(\);)?\n",
                      source, re.S)
    assert match, source
    return match.group(2), match.group(3), match.group(4)


def _stem(x, mean, var, weight, bias):
    return F.max_pool2d(F.relu(F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)), 3, 2, 1)


def _pool(x, b):  # negative values: a padded position must count as -inf, never as 0
    return F.max_pool2d(x * 2 - b, 3, 2, 1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_stem, _pool], ids=["bn_relu_maxpool", "maxpool_negative"])
def test_window_inside_the_image_runs_unmasked(fn, dynamic):
    torch.manual_seed(0)
    x = torch.randn(2, 24, 15, 13).to(memory_format=torch.channels_last)
    params = (torch.randn(24), torch.rand(24) + 0.5, torch.randn(24), torch.randn(24)) if fn is _stem \
        else (torch.randn(24, 1, 1).abs() + 3,)
    program = fxwrap.lower(fn, x, *params, dynamic=dynamic, options={"cache": False})
    source = _kernel_source(program)
    test, fast, border = _branches(source)
    assert re.fullmatch(r"tmp\d+( && tmp\d+)+", test), test
    assert fast.lstrip().startswith("#pragma omp simd") and border.lstrip().startswith("#pragma omp simd")
    assert "? in_ptr" not in fast          # every load of the inner loop unconditional
    assert "? in_ptr0[" in border          # the border keeps its masked loads
    for seed in (1, 2):
        torch.manual_seed(seed)
        x2 = torch.randn(2, 24, 15, 13).to(memory_format=torch.channels_last)
        out = program.run(x2, *params)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, fn(x2, *params), rtol=1e-5, atol=1e-5)


def test_loop_without_masks_has_no_branch():
    x = torch.randn(2, 24, 15, 13).to(memory_format=torch.channels_last)
    program = fxwrap.lower(lambda x: torch.relu(x * 2), x, options={"cache": False})
    assert "else {" not in _kernel_source(program)


def test_mask_that_varies_in_the_inner_loop_stays_in_it():
    """A pad of the innermost (contiguous) dim: the mask depends on the inner variable, so
    the loop keeps its masked loads and gets no unmasked copy."""
    x = torch.randn(6, 37)
    program = fxwrap.lower(lambda x: F.pad(x, (3, 2), value=-1.5) * 2, x, options={"cache": False})
    source = _kernel_source(program)
    assert "else {" not in source and "? in_ptr0[" in source
    out = program.run(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, F.pad(x, (3, 2), value=-1.5) * 2)
