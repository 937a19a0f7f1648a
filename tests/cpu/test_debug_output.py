"""Seeing inside a compile (issue 15): FXWRAP_LOG stages, the debug dump, the progress bar."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

import fxwrap
from fxwrap.core import logs
from fxwrap.core.progress import Progress
from fxwrap.testing.suite import fresh_state as _fresh_state
from fxwrap.ir.lines import CallKernel

fresh_state = pytest.fixture(autouse=True)(_fresh_state)


def mlp_block(x, w):
    h = torch.exp(x) @ w
    return torch.softmax(h.relu() * 2, -1)


@pytest.fixture
def no_fxwrap_log(monkeypatch):
    monkeypatch.delenv("FXWRAP_LOG", raising=False)
    monkeypatch.delenv("FXWRAP_DEBUG_DIR", raising=False)
    logs.configure()
    yield
    monkeypatch.delenv("FXWRAP_LOG", raising=False)
    logs.configure()


# ---------------------------------------------------------------------------- logging
def test_unknown_fxwrap_log_stage_is_an_error_naming_the_stages(monkeypatch, no_fxwrap_log):
    monkeypatch.setenv("FXWRAP_LOG", "wrapper,kernel")
    with pytest.raises(logs.UnknownLogStage) as err:
        fxwrap.lower(lambda t: t.sin(), torch.randn(4), target="cpu")
    text = str(err.value)
    assert "'kernel'" in text and "wrapper" not in text.split(";")[0].split("stage(s)")[1]
    assert all(stage in text for stage in logs.STAGES)
    assert logs.requested_stages("all") == tuple(logs.STAGES)
    assert logs.requested_stages(" schedule , kernels") == ("schedule", "kernels")


def test_import_fxwrap_stays_lazy_with_a_bad_fxwrap_log():
    env = dict(os.environ, FXWRAP_LOG="bogus", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", "import fxwrap, sys; print('fxwrap.core.logs' in sys.modules)"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_fxwrap_log_sends_each_named_stage_to_stderr(monkeypatch, no_fxwrap_log, capfd):
    monkeypatch.setenv("FXWRAP_LOG", "schedule,fx")
    x, w = torch.randn(4, 8), torch.randn(8, 4)
    fxwrap.lower(mlp_block, x, w, target="cpu")
    err = capfd.readouterr().err
    assert "[fxwrap.schedule] fxwrap_pointwise_0 <- exp" in err
    assert "[fxwrap.fx]" in err and "# mm (test_debug_output.py:" in err
    assert "[fxwrap.kernels]" not in err and "[fxwrap.memory]" not in err
    monkeypatch.setenv("FXWRAP_LOG", "")
    logs.configure()
    fxwrap.lower(mlp_block, x, w, target="cpu")
    assert "[fxwrap." not in capfd.readouterr().err


EXPECTED = {  # stage -> a text its records hold for mlp_block on the cpu target
    "capture": "inference ATen graph",
    "lowering": "= exp.f32",
    "schedule": "not fused into the kernel of",
    "memory": "peak",
    "wrapper": "aten.mm.out",
    "fx": "# mm (test_debug_output.py:",
    "kernels": "// fxwrap kernel fxwrap_pointwise_0",
    "cache": ".so",
    "timing": "compile kernels",
}


def test_each_stage_logger_says_something(caplog, no_fxwrap_log):
    caplog.set_level(logging.DEBUG, logger="fxwrap")
    x, w = torch.randn(4, 8), torch.randn(8, 4)
    program = fxwrap.lower(mlp_block, x, w, target="cpu")
    torch.testing.assert_close(program.run(x, w), mlp_block(x, w))
    by_stage: dict[str, str] = {}
    for record in caplog.records:
        by_stage[record.name] = by_stage.get(record.name, "") + record.getMessage() + "\n"
    for stage, needle in EXPECTED.items():
        assert needle in by_stage.get(f"fxwrap.{stage}", ""), (stage, by_stage.get(f"fxwrap.{stage}", "")[:2000])


def test_autotune_stage_on_triton_interpret(caplog, no_fxwrap_log):
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    caplog.set_level(logging.DEBUG, logger="fxwrap.autotune")
    fxwrap.lower(lambda t: torch.softmax(t, -1), torch.randn(8, 16), target="triton-interpret")
    texts = [r.getMessage() for r in caplog.records if r.name == "fxwrap.autotune"]
    assert texts and "not tuned: the interpreter times nothing" in texts[0]


def test_logging_off_builds_no_text(monkeypatch, no_fxwrap_log):
    """With no logger enabled, no stage formats its text (the kernel IR is never printed)."""
    import fxwrap.ir.loops as ir

    def forbidden(*args, **kwargs):
        raise AssertionError("format_kernel called with logging off")

    monkeypatch.setattr(ir, "format_kernel", forbidden)
    monkeypatch.setattr("fxwrap.wrapper_ir.render.format_loop_ir", forbidden)
    monkeypatch.setattr("fxwrap.ir.combo.format_kernel", forbidden)
    fxwrap.lower(mlp_block, torch.randn(4, 8), torch.randn(8, 4), target="cpu")


# ---------------------------------------------------------------------------- the dump
ARTIFACTS = ("aten_graph.py", "loop_ir.txt", "schedule.md", "wrapper_ir.py", "fx_code.py", "memory.svg",
             "memory_plan.txt", "timings.json", "program.json")


def test_debug_dump_writes_every_artifact(tmp_path, no_fxwrap_log):
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    programs = fxwrap.lower(mlp_block, x, w, training=True, target="cpu", options={"debug_dir": str(tmp_path)})
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert folders == ["000-forward-mlp_block", "001-backward-mlp_block"], folders
    for folder, program in zip(folders, (programs.forward, programs.backward)):
        out = tmp_path / folder
        for name in ARTIFACTS:
            assert (out / name).is_file() and (out / name).stat().st_size > 0, name
        kernels = [line.kernel for line in program.lines if isinstance(line, CallKernel)]
        assert kernels
        for kernel in kernels:
            assert (out / "kernels" / f"{kernel.name}.cpp").read_text().rstrip("\n") == kernel.source.rstrip("\n")
        assert (out / "wrapper_ir.py").read_text() == program.code()
        svg = ET.parse(out / "memory.svg").getroot()
        assert svg.tag.endswith("svg")
        rects = [e for e in svg.iter() if e.tag.endswith("rect")]
        assert rects and f"peak {program.peak_bytes} B" in (out / "memory.svg").read_text()
        timings = json.loads((out / "timings.json").read_text())
        assert timings["unit"] == "ms" and timings["phases"]["compile kernels"] >= 0 and timings["total"] > 0
        schedule = (out / "schedule.md").read_text()
        for kernel in kernels:
            assert f"## kernel {kernel.name}" in schedule
        assert "a kernel of its own:" in schedule
    assert "mm aten.mm.default" in (tmp_path / folders[0] / "aten_graph.py").read_text().replace(
        "torch.ops.aten.mm.default", "mm aten.mm.default")
    assert "= exp.f32" in (tmp_path / folders[0] / "loop_ir.txt").read_text()
    index = json.loads((tmp_path / "index.json").read_text())
    assert [p["folder"] for p in index["programs"]] == folders
    md, html = (tmp_path / "index.md").read_text(), (tmp_path / "index.html").read_text()
    for folder in folders:
        assert f"({folder}/schedule.md)" in md and f"href='{folder}/memory.svg'" in html


def test_debug_dump_from_the_environment_and_nothing_when_off(tmp_path, monkeypatch, no_fxwrap_log):
    monkeypatch.chdir(tmp_path)
    x = torch.randn(4, 8)
    fxwrap.lower(lambda t: t.exp() + 1, x, target="cpu")
    assert list(tmp_path.iterdir()) == []  # off: nothing written anywhere here
    dump = tmp_path / "dump"
    monkeypatch.setenv("FXWRAP_DEBUG_DIR", str(dump))
    fxwrap.lower(lambda t: t.exp() + 1, x, target="cpu")
    (folder,) = [p for p in dump.iterdir() if p.is_dir()]
    assert folder.name.endswith("-inference-lambda") and (folder / "kernels").is_dir()


def test_debug_dir_option_is_checked():
    with pytest.raises(TypeError, match="debug_dir"):
        fxwrap.Backend(options={"debug_dir": 3})


# ---------------------------------------------------------------------------- progress
class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only():
    tty, pipe = _Terminal(), io.StringIO()
    for stream in (tty, pipe):
        with Progress(20, "forward program", stream=stream) as bar:
            for _ in range(20):
                bar.advance()
    assert "fxwrap forward program: kernels 20/20 [" in tty.getvalue() and "kernels 1/20" in tty.getvalue()
    assert pipe.getvalue() == ""
    few = _Terminal()
    with Progress(Progress.MIN_ITEMS, "x", stream=few) as bar:
        bar.advance()
    assert few.getvalue() == ""  # a handful of kernels: no bar


def test_compiling_many_kernels_draws_the_bar(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)

    def many(x):
        outs = []
        for i in range(12):  # 12 kernels: each result goes through an extern (mm) of its own
            x = torch.sin(x) @ x
            outs.append(x)
        return outs

    fxwrap.lower(many, torch.randn(4, 4), target="cpu")
    assert "fxwrap inference program: kernels" in terminal.getvalue()


def test_memory_svg_never_draws_a_storage_above_the_peak(monkeypatch):
    """A layout of fixed offsets (first fit) can need more height than the peak: a and b
    live together, a dies, c (twice their size) comes while b lives -- first fit puts c
    above b, at 20..40 B, over a peak of 30 B.  Every band stays at or under the peak."""
    from fxwrap.programs import dump
    from fxwrap.core.memory import Lifetime

    lives = [Lifetime(("a",), 0, 1, 10, False), Lifetime(("b",), 0, 3, 10, False),
             Lifetime(("c",), 2, 3, 20, False)]
    monkeypatch.setattr(dump, "storage_lifetimes", lambda lines, hints: lives)
    plan = type("Plan", (), {"lines": [None] * 4})()
    text = dump.memory_svg(plan, {}, "t")
    svg = ET.fromstring(text)
    peak_line = [e for e in svg.iter() if e.tag.endswith("line") and e.get("stroke") == "red"]
    (peak,) = peak_line
    peak_y = float(peak.get("y1"))
    rects = [e for e in svg.iter() if e.tag.endswith("rect")]
    assert "peak 30 B" in text and {r.find("{*}title").text.split(":")[0] for r in rects} == {"a", "b", "c"}
    assert all(float(r.get("y")) >= peak_y - 0.05 for r in rects), text
    # the stack's top at each line is that line's live bytes: the bands tile the area under the curve
    plot_h = 420 - 40 - 40
    area = sum(float(r.get("width")) * float(r.get("height")) for r in rects)
    assert area == pytest.approx((900 - 70 - 20) / 4 * plot_h / 30 * (20 + 20 + 30 + 30), rel=1e-3)


CACHE_HIT_LOG = """
import torch
def mlp(x, w):
    return (x @ w).exp().sum(-1)
