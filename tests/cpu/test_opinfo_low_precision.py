"""The OpInfo sweep's verdict on bf16/fp16 samples (``fxwrap.testing.opinfo``).

A low-precision result outside ``assert_close``'s bf16 tolerance passes only when it is
as close to the float64 result (eager on upcast inputs) as eager's own, within 2x
root-mean-square error; NaN and inf must sit where eager has them.  Samples that only
allocate (``aten.empty*``) have no defined result and are not compared.
"""
import pytest
import torch

from fxwrap.testing.opinfo import closer_to_float64, returns_uninitialised


def _three(seed=0):
    g = torch.Generator().manual_seed(seed)
    exact = torch.randn(64, generator=g, dtype=torch.float64) * 100
    eager = (exact.float() * (1 + 2 ** -8)).bfloat16()  # rounded between steps
    return exact, eager


def test_a_result_closer_to_float64_than_eager_passes():
    exact, eager = _three()
    closer_to_float64([exact.bfloat16()], [eager], [exact])


def test_a_result_farther_from_float64_than_eager_fails():
    exact, eager = _three()
    worse = (exact * 1.05).bfloat16()
    with pytest.raises(AssertionError, match="root-mean-square error to the float64 result"):
        closer_to_float64([worse], [eager], [exact])


def test_nan_where_eager_has_none_fails_however_close():
    exact, eager = _three()
    got = exact.bfloat16().clone()
    got[3] = float("nan")
    with pytest.raises(AssertionError):
        closer_to_float64([got], [eager], [exact])


def test_float32_results_get_the_plain_verdict():
    exact = torch.randn(16, dtype=torch.float64)
    with pytest.raises(AssertionError, match="not close"):
        closer_to_float64([exact.float() + 1e-3], [exact.float()], [exact])


def test_only_allocations_have_no_defined_result():
    aten = torch.ops.aten
    assert returns_uninitialised({aten.empty_like.default})
    assert returns_uninitialised({aten.empty_strided.default, aten.empty.memory_format})
    assert not returns_uninitialised({aten.empty_like.default, aten.fill_.Scalar})
    assert not returns_uninitialised(set())
