"""Same program in, same bytes out: in one process, across processes, many times."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fxwrap

import null_helpers as H

HERE = Path(__file__).resolve().parent

# Each case: (function name in null_helpers, input shapes, mode, dynamic).
CASES = {
    "mlp-extern": ("mlp", [(8, 16), (16, 32), (32,), (32, 4)], "extern", False),
    "mlp-reference": ("mlp", [(8, 16), (16, 32), (32,), (32, 4)], "reference", False),
    "mlp-dynamic": ("mlp", [(8, 16), (16, 32), (32,), (32, 4)], "extern", True),
    "views-extern": ("views", [(6, 8)], "extern", False),
    "views-reference": ("views", [(6, 8)], "reference", False),
    "topk-extern": ("topk", [(5, 10)], "extern", False),
    "mixed_chain-extern": ("mixed_chain", [(64, 64), (64, 64), (64,)], "extern", False),
}

# Lowers every case (inputs from a seed that differs per run) and prints the texts as JSON.
SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import null_helpers as H
    from fxwrap.wrapper_ir.fx import to_graph_module
    from fxwrap.wrapper_ir.printer import program_source

    def texts(cases, seed):
        out = {}
        for key, (fn_name, shapes, mode, dynamic) in cases.items():
            gen = torch.Generator().manual_seed(seed)
            inputs = [torch.randn(*s, generator=gen) for s in shapes]
            program = H.lower(getattr(H, fn_name), *inputs, mode=mode, dynamic=dynamic)
            out[key] = [program.code(), program.graph_module.code]
        inputs, lines = H.kernel_program()
        gm = to_graph_module(inputs, lines)
        out["hand-made-kernel"] = [program_source(inputs, lines), gm.code]
        return out

    if __name__ == "__main__":
        print(json.dumps(texts(json.loads(sys.argv[1]), int(sys.argv[2]))))
""")

namespace: dict = {}
exec(compile(SCRIPT, "<determinism script>", "exec"), namespace)
texts = namespace["texts"]


@pytest.fixture(scope="module")
def here_texts():
    return texts(CASES, 1)


def test_lowering_twice_gives_identical_text(here_texts):
    again = texts(CASES, 2)
    assert set(again) == set(CASES) | {"hand-made-kernel"}
    for key in again:
        code, gm_code = here_texts[key]
        assert again[key][0] == code, key
        assert again[key][1] == gm_code, key
        assert "def forward(" in code and "def forward(self" in gm_code
    assert "fxwrap_runtime_kernel_double_plus_one_" in here_texts["hand-made-kernel"][1]
    assert "fxwrap_pointwise_0(" in here_texts["mlp-reference"][0]


def test_a_fresh_process_gives_identical_text(here_texts):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               PYTHONHASHSEED="12345")
    result = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES), "3"], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    there = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(there) == set(here_texts)
    for key, (code, gm_code) in here_texts.items():
        assert there[key][0] == code, key
        assert there[key][1] == gm_code, key


def _tiny(x):
    return (x.sin() * 2).relu()


def test_lowering_one_function_many_times_in_a_process():
    """``fxwrap.lower`` is repeatable: no cache of an earlier lowering gets in the way."""
    torch._dynamo.reset()
    codes = set()
    for seed in range(10):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))
        program = fxwrap.lower(_tiny, x, options={"kernels": False})
        H.assert_close_all(program.graph_module(x), (_tiny(x),))
        codes.add(program.code())
    assert len(codes) == 1
