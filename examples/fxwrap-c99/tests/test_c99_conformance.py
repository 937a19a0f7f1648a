"""fxwrap's conformance kit on the C99 target:
``python -m pytest -ra examples/fxwrap-c99/tests/test_c99_conformance.py``.

C has no 16-bit float type: the C99 target declares ``supported_dtypes`` without bfloat16
and float16, so their ops run as ATen externs (numbers still compared with eager).
"""
import torch

from fxwrap.testing import ConformanceSuite, Unsupported


class TestC99Conformance(ConformanceSuite):
    target = "c99"
    unsupported = [Unsupported("C99 has no 16-bit float: bf16 runs as ATen externs", dtype=torch.bfloat16),
                   Unsupported("C99 has no 16-bit float: fp16 runs as ATen externs", dtype=torch.float16)]
