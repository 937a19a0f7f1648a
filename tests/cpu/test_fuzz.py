"""The random-program fuzzer (``fxwrap.testing.fuzz``) on every CPU-side target.

CI runs a share of the programs per target (``TARGETS``: about a minute each on two cores);
set ``FXWRAP_FUZZ_PROGRAMS`` to run that many per target instead.  The full runs are the command's:
``python -m fxwrap fuzz --target cpu --programs 2000 --seed 0``.  A planted wrong lowering
shows that the fuzzer finds wrong numbers and that its reproducer file fails when run.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.cli import main
from fxwrap.testing.fuzz import check_bad_inputs, fuzz, generate, harness, load, write_reproducer
from fxwrap.testing.fuzz.harness import compare

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "tests" / "conformance"
# target -> (first seed, programs in CI): each target its own seeds, so CI covers different
# programs on each; about a minute per target on two cores (the Metal shim compiles slowest)
TARGETS = {"cpu": (100_000, 40), "reference": (200_000, 60), "triton-interpret": (300_000, 40),
           "mps_shim": (400_000, 15)}
MORE = os.environ.get("FXWRAP_FUZZ_PROGRAMS")  # run this many per target instead


def _needs(target: str):
    if target == "triton-interpret" and importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the triton-interpret target needs it (pip install fxwrap[triton])")


def test_a_seed_gives_the_same_program_in_another_process():
    sources = [generate(seed) for seed in range(5)]
    assert len(set(sources)) == 5 and sources == [generate(seed) for seed in range(5)]
    code = ("import hashlib, sys; from fxwrap.testing.fuzz import generate; "
            "sys.stdout.write(' '.join(hashlib.sha256(generate(s).encode()).hexdigest() for s in range(5)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "123"}).stdout.split()
    assert other == [hashlib.sha256(s.encode()).hexdigest() for s in sources]


def test_programs_cover_every_op_family():
    text = "\n".join(generate(seed) for seed in range(150))
    for needle in ["torch.bfloat16", "torch.int64", "torch.bool", "keepdim=True", "torch.argm", "torch.var(",
                   ".reshape(", ".permute(", ".expand(", "torch.gather(", "torch.index_select(",
                   "embedding(", "scatter_add(", "index_put(", "index_copy(", "torch.mm(", "linear(",
                   "softmax(", "layer_norm(", "torch.cond(", "_(", "self.buf", "torch.where(", "'transposed'",
                   "'strided'", "'expanded'", "DYNAMIC = True", "BACKWARD = True"]:
        assert needle in text, f"no program of seeds 0..149 has {needle!r}"


@pytest.mark.parametrize("target", list(TARGETS))
def test_random_programs_match_eager(target, tmp_path):
    _needs(target)
    seed, programs = TARGETS[target]
    programs = int(MORE) if MORE else programs
    summary = fuzz(target, programs=programs, seed=seed, out=tmp_path, bad_inputs_every=0)
    assert summary.programs == programs
    assert summary.ok, summary.report()




@pytest.mark.parametrize("target", list(TARGETS))
def test_wrong_inputs_give_eager_numbers_or_an_input_mismatch_error(target):
    _needs(target)
    calls = 0
    for seed in (TARGETS[target][0] + 1, TARGETS[target][0] + 2):
        problems, made = check_bad_inputs(load(generate(seed)), target)
        calls += made
        assert not problems, "\n".join(problems)
    assert calls > 0


def test_eager_raising_in_a_dead_line_is_compared_without_it_and_in_a_live_one_still_raises():
    """Bad-input seed 232: where eager raises, the program's outputs are compared with eager's
    without the lines no output reads; an error in a live line stays an error there, so a
    program returning where it is raised is still reported."""
    from fxwrap.testing.fuzz.bad_inputs import _without_dead_code

    class Dead(torch.nn.Module):
        def forward(self, x, i):
            torch.index_select(x, 1, i)
            return x.sin()

    class Live(torch.nn.Module):
        def forward(self, x, i):
            return torch.index_select(x, 1, i).sin()

    x, index = torch.randn(4, 2), torch.tensor([0, 2])
    with pytest.raises((RuntimeError, IndexError)):
        Dead()(x, index)  # eager runs the dead line
    torch.testing.assert_close(_without_dead_code(Dead(), True, (x, index)), x.sin())
    with pytest.raises((RuntimeError, IndexError)):
        _without_dead_code(Live(), True, (x, index))


def test_a_none_input_is_an_input_mismatch_error():
    """issue 28 item 1: a None input failed inside the program (AttributeError/TypeError)."""
    problems, calls = check_bad_inputs(load(generate(5)), "cpu")
    assert calls > 0 and not problems, "\n".join(problems)


def test_an_input_on_the_meta_device_is_an_input_mismatch_error():
    """Found by the fuzzer: an input that only an ATen call reads has no device check, and
    on the meta device the call ran on it (RuntimeError, or no numbers).  The meta device
    is refused for every input, and the error names the input, the device and the target."""
    problems, calls = check_bad_inputs(load(METAL_SEED_40), "cpu")
    meta = [p for p in problems if " on the meta device:" in p]
    assert calls > 0 and not meta, "\n".join(meta)
    x0, x4, x5 = torch.randn(1, 4, 8, 1), torch.randn(4, 1), torch.randn(4)

    def fn(x0, x4, x5):
        return torch.nn.functional.linear(x0, x4, x5) + 1
    program = fxwrap.lower(fn, x0, x4, x5, target="cpu", options={"templates": "off"})
    torch.testing.assert_close(program.run(x0, x4, x5), fn(x0, x4, x5))
    for i in range(3):
        args = [x0, x4, x5]
        args[i] = args[i].to("meta")
        with pytest.raises(fxwrap.InputMismatchError, match=rf"\(argument {i}\) is on (the meta device|device meta)"
                                                            r".*target 'cpu'"):
            program.run(*args)


# found by the fuzzer (seed 40, target mps_shim): x4 and x5 reach only the linear's extern (with GEMM
# templates off, as tests/conftest.py sets them; a template kernel reads x4, and its device is checked)
METAL_SEED_40 = '''SEED = 40
DYNAMIC = False
BACKWARD = False
INPUTS = [
    ('x0', (1, 4, 8, 1), torch.float32, 'randn', None, 'contiguous', False),
    ('x4', (4, 1), torch.float32, 'randn', None, 'contiguous', False),
    ('x5', (4,), torch.float32, 'randn', None, 'expanded', False),
]
BUFFERS = [
]


class Program(torch.nn.Module):
    def forward(self, x0, x4, x5):
        v6 = torch.nn.functional.linear(x0, x4, x5)
        return (torch.add(v6, 0.5, alpha=2),)
'''


# -- a planted wrong lowering: the fuzzer reports it and the reproducer fails -------------------
def _seed_with(needle: str) -> int:
    return next(seed for seed in range(1000) if needle in generate(seed))


def _planted_manager():
    if str(CONFORMANCE) not in sys.path:
        sys.path.insert(0, str(CONFORMANCE))
    entry = importlib.metadata.EntryPoint("planted", "planted_target", group="fxwrap")
    return fxwrap.PluginManager([*fxwrap.installed_entry_points(), entry])


BOOTSTRAP = """
import importlib.metadata, runpy, sys
sys.path.insert(0, {conformance!r})
import fxwrap
entry = importlib.metadata.EntryPoint("planted", "planted_target", group="fxwrap")
with fxwrap.use_plugin_manager(fxwrap.PluginManager([*fxwrap.installed_entry_points(), entry])):
    runpy.run_path({path!r}, run_name="__main__")
