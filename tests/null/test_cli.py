"""``python -m fxwrap targets``: one aligned line per registered target."""
import re

from fxwrap.cli import main


def test_targets_lists_every_builtin_target_with_its_emitter(capsys):
    assert main(["targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in lines}
    want = {"cpu": "CppEmitter", "cuda": "TritonEmitter", "mps": "MetalEmitter", "mps_shim": "MetalEmitter",
            "reference": "ReferenceEmitter", "triton-interpret": "TritonEmitter"}
    for name, emitter in want.items():
        assert f"emitter={emitter} " in rows[name], rows[name]
    assert len({line.index("device=") for line in lines}) == 1  # one column for every name
    assert all(re.search(r"from plugin '[\w-]+' \(entry point '[\w.]+' in group 'fxwrap'\)", line) for line in lines)
