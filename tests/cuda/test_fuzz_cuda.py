"""The programs of the H100 fuzz run (``python -m fxwrap fuzz --target cuda --programs 1000``)
that failed there, and the Welford bug behind seed 831.

On the GPU Triton contracts a product and a subtraction into one FMA; Welford's deviation
``v - mean`` of a product then is the product's rounding error, not 0, where ``v`` equals
the mean: the variance of one element was ``inf`` (a positive M2 over 0 degrees of freedom)
where eager's is NaN, and the variance of equal values a tiny number where eager's is 0.
Triton's CPU interpreter never contracts, so the numbers tests fail only on a GPU; the
source test checks the guard on both."""
from __future__ import annotations

import pytest
import torch

from fxwrap.testing.fuzz import check as fuzz_check, generate, load
from triton_helpers import DEVICE, GPU, TARGET_NAME, check

ROWS = 8192 if GPU else 1500  # long enough for the looped Welford plan


@pytest.mark.parametrize("seed", [91, 320, 354, 373, 561, 831])
def test_seeds_that_failed_on_the_h100(seed, monkeypatch):
    """2 mismatches (320: a float32 gradient through bfloat16, one bfloat16 ulp off; 831: a
    single-element std, inf for NaN) and 4 compile errors (template timing on an expanded
    input), with the templates as the fuzz command has them and timed afresh."""
    monkeypatch.setenv("FXWRAP_TEMPLATES", "default")
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    assert fuzz_check(load(generate(seed)), TARGET_NAME) == ("pass", "")


@pytest.mark.parametrize("length", [1, 7, ROWS], ids=["one", "persistent", "looped"])
def test_variance_of_products_equal_to_their_mean(length):
    """Rows of equal products (``x * w`` fused into the reduction): eager's variance is
    exactly 0 (NaN for one element with correction 1); a row with an inf keeps NaN.  The
    persistent plan's two-pass mean of 7 equal values is not exactly the value (sum / 7):
    a variance of 1e-14 there is the plan's, not the FMA's."""
    # seeded: the std of the persistent plan is the square root of its ~1e-13 variance, which
    # an unseeded draw of large rows pushed past 1e-6 (1.03e-6, one CI run in many)
    x = torch.randn(6, 1, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(7)).expand(6, length)
    x = x.contiguous() * 3.7
    x[5, 0] = float("inf")
    w = torch.full((length,), 1.3, device=DEVICE)

    def fn(x, w):
        p = x * w
        return torch.var(p, dim=1), torch.var(p, dim=1, correction=0), torch.std(p, dim=1)
    ks = check(fn, (x, w), tol=dict(rtol=0, atol=1e-6 if length == 7 else 0))
    assert any("welford" in k.source or "_m2" in k.source for k in ks)


def test_the_welford_deviation_is_exactly_zero_at_the_mean_in_the_source():
    """Both plans spell the deviation with the guard (an interpreter run shows no FMA, so
    the text is what shows the guard there)."""
    for length in (7, ROWS):
        x, w = torch.randn(3, length, device=DEVICE), torch.randn(length, device=DEVICE)
        ks = check(lambda x, w: torch.var(x * w, dim=1), (x, w), tol=dict(rtol=1e-4, atol=1e-4))
        sources = "\n".join(k.source for k in ks)
        assert "_mean, (tmp" in sources and "_mean) * 0.0, tmp" in sources, sources