"""


def _run_reproducer(path: Path) -> subprocess.CompletedProcess:
    code = BOOTSTRAP.format(conformance=str(CONFORMANCE), path=str(path))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})


def test_the_fuzzer_reports_a_planted_wrong_lowering_and_its_reproducer_fails(tmp_path):
    seed = _seed_with("torch.sin(")  # the planted target lowers aten.sin to cos
    with fxwrap.use_plugin_manager(_planted_manager()):
        summary = fuzz("planted", programs=1, seed=seed, out=tmp_path, bad_inputs_every=0)
    assert summary.counts["mismatch"] == 1, summary.report()
    path = summary.failures[0].path
    assert path is not None and path.exists()
    text = path.read_text()
    assert "import torch\n" in text and "import fxwrap\n" in text and "torch.sin(" in text
    assert not [line for line in text.splitlines() if line.startswith(("import ", "from ")) and
                line.split()[1].split(".")[0] not in ("torch", "fxwrap")]

    failed = _run_reproducer(path)
    assert failed.returncode != 0 and "AssertionError: mismatch on target 'planted'" in failed.stderr, failed.stderr

    # the same program on a correct target: the reproducer passes
    fine = write_reproducer(tmp_path / "cpu", generate(seed), seed, "cpu", "mismatch", "control")
    passed = _run_reproducer(fine)
    assert passed.returncode == 0 and passed.stdout.strip().endswith("pass"), passed.stderr


def test_the_comparison_is_nan_aware_bitwise_for_ints_and_looks_at_gradients():
    x = torch.randn(6, 5)
    assert compare("out", x.clone(), x) is None
    nan = x.clone()
    nan[1, 2] = float("nan")
    assert compare("out", nan.clone(), nan) is None          # NaN where eager has NaN
    assert "out" in compare("out", nan, x)                    # NaN where eager has a number
    assert compare("out", x + 1e-3, x) is not None           # float32: beyond its tolerance
    assert compare("out", (x + 1e-2).bfloat16(), x.bfloat16()) is None  # bfloat16: within its own
    ints = torch.randint(-50, 50, (7,))
    assert "1 of 7" in compare("out", ints + (torch.arange(7) == 3), ints)  # off by one: bitwise
    assert "dtype" in compare("out", ints.int(), ints)
    ns = load(generate(next(s for s in range(1000) if "BACKWARD = True" in generate(s)
                            and "torch.sin(" in generate(s))))
    eager = harness.run(ns)
    assert eager["grads"] and not harness.compare_runs(harness.run(ns), eager)
    wrong = {**eager, "grads": [g * 1.01 if g is not None else g for g in eager["grads"]]}
    assert any(m.startswith("grad ") for m in harness.compare_runs(wrong, eager))
    # eager's None gradient (no path to an output) matches zeros, and only zeros
    grad = next(g for g in eager["grads"] if g is not None)
    unused = {**eager, "grads": [None]}
    assert not harness.compare_runs({**eager, "grads": [torch.zeros_like(grad)]}, unused)
    assert harness.compare_runs({**eager, "grads": [torch.ones_like(grad)]}, unused)


def test_a_float32_result_through_a_bfloat16_value_has_bfloat16_tolerance():
    """Seed 320 on the H100: a float32 gradient one bfloat16 ulp (7.8e-3) off eager's, through
    ``x1.to(torch.bfloat16)`` and ``erf``: eager rounds each op of erf's backward to bfloat16,
    the compiled kernel once at the end.  A program with a bfloat16 value compares every
    float result with bfloat16's tolerance; one without keeps float32's."""
    ns = load(generate(320))
    assert harness.loosest_dtype(ns) == torch.bfloat16
    eager = harness.run(ns)
    grad = eager["grads"][1]
    one_ulp = {**eager, "grads": [eager["grads"][0], grad + 7.8e-3 * (grad.abs() > 1)]}
    assert harness.compare_runs(one_ulp, eager)                                    # float32's tolerance
    assert not harness.compare_runs(one_ulp, eager, loosest=harness.loosest_dtype(ns))
    assert harness.compare_runs({**eager, "grads": [eager["grads"][0], grad * 1.1]}, eager,
                                loosest=torch.bfloat16)                            # a 10% error is still found
    float32_only = next(s for s in range(100) if "bfloat16" not in generate(s) and "torch.float32" in generate(s))
    assert harness.loosest_dtype(load(generate(float32_only))) == torch.float32


def test_a_compile_error_names_the_error_fxwrap_raised():
    """The cuda run's compile errors read "BackendCompilerFailed: backend=... raised:" only;
    the message is the wrapped error's first line and where it was raised."""
    def failing_backend(gm, example_inputs):
        raise RuntimeError("unsupported operation: more than one element\nsecond line")
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(lambda x: x.sin() + 1, backend=failing_backend)(torch.randn(3))
    torch._dynamo.reset()
    assert type(info.value).__name__ == "BackendCompilerFailed"
    text = harness.describe_error(info.value)
    assert text.startswith("RuntimeError: unsupported operation: more than one element (at test_fuzz.py:"), text


