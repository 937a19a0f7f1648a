"""The warm-start cache on the GPU (the Triton target): a second process with the same cache
directory, and a process with an empty one that loads a bundle, run the model with no
AOTAutograd and no lowering and give eager's numbers (the child: tests/cpu/warm_start_child.py)."""
from pathlib import Path

import pytest
import torch

from shared_helpers import run_child

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CHILD = Path(__file__).resolve().parents[1] / "cpu" / "warm_start_child.py"


def child(cache_dir, *args) -> dict:
    return run_child(CHILD, cache_dir, *args, "--device", "cuda")


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_second_process_skips_aot_autograd_and_lowering(tmp_path, mode, shapes):
    cold = child(tmp_path, mode, shapes, "float32")
    assert cold["lowered"] and cold["stats"].get("stored") == 1, cold
    warm = child(tmp_path, mode, shapes, "float32")
    assert warm["lowered"] == [] and warm["aot"] == 0 and warm["stats"] == {"hit": 1}, warm
    assert warm["err"] < 1e-4, warm


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_bundle_loads_into_an_empty_cache_dir(tmp_path, mode):
    bundle = tmp_path / "model.fxcache"
    made = child(tmp_path / "a", mode, "static", "float32", "--save", bundle)
    assert made["saved"] == 1
    warm = child(tmp_path / "b", mode, "static", "float32", "--load", bundle)
    assert warm["lowered"] == [] and warm["aot"] == 0 and warm["stats"] == {"hit": 1}, warm
    assert warm["err"] < 1e-4, warm
