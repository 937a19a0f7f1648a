"""``fxwrap.runtime.direct`` binds torch's private ``torch._C._dynamo.guards._reinterpret_tensor``
(the unchecked view) where torch has it; where it is missing, the runtime still imports (a
saved program loads) and every view is the public ``torch.as_strided``, with the same values."""
import os
import subprocess
import sys
from pathlib import Path

import torch

import fxwrap.runtime.direct as direct

ROOT = Path(__file__).resolve().parents[2]


def test_view_of_falls_back_to_as_strided(monkeypatch):
    base = torch.randn(40)
    expect = torch.as_strided(base, (3, 4), (1, 3), 5)
    fast = direct.view_of(base, (3, 4), (1, 3), 5)
    monkeypatch.setattr(direct, "_reinterpret_tensor", None)
    slow = direct.view_of(base, (3, 4), (1, 3), 5)
    kept = direct.view_of(base[2:], (2, 2), (2, 1))  # offset None: the base's own offset
    for view in (fast, slow):
        assert view.stride() == (1, 3) and view.storage_offset() == 5
        assert torch.equal(view, expect) and view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert kept.storage_offset() == 2 and torch.equal(kept, torch.as_strided(base[2:], (2, 2), (2, 1)))


def test_the_runtime_imports_and_programs_run_without_the_private_call():
    code = (
        "import torch\n"
        "del torch._C._dynamo.guards._reinterpret_tensor\n"
        "import fxwrap, fxwrap.runtime.direct as d\n"
        "assert d._reinterpret_tensor is None\n"
        "x = torch.randn(6, 8)\n"
        "program = fxwrap.lower(lambda t: (t * 2).t()[1:], x, target='cpu')\n"
        "assert 'as_strided' in program.graph_module.code\n"
        "y = torch.randn(6, 8)\n"
        "torch.testing.assert_close(program.run(y), (y * 2).t()[1:])\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
