"""Optimizer steps on the Metal target (``mps_shim``): its emitter renders no combo kernels
(``combo_kernels`` None), so each tensor's update is a kernel of its own, with eager's
numbers; the scheduler still fuses every op on one tensor (foreach: one kernel a tensor)."""
from __future__ import annotations

import pytest

from combo_cases import PARAM_SHAPES, assert_same_step, optimizer_step
from fxwrap.targets.mps_metal.emitter import MetalEmitter


@pytest.mark.parametrize("foreach", [True, False])
def test_adamw_step_as_eager_one_kernel_a_tensor(foreach):
    assert MetalEmitter.combo_kernels is None
    *result, launched = optimizer_step("mps_shim", "cpu", "AdamW", foreach)
    assert_same_step(*result)
    assert not any(k.name.startswith("fxwrap_combo") for k in launched)
    if foreach:  # every op on a tensor in one kernel, the steps' increments in one more
        assert len(launched) <= len(PARAM_SHAPES) + 1, [k.name for k in launched]
