"""The conformance kit (``fxwrap.testing``) run on fxwrap's built-in targets.

One ``ConformanceSuite`` subclass per target; each lists what its target declares
unsupported, every declaration shown as a skip with its reason (``pytest -ra``).
The out-of-tree example target runs the kit in ``examples/fxwrap-arena/tests``.
"""
import importlib.util

import pytest
import torch

from fxwrap.testing import ConformanceSuite, Unsupported


class TestCpuConformance(ConformanceSuite):
    target = "cpu"


class TestReferenceConformance(ConformanceSuite):
    target = "reference"


class TestMpsShimConformance(ConformanceSuite):
    """The Metal target, its kernels compiled as C++ against the shim header, on CPU tensors."""

    target = "mps_shim"
    unsupported = [Unsupported("Metal has no double: float64 runs as ATen externs on the Metal target "
                               "(tests/mps/test_mps_fallback.py checks how)", dtype=torch.float64)]


def _triton_missing() -> str | None:
    for module, why in (("triton", "triton is not installed"), ("numpy", "Triton's CPU interpreter needs numpy")):
        if importlib.util.find_spec(module) is None:
            return f"{why}; pip install -e '.[triton]'"
    return None


@pytest.mark.skipif(_triton_missing() is not None, reason=str(_triton_missing()))
class TestTritonInterpretConformance(ConformanceSuite):
    """The Triton emitter under Triton's CPU interpreter (``TRITON_INTERPRET=1``, set by tests/conftest.py).

    A declared subset: the interpreter runs every program element by element in numpy, and
    the training step of the conv net and the transformer block takes several seconds
    each there; tests/cuda/test_triton_models.py trains models through Triton instead.
    """

    target = "triton-interpret"
    _SLOW = ("Triton's CPU interpreter: a training step of this model takes seconds here; "
             "tests/cuda/test_triton_models.py trains a transformer block through Triton")
    unsupported = [Unsupported(_SLOW, name="conv_net_training", check="all"),
                   Unsupported(_SLOW, name="transformer_block_training", check="all")]
