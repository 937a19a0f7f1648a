"""The conformance kit fails where a target breaks the contract, naming the op and the target.

The kit runs in a pytest session of its own (a subprocess: a second torch in one process
does not go well) against the ``planted`` target of ``planted_target.py``, which has one
bug per check: ``sin`` lowered to ``cos``, bool ``maximum`` as a logical and, ``exp`` left an ATen extern, a dropped
``Free`` line, and a per-program counter in the printed code.  A correct op (``cos``)
passes there, so the failures are the bugs', not the target's.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fxwrap

HERE = Path(__file__).parent

CONFTEST = '''
import importlib.metadata
import json

import pytest

import fxwrap

pytest_plugins = ["fxwrap.testing"]
REPORTS = {}


@pytest.fixture(autouse=True, scope="session")
def planted_plugin_installed():
    """The installed plugins plus planted_target.py, as if it were installed too."""
    entry = importlib.metadata.EntryPoint("planted", "planted_target", group="fxwrap")
    with fxwrap.use_plugin_manager(fxwrap.PluginManager([*fxwrap.installed_entry_points(), entry])):
        yield


def pytest_runtest_logreport(report):
    """Each test's outcome and message: the error for a failure, the reason for a skip."""
    if report.when == "call" or report.outcome != "passed":
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        REPORTS[report.nodeid.split("::", 1)[1]] = [report.outcome, message]


def pytest_sessionfinish(session):
    with open("reports.json", "w") as f:
        json.dump(REPORTS, f)
'''

SUITES = '''
from fxwrap.testing import ConformanceSuite, Unsupported


class TestFromCommandLine(ConformanceSuite):
    """The target comes from --fxwrap-target."""


class TestWithDeclarations(ConformanceSuite):
    target = "planted"
    unsupported = [
        Unsupported("planted: exp runs as an ATen extern on purpose", name="exp"),
        Unsupported("planted: cos declared, though it runs in a kernel", name="cos"),
        Unsupported("planted: sin is not checked here", name="sin", check="all"),
    ]
