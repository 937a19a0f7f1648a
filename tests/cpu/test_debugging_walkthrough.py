"""docs/debugging.md's walk-through runs: ``examples/debugging/walkthrough.py`` finds the
planted GELU bug (NaN in the output, check_nan naming the GELU kernel, print_values showing
its NaN output) and profiles the block without the plugin."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_debugging_walkthrough_finds_the_planted_bug(tmp_path):
    scratch = tmp_path / "tmp"  # the run's temporary folders: nothing may be left in it
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples" / "debugging"),
                                           os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "debugging" / "walkthrough.py"), "--quick"],
                          env=env, capture_output=True, text=True, timeout=900)
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-5000:])
    nan, total = map(int, re.search(r"NaN in the output: (\d+) of (\d+)", out).groups())
    assert total == 8 * 128 * 256 and nan > 0
    error = re.search(r"fxwrap check_nan: kernel (\w+) \(target cpu\) wrote (\d+) NaN into its output (\w+) "
                      r"\(shape \(8, 128, 1024\).*\n  it computes: (.*)", out)
    assert error, out[-3000:]
    kernel, count, buffer, computes = error.groups()
    assert int(count) > 0 and re.search(r"\b(gelu|erf)\b", computes)
    # print_values: the kernel's output holds the NaN, what went in is finite
    printed = re.search(rf"\[fxwrap.values\] {buffer} from kernel {kernel} .* nan=(\d+) inf=0", out)
    assert printed and int(printed.group(1)) == int(count)
    inputs = [line for line in out.splitlines() if line.startswith("[fxwrap.values]") and f" {buffer} " not in line]
    assert inputs and all(" nan=0 inf=0" in line for line in inputs)
    assert "fxwrap.profile: inference program on target cpu (cpu), 2 calls" in out
    assert re.search(r"wrote .*transformer_trace.json \(\d+ bytes\); removed at exit", out), out[-2000:]
    assert not list(scratch.glob("fxwrap-trace-*")), sorted(p.name for p in scratch.iterdir())
