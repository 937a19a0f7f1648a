"""fxwrap.testing: the conformance kit a plugin author points at their target.

Imported by test code only (it imports pytest); ``import fxwrap`` never imports it.
Subclass the suite in a test module of your plugin package, naming your target::

    # tests/test_conformance.py
    import torch
    from fxwrap.testing import ConformanceSuite, Unsupported

    class TestConformance(ConformanceSuite):
        target = "npu"
        unsupported = [Unsupported("the NPU has no float64: it runs as ATen externs",
                                   dtype=torch.float64)]

and run ``python -m pytest -ra tests/test_conformance.py``.  Or leave ``target`` unset,
load this module as a pytest plugin (``pytest_plugins = ["fxwrap.testing"]`` in your
root ``conftest.py``, or ``-p fxwrap.testing``) and choose the target on the command
line: ``--fxwrap-target=npu`` (or the ini option ``fxwrap_target``).

What the suite checks (one test per item, each failure names the op, the target and
what to do):

* ``test_op[<op>[<dtype>]]``: each op of ``fxwrap.testing.ops.OP_CASES`` (pointwise
  unary/binary, comparisons/where, casts incl. bf16/fp16, reductions, views/cat,
  indexing, pooling) compiles through the target and gives eager's numbers on fresh
  random inputs (per-dtype tolerances), and ran in a kernel: the program launches the
  kernels the op needs and no FX node calls the op (or any ATen op) as an extern;
* ``test_opinfo[<op>]``: a fixed subset of PyTorch's OpInfo database, float32 samples;
* ``test_model_inference`` / ``test_model_training``: an MLP, a conv net with batch
  norm and a transformer block; training compares gradients and batch-norm buffers;
* ``test_memory_plan``: every storage freed or returned once, no use after free,
  ``peak_bytes`` between the largest storage and the sum of all;
* ``test_deterministic``: two lowerings give byte-identical code and kernel sources.

Whatever the target declares ``Unsupported`` is a skip with the declared reason.
The checks themselves are plain functions in ``fxwrap.testing.checks``.
"""
from fxwrap.testing.checks import check_memory_plan, check_ran_in_kernels, check_same_output
from fxwrap.testing.ops import OP_CASES, OpCase
from fxwrap.testing.suite import OPINFO_OPS, ConformanceSuite, Unsupported

__all__ = [
    "ConformanceSuite", "OPINFO_OPS", "OP_CASES", "OpCase", "Unsupported", "check_memory_plan",
    "check_ran_in_kernels", "check_same_output", "pytest_addoption",
]


def pytest_addoption(parser):
    """``--fxwrap-target NAME`` and the ini option ``fxwrap_target``: the target of every
    ``ConformanceSuite`` subclass that sets no ``target`` itself."""
    group = parser.getgroup("fxwrap", "fxwrap conformance kit")
    group.addoption("--fxwrap-target", dest="fxwrap_target", default=None, metavar="NAME",
                    help="fxwrap target that ConformanceSuite subclasses without a `target` check")
    parser.addini("fxwrap_target", "fxwrap target for ConformanceSuite subclasses without a `target`",
                  default="")