'''

TESTS = [
    "TestFromCommandLine::test_op[sin[float32]]", "TestFromCommandLine::test_op[cos[float32]]",
    "TestFromCommandLine::test_op[exp[float32]]", "TestFromCommandLine::test_op[exp[bfloat16]]",
    "TestFromCommandLine::test_op[maximum_any[bool]]", "TestFromCommandLine::test_op[maximum_any[float32]]",
    "TestFromCommandLine::test_op[relu[float32]]", "TestFromCommandLine::test_op[relu_special[float32]]",
    "TestFromCommandLine::test_op[maximum[float32]]", "TestFromCommandLine::test_op[maximum_special[float32]]",
    "TestFromCommandLine::test_memory_plan[chain]", "TestFromCommandLine::test_deterministic[norm_gelu_softmax]",
    "TestWithDeclarations::test_op[exp[float32]]", "TestWithDeclarations::test_op[cos[float32]]",
    "TestWithDeclarations::test_op[sin[float32]]",
]


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> dict:
    """Runs the kit's tests ``TESTS`` on the planted target, once: ``{test id: (outcome, message)}``."""
    work = tmp_path_factory.mktemp("kit_on_planted")
    (work / "conftest.py").write_text(CONFTEST)
    (work / "test_planted.py").write_text(SUITES)
    fxwrap_root = str(Path(fxwrap.__file__).parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), fxwrap_root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--fxwrap-target=planted", *[f"test_planted.py::{t}" for t in TESTS]],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    reports = work / "reports.json"
    assert reports.exists(), f"the kit's session did not finish:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    outcomes = {test: tuple(value) for test, value in json.loads(reports.read_text()).items()}
    assert set(outcomes) == set(TESTS), (sorted(outcomes), run.stdout[-3000:])
    return outcomes


def test_wrong_numbers_fail_naming_the_op_and_target(kit):
    outcome, text = kit["TestFromCommandLine::test_op[sin[float32]]"]
    assert outcome == "failed"
    assert "op sin[float32] on target 'planted': output 0 differs from eager" in text, text
    assert kit["TestFromCommandLine::test_op[cos[float32]]"][0] == "passed", kit


def test_a_wrong_bool_maximum_fails_and_the_float_one_passes(kit):
    outcome, text = kit["TestFromCommandLine::test_op[maximum_any[bool]]"]
    assert outcome == "failed", kit
    assert "op maximum_any[bool] on target 'planted': output 0 differs from eager" in text, text
    assert kit["TestFromCommandLine::test_op[maximum_any[float32]]"][0] == "passed", kit


def test_nan_unaware_max_and_relu_pass_on_finite_inputs_and_fail_on_special_values(kit):
    """relu as ``x > 0 ? x : 0`` and maximum as ``a > b ? a : b`` (C's comparisons, or
    ``fmax``) passed all of the kit's max/relu/clamp/softmax cases before it fed NaN."""
    for op in ("relu", "maximum"):
        assert kit[f"TestFromCommandLine::test_op[{op}[float32]]"][0] == "passed", kit
        outcome, text = kit[f"TestFromCommandLine::test_op[{op}_special[float32]]"]
        assert outcome == "failed", kit
        assert f"op {op}_special[float32] on target 'planted': output 0 differs from eager" in text, text


def test_an_op_run_as_an_extern_fails_the_ran_in_a_kernel_check(kit):
    for dtype in ("float32", "bfloat16"):
        outcome, text = kit[f"TestFromCommandLine::test_op[exp[{dtype}]]"]
        assert outcome == "failed", kit
        assert (f"op exp[{dtype}] on target 'planted': the op ran as an ATen extern call (aten.exp.out), not "
                "inside a generated kernel") in text, text
        assert "differs from eager" not in text  # the numbers were right


def test_a_dropped_free_fails_the_memory_plan_check(kit):
    outcome, text = kit["TestFromCommandLine::test_memory_plan[chain]"]
    assert outcome == "failed"
    assert "memory plan of the chain inference program on target 'planted'" in text, text
    assert "are neither freed nor returned" in text, text


def test_differing_code_fails_the_determinism_check(kit):
    outcome, text = kit["TestFromCommandLine::test_deterministic[norm_gelu_softmax]"]
    assert outcome == "failed"
    assert "function norm_gelu_softmax on target 'planted': program.code() differs between two lowerings" in text
    assert "program number" in text, text


def test_declarations_are_skips_with_their_reason_and_stale_ones_fail(kit):
    outcome, text = kit["TestWithDeclarations::test_op[exp[float32]]"]
    assert outcome == "skipped", kit
    assert "numbers match eager; 'ran in a kernel' not checked" in text
    assert "planted: exp runs as an ATen extern on purpose" in text, text
    outcome, text = kit["TestWithDeclarations::test_op[cos[float32]]"]
    assert outcome == "failed", kit
    assert "ran inside generated kernels, but the suite declares it unsupported" in text, text
    outcome, text = kit["TestWithDeclarations::test_op[sin[float32]]"]
    assert outcome == "skipped" and "planted: sin is not checked here" in text, kit


class _Config:
    """Stands in for pytest's config: an --fxwrap-target value and an ini value."""

    def __init__(self, option=None, ini=""):
        self.option, self.ini = option, ini

    def getoption(self, name, default=None):
        return self.option if name == "fxwrap_target" and self.option else default

    def getini(self, name):
        return self.ini


def test_the_target_comes_from_the_class_then_the_option_then_the_ini():
    from fxwrap.testing.suite import ConformanceSuite, resolve_target_name

    class Named(ConformanceSuite):
        target = "reference"

    assert resolve_target_name(Named, _Config(option="cpu")) == "reference"
    assert resolve_target_name(ConformanceSuite, _Config(option="cpu", ini="reference")) == "cpu"
    assert resolve_target_name(ConformanceSuite, _Config(ini="reference")) == "reference"
    with pytest.raises(pytest.UsageError, match=r"ConformanceSuite names no fxwrap target: set `target = "
                                                r"\"<name>\"` on the class, or load the plugin"):
        resolve_target_name(ConformanceSuite, _Config())
    with pytest.raises(pytest.UsageError, match="no fxwrap target named 'cpuu'; registered: .*'cpu'"):
        resolve_target_name(ConformanceSuite, _Config(option="cpuu"))