def test_the_fuzz_command_prints_a_summary(tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--programs", "3", "--seed", "7", "--out", str(tmp_path),
                 "--bad-inputs-every", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fxwrap fuzz: target 'reference', seeds 7..9, 3 programs" in out
    assert "passed          3" in out and "mismatches      0" in out


def test_the_time_limit_starts_no_program_after_it(tmp_path, capsys):
    assert main(["fuzz", "--target", "reference", "--programs", "50", "--time-limit", "0", "--out", str(tmp_path),
                 "--quiet"]) == 0
    assert "no seeds, 0 programs" in capsys.readouterr().out


def test_workers_run_every_seed_once(tmp_path):
    summary = fuzz("reference", programs=12, seed=20, out=tmp_path, bad_inputs_every=0, jobs=2)
    assert sorted(summary.seeds) == list(range(20, 32)) and summary.programs == 12
    assert summary.ok, summary.report()


FUZZ_REJECTED = """
import torch
from fxwrap.testing.fuzz import harness, runner
def check(ns, target):
    try:
        torch.compile(lambda a, b: a + b, backend="eager")(torch.randn(6, 16), torch.randn(1, 15))
    except Exception:
        torch._dynamo.reset()
        return "torch_error", "bad broadcast"
    return "pass", ""
harness.check = check
summary = runner.fuzz("reference", programs=3, seed=0, bad_inputs_every=0)
print("TORCH_ERRORS", summary.counts["torch_error"])
"""


def test_a_fuzz_run_prints_no_traceback_for_programs_eager_rejects(tmp_path):
    """A fuzzed program torch itself rejects (a bad broadcast) made torch's fake tensors log a
    traceback each time (812 lines for 200 passing programs, ``--quiet`` or not); the
    summary counts such programs, and the run prints nothing else."""
    import os
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", FUZZ_REJECTED], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, FXWRAP_CACHE_DIR=str(tmp_path)))
    assert run.returncode == 0 and "TORCH_ERRORS 3" in run.stdout, run.stderr[-2000:]
    assert "failed while attempting to run meta" not in run.stderr and "Traceback" not in run.stderr, \
        run.stderr[-2000:]


FUZZ_WARNS = """
import sys, warnings
from fxwrap.testing.fuzz import harness
def check(ns, target):
    warnings.warn("a warning the fuzzed program's eager run gives", UserWarning)
    return "pass", ""
harness.check = check
from fxwrap.cli import main
sys.exit(main(["fuzz", "--target", "reference", "--programs", "3", "--bad-inputs-every", "0",
               "--out", sys.argv[1]] + sys.argv[2:]))
"""


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_prints_the_summary_only(tmp_path, quiet):
    """``--quiet`` printed the fuzzed programs' own warnings (48 lines of UserWarning for 1027
    passing CPU programs on the H200 host); now it prints the summary only."""
    import os
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", FUZZ_WARNS, str(tmp_path)] + (["--quiet"] if quiet else []),
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, FXWRAP_CACHE_DIR=str(tmp_path)))
    assert run.returncode == 0 and "passed          3" in run.stdout, run.stderr[-2000:]
    assert ("UserWarning" in run.stderr) is not quiet, run.stderr[-2000:]
