"""Scalar outputs and data-dependent sizes: ``.item()`` (an unbacked scalar read on the
host), ``nonzero`` / ``masked_select`` / ``unique`` (result sizes known only at run
time, read back with ``sym_size``), and size expressions returned as Python ints."""
import pytest
import torch
import torch._dynamo

from models_helpers import DYNAMIC, compile_fxwrap

CASES = {
    "item_scales": lambda x: x * x.sum().item(),
    "item_returned": lambda x: (x.abs().max().item(), x + 1),
    "nonzero": lambda x: torch.nonzero(x > 0).float().sum(0) + 1,
    "masked_select": lambda x: torch.masked_select(x, x > 0) * 2,
    "boolean_index_view": lambda x: (x[x > 0].view(-1, 1) * torch.arange(3.0)).t().contiguous(),
    "unique": lambda x: torch.unique(torch.round(x * 2)) + 1,
    "size_returned": lambda x: (x.sum(0), x.shape[0] * 3 + x.shape[1]),
}


@pytest.mark.parametrize("dynamic", DYNAMIC)
@pytest.mark.parametrize("name", list(CASES))
def test_data_dependent(name, dynamic):
    fn = CASES[name]
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        compiled = compile_fxwrap(fn, "torch.compile", dynamic)
        for shape in ((5, 4), (3, 7)):
            x = torch.randn(shape)
            got, want = compiled(x), fn(x)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert compiled.programs, "fxwrap compiled nothing"
