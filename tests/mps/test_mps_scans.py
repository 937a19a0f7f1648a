"""Scans on the Metal target through its C++ shim (``mps_shim``): every OpInfo sample of the
scan ops in a kernel (one thread per row) with eager's numbers, fp32 and bf16, static and
dynamic shapes (tests/cpu/test_scans.py has the other targets)."""
from __future__ import annotations

import pytest
import torch

from scan_helpers import SCAN_OPS, check_scan_op


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", SCAN_OPS)
def test_opinfo_scan_in_a_metal_kernel(name, dtype, dynamic):
    assert check_scan_op(name, dtype, "mps_shim", dynamic) > 0