x, w = torch.randn(4, 8), torch.randn(8, 4)
torch.testing.assert_close(torch.compile(mlp, backend="fxwrap")(x, w), mlp(x, w))
"""


@pytest.mark.parametrize("second", ["program cache", "warm-start cache"])
def test_a_cached_program_is_printed_by_the_wrapper_and_fx_stages_with_its_entry(tmp_path, second):
    """``FXWRAP_LOG=wrapper,fx`` printed nothing when a later process found the program in a
    cache: it prints the program, saying which cache and entry it came from."""
    env = dict(os.environ, FXWRAP_CACHE_DIR=str(tmp_path), FXWRAP_PROGRAM_CACHE="1", FXWRAP_LOG="wrapper,fx",
               PYTHONPATH=os.pathsep.join(sys.path))
    first = subprocess.run([sys.executable, "-c", CACHE_HIT_LOG], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0 and "aten.mm.out" in first.stderr, first.stderr[-2000:]
    if second == "program cache":  # the graph entry gone: dynamo's graph compiles, its program is a hit
        for entry in (tmp_path / "graphs").rglob("*.pkl"):
            entry.unlink()
    again = subprocess.run([sys.executable, "-c", CACHE_HIT_LOG], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    err = again.stderr
    assert f"(from the {second}, entry {tmp_path}" in err and "aten.mm.out" in err, err[-2000:]
    assert "[fxwrap.fx]" in err and f"GraphModule (from the {second}" in err, err[-2000:]
