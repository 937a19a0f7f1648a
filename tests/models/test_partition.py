"""How a training graph is split: by default (``partition="min_cut"``) the forward saves
for the backward the fewest bytes it can, as Inductor does; ``"save_all"`` saves every
value the backward reads.  A decoder's loss head is the case that matters: the float32
log-softmax of the logits is as large as the logits themselves, twice over in bf16."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxwrap

VOCAB, DIM, ROWS = 512, 64, 96


class LossHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x, targets):
        return F.cross_entropy(self.proj(x).float(), targets)


def _saved(program) -> list[tuple[tuple, torch.dtype]]:
    """(shape, dtype) of every tensor the forward program returns (the loss and what it saves)."""
    (outputs,) = [n.args[0] for n in program.graph_module.graph.nodes if n.op == "output"]
    vals = [getattr(o, "meta", {}).get("val") for o in outputs]
    return [(tuple(v.shape), v.dtype) for v in vals if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("partition", [None, "min_cut", "save_all"])
def test_partition_saves_and_gradients(partition):
    torch.manual_seed(0)
    model = LossHead().to(torch.bfloat16)
    compiled_model = LossHead().to(torch.bfloat16)
    compiled_model.load_state_dict(model.state_dict())
    x = torch.randn(ROWS, DIM, dtype=torch.bfloat16)
    targets = torch.randint(0, VOCAB, (ROWS,))
    programs = []
    options = {"on_program": programs.append, "cache": False}
    if partition is not None:
        options["partition"] = partition
    compiled = torch.compile(compiled_model, backend="fxwrap", options=options)
    loss = compiled(x, targets)
    loss.backward()
    expected = model(x, targets)
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(compiled_model.proj.weight.grad, model.proj.weight.grad, rtol=2e-2, atol=2e-2)
    forward = next(p for p in programs if p.kind == "forward")
    saved = _saved(forward)
    fp32_logits = [s for s in saved if s == ((ROWS, VOCAB), torch.float32)]
    if partition == "save_all":
        assert fp32_logits, saved  # the float32 log-softmax is saved
    else:
        # min-cut: the bf16 logits (or less), recomputing the float32 log-softmax in the backward
        assert not fp32_logits, saved
    nbytes = sum(torch.Size(s).numel() * torch.finfo(d).bits // 8 for s, d in saved if d.is_floating_point)
    if partition == "save_all":
        assert nbytes >= ROWS * VOCAB * (2 + 4), saved  # bf16 logits and their float32 log-softmax
    else:
        assert nbytes <= ROWS * VOCAB * 3, saved  # about the bf16 logits, plus row statistics


def test_partition_rejects_unknown_name():
    with pytest.raises(ValueError, match="partition='default' is not one of"):
        fxwrap.Backend(options={"partition": "default"})
