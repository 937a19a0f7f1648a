"""PyTorch's OpInfo database as the op-coverage oracle (see opinfo_sweep.py).

Each test runs twice: with the default options (kernels where the target generates
them, externs for the rest) and with ``options={"kernels": False}`` (every op an
extern call: out= overloads, views, functional fallbacks).

``test_opinfo_fast_subset`` (default) sweeps a fixed list of ops chosen to cover
every kind of thing the builder handles: pointwise, reductions, several outputs,
views (also dtype-reinterpreting and conjugate views), data-dependent sizes,
scalar arguments, higher-order ops (``with_effects`` from linalg error checks),
factories, indexing, convolution/pooling/normalisation, attention.

``test_opinfo_full_sweep`` (``@pytest.mark.slow``: ``pytest -m slow tests/models``)
sweeps every OpInfo in worker processes, one per CPU core.  Both print
``opinfo sweep: N ops, M samples, 0 mismatches, E fxwrap errors, A aot_eager errors``
into the terminal report.

The assertions: no sample where fxwrap's result differs from eager, and fxwrap fails
only on samples where aot_eager (PyTorch's own AOTAutograd stack, no fxwrap) fails
too, so ``fxwrap errors <= aot_eager errors``.
"""
import pytest

from opinfo_sweep import SweepResult, excluded_reason, select_ops, sweep, sweep_parallel

FAST_OPS = [
    # pointwise, with broadcasting, type promotion and scalar arguments
    "add", "mul", "div", "where", "clamp", "sigmoid", "pow", "lerp", "nn.functional.gelu",
    # reductions
    "sum", "mean", "amax", "argmax", "logsumexp", "cumsum", "std",
    # several outputs
    "topk", "sort", "max.reduction_with_dim", "var_mean", "aminmax", "frexp", "split", "unbind",
    # views, including ones as_strided cannot express (dtype, conjugate bit)
    "transpose", "as_strided", "diagonal", "unfold", "expand", "stft", "conj", "fft.ifft",
    # data-dependent output sizes
    "nonzero", "masked_select",
    # indexing and scatter
    "gather", "index_put", "index_add", "scatter_add", "take_along_dim",
    # shape / factories
    "cat", "stack", "roll", "tril", "arange", "full",
    # linear algebra (linalg.inv: a with_effects higher-order op checks the result)
    "mm", "addmm", "baddbmm", "linalg.inv",
    # neural-network ops
    "nn.functional.conv2d", "nn.functional.batch_norm", "nn.functional.layer_norm", "softmax",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.scaled_dot_product_attention",
]


def check(result: SweepResult, crashes=()) -> None:
    report = result.report()
    print(report)
    for name, why in crashes:
        print(f"  CRASH {name}: {why}")
    assert not crashes, f"sweep workers crashed:\n{report}"
    assert not result.mismatches, f"fxwrap results differ from eager:\n{report}"
    aot_failed = {(name, index) for name, index, _ in result.aot_errors}
    fxwrap_only = [(n, i, why) for n, i, why in result.fxwrap_errors if (n, i) not in aot_failed]
    assert not fxwrap_only, f"fxwrap fails where aot_eager does not: {fxwrap_only}\n{report}"
    assert len(result.fxwrap_errors) <= len(result.aot_errors)


MODES = [pytest.param(None, id="kernels"), pytest.param({"kernels": False}, id="extern")]


@pytest.mark.parametrize("options", MODES)
def test_opinfo_fast_subset(options, record_property):
    # "nn.functional.batch_norm" also names a variant without float32 support
    ops = [op for op in select_ops(FAST_OPS) if excluded_reason(op) is None]
    result = sweep(ops, options=options, aot_every_sample=False)  # aot_eager only where fxwrap fails
    record_property("opinfo_summary", result.summary())
    check(result)
    # The subset is not vacuous: every op was compared and (nearly) every sample ran
    # fxwrap programs (nonzero / masked_select break the graph at their output size).
    assert not result.excluded, result.excluded
    assert result.ops == len(ops)
    assert result.through_fxwrap >= 0.9 * result.samples, result.summary()


@pytest.mark.slow
@pytest.mark.parametrize("options", MODES)
def test_opinfo_full_sweep(options, record_property):
    result, crashes = sweep_parallel(extern=bool(options))
    record_property("opinfo_summary", result.summary())
    check(result, crashes)
    assert result.ops >= 600, result.summary()
