"""Child of test_corruption_fuzz.py: compile an MLP (training step and inference) with the
cache folder of ``FXWRAP_CACHE_DIR`` and check every number against eager; prints ``OK``."""
import torch

import fxwrap  # noqa: F401  (registers the backend)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
reference.load_state_dict(model.state_dict())
x = torch.randn(4, 16)
compiled = torch.compile(model, backend="fxwrap")
compiled(x).square().sum().backward()
reference(x).square().sum().backward()
for p, q in zip(model.parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
with torch.no_grad():
    torch.testing.assert_close(compiled(x), reference(x), rtol=1e-4, atol=1e-5)
print("OK")
