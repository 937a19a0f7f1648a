"""Less compile work for the same program: kernels equal but for their names share one
shared object (host.loader.shared_source), kernels compile with the prelude precompiled
(host.compiler.SharedPrelude), and every template candidate of a program compiles at once
before any is timed, each distinct group timed once (wrapper_ir.template_choice)."""
from __future__ import annotations

import re
import types

import torch
import torch.nn.functional as F

import fxwrap
from fxwrap.runtime.launch import KernelLaunch
from fxwrap.targets.cpu_cpp.emitter import SHARED_PRELUDE, CppEmitter
from shared_helpers import record_compilers
from fxwrap.targets.host.compiler import CppCompiler, SharedPrelude
from fxwrap.targets.host.loader import ENTRY_PREFIX, SHARED_SYMBOL, launcher_for, shared_source
from fxwrap.targets.host.saved import bind_c_kernel
from fxwrap.wrapper_ir import template_choice
from fxwrap.ir.lines import CallKernel, TemplateChoice


def _mlp(widths):
    """Linear + ReLU layers: with templates off, an extern mm and an epilogue kernel each."""
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def _kernels(program):
    return [ln.kernel for ln in program.lines if isinstance(ln, CallKernel)]


def test_kernels_equal_but_for_their_names_share_one_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    model, x = _mlp([48, 64, 64, 64]), torch.randn(24, 48)
    program = fxwrap.lower(model, x, target="cpu", options={"templates": "off", "cache": False})
    kernels = _kernels(program)
    names = [k.name for k in kernels]
    libraries = [k.launcher().library for k in kernels]
    assert len(set(names)) == len(names) >= 3
    assert len(set(libraries)) < len(libraries)  # the 2nd and 3rd layers' epilogues: one binary
    for k in kernels:  # each source still names its own function
        assert f"void {k.launch.symbol}(" in k.source
    torch.testing.assert_close(program.run(x), model(x), atol=1e-5, rtol=1e-5)
    # a saved program binds the shared symbol, and runs
    program.save(tmp_path / "mlp.fxw")
    loaded = fxwrap.load(tmp_path / "mlp.fxw")
    x2 = torch.randn(24, 48)
    torch.testing.assert_close(loaded.run(x2), model(x2), atol=1e-5, rtol=1e-5)


def test_shared_source_renames_the_whole_symbol_only():
    src = ('// fxwrap kernel k_1\n// from model.py:3\n#include <cstdint>\n'
           'extern "C" void k_12(int64_t* p) { p[0] = 12; }\n'
           'extern "C" void k_1(int64_t* p) { k_12(p); p[0] += 1; }\n')
    text, symbol = shared_source(src, "k_1")
    assert re.fullmatch(ENTRY_PREFIX + "[0-9a-f]{24}", symbol) and "//" not in text
    assert f"void {symbol}(int64_t* p) {{ k_12(p);" in text and "void k_12(" in text
    assert shared_source(src.replace("k_1", "k_2").replace("k_22", "k_12"), "k_2") == (text, symbol)
    # other code: another symbol (kernels compiled in one translation unit must not clash)
    assert shared_source(src.replace("+= 1", "+= 2"), "k_1")[1] != symbol
    # a source that does not name the symbol, or already uses the shared one: as it is
    assert shared_source(src, "k_3") == (src, "k_3")
    clash = src + f"static int {SHARED_SYMBOL};\n"
    assert shared_source(clash, "k_1") == (clash, "k_1")


def test_a_binary_saved_with_the_kernels_own_symbol_still_binds(tmp_path):
    """Files saved before kernels shared binaries export the kernel's own name."""
    src = ('#include <cstdint>\nextern "C" void old_kernel(const float* x, float* y, int64_t n) '
           '{ for (int64_t i = 0; i < n; ++i) y[i] = 2.0f * x[i] + 1.0f; }\n')
    path = CppCompiler(cache_dir=tmp_path).compile(src)
    kernel = types.SimpleNamespace(launch=KernelLaunch(symbol="old_kernel", pointers=2, size_symbols=("s0",)))
    launch = bind_c_kernel(path, kernel)
    x, y = torch.randn(7), torch.empty(7)
    launch(x, y, 7)
    torch.testing.assert_close(y, 2 * x + 1)


def _pointwise_source(scale: float):
    em = CppEmitter()
    from emitter_helpers import Store, buf, const, kernel, ld, op, s0, x0
    k = kernel(f"scale_{str(scale).replace('.', '_')}", [buf("x", (s0,))], [buf("y", (s0,))],
               [Store("y", x0, op("mul", torch.float32, ld("x", x0), const(scale)))], ranges=(s0,), sizes=(s0,))
    return em.render(k)


def test_the_prelude_is_precompiled_once_and_used(tmp_path, monkeypatch):
    comp = CppCompiler(cache_dir=tmp_path)
    recorded = record_compilers(monkeypatch)
    src = _pointwise_source(0.5)  # the first kernel does not wait for the header: compiled whole
    launch = launcher_for(src.text, src.launch.symbol, 2, 1, compiler=comp, prelude=SHARED_PRELUDE)
    x, y = torch.randn(5), torch.empty(5)
    launch(x, y, 5)
    torch.testing.assert_close(y, x * 0.5)
    assert comp.precompiled_header(SHARED_PRELUDE, wait=True) is not None
    first = len(recorded)  # the first kernel's build and the header's, in its thread
    for scale in (1.5, 2.5):
        src = _pointwise_source(scale)
        launch = launcher_for(src.text, src.launch.symbol, 2, 1, compiler=comp, prelude=SHARED_PRELUDE)
        x, y = torch.randn(33), torch.empty(33)
        launch(x, y, 33)
        torch.testing.assert_close(y, x * scale)
    headers = [c for c in recorded if "c++-header" in c]
    kernels = [c for c in recorded[first:] if "-include" in c]
    assert len(headers) == 1 and len(kernels) == 2  # built once, used by both kernels
    [gch] = list((tmp_path / "cpu_cpp" / "pch").rglob("prelude.h.gch"))
    # the compiled text is the source less the prelude; the cached .cpp is the whole source
    src = _pointwise_source(1.5)
    shared, _ = shared_source(src.text, src.launch.symbol)
    assert comp.cache.path(comp.key(shared), ".cpp").read_text() == shared
    # a damaged precompiled header does not match its seal: not used, built again (meanwhile
    # kernels compile whole), still the right numbers (tests/cpu/test_precompiled_header_damage.py)
    gch.write_bytes(b"not a precompiled header")
    other = CppCompiler(cache_dir=tmp_path)
    assert other.precompiled_header(SHARED_PRELUDE) is None  # damaged: its build starts
    assert other.precompiled_header(SHARED_PRELUDE, wait=True) == gch.with_suffix("")
    assert gch.read_bytes() != b"not a precompiled header"
    src = _pointwise_source(3.5)
    launch = launcher_for(src.text, src.launch.symbol, 2, 1, compiler=other, prelude=SHARED_PRELUDE)
    x, y = torch.randn(9), torch.empty(9)
    launch(x, y, 9)
    torch.testing.assert_close(y, x * 3.5)


def test_a_source_that_does_not_open_with_the_prelude_compiles_whole():
    prelude = SharedPrelude("#include <cstdint>\nstatic inline int64_t twice(int64_t v) { return 2 * v; }")
    opening = "// header\n\n" + prelude.text + "\nint64_t f(int64_t v) { return twice(v); }\n"
    assert prelude.split(opening) == "// header\n\n\nint64_t f(int64_t v) { return twice(v); }\n"
    assert prelude.split("#define X 1\n" + prelude.text) is None  # code before it: not moved
    assert prelude.split("int main();\n") is None


def _linears(x, w1, w2, w3):
    """Three GEMM groups, the first two equal (one timing), the third of another shape."""
    h = torch.relu(F.linear(x, w1))
    h = torch.relu(F.linear(h, w2))
    return F.gelu(F.linear(h, w3))


def test_candidates_compile_before_timing_and_choose_as_serially(monkeypatch):
    """Every candidate kernel is compiled before the first timing; equal groups are timed
    once; the chosen candidates and the program's source are those of a serial compile
    (one load thread), timings being equal (a stand-in clock)."""
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    calls = []

    def fake_measure(runs, load, hints, target):
        builder = load.__self__
        for parts in runs.values():
            for part in parts:
                if hasattr(part, "source"):  # compiled by the builder's pool already
                    assert id(part.source) in builder._launchers, part.source.name
        group = id(runs["cpp_gemm"][0])  # a group's series time the same candidates
        calls.append(group)
        # the template wins the first distinct group, the extern the second
        first = calls[0] == group
        return {name: (1.0 if (name == "extern") != first else 2.0) for name in runs}
    monkeypatch.setattr(template_choice, "_measure", fake_measure)
    torch.manual_seed(0)
    args = (torch.randn(32, 40), torch.randn(40, 40), torch.randn(40, 40), torch.randn(24, 40))
    results = {}
    for threads in (1, 4):
        monkeypatch.setattr(CppEmitter, "load_threads", threads)
        calls.clear()
        program = fxwrap.lower(_linears, *args, target="cpu", options={"templates": "auto", "cache": False})
        choices = [ln for ln in program.lines if isinstance(ln, TemplateChoice)]
        assert [c.chosen for c in choices] == ["cpp_gemm", "cpp_gemm", "extern"]
        # the second group is the first's: timed once; the template's win confirmed by a second series
        assert len(set(calls)) == 2 and len(calls) == 2 + template_choice.CONFIRM
        torch.testing.assert_close(program.run(*args), _linears(*args), atol=1e-4, rtol=1e-4)
        results[threads] = (program.code(), [k.source for k in _kernels(program)])
    assert results[1] == results[4]


def _scripted_measure(ms_a: float, ms_b: float):
    """``_measure`` of two candidates whose every timed call takes the given times (a
    stand-in device clock); returns (times, how many timings were taken after the warm-ups,
    the order the candidates were timed in)."""
    ran, order = [], []

    def time_calls(fn, n, device):
        fn()  # the candidate's launcher says who it is
        order.append(ran[-1])
        return {"a": ms_a, "b": ms_b}[ran[-1]] * 1e-3  # per call
    target = types.SimpleNamespace(device=types.SimpleNamespace(time_calls=time_calls))
    runs = {name: [types.SimpleNamespace(source=name, lines=[types.SimpleNamespace(args=())])] for name in "ab"}
    times = template_choice._measure(runs, lambda source: lambda: ran.append(source), {}, target)
    warmups = 4  # each candidate: a warm-up and a single timed call first
    return times, len(order) - warmups, order[warmups:]


def test_timing_stops_early_only_when_one_candidate_is_clearly_faster():
    times, rounds, _ = _scripted_measure(1.0, 2.0)
    assert rounds == 2 * template_choice.MIN_ROUNDS
    assert times["a"] < times["b"]
    times, rounds, order = _scripted_measure(1.0, 1.1)  # close: every round
    assert rounds == 2 * template_choice.ROUNDS
    assert times["a"] < times["b"]
    # who goes first turns round by round: neither always runs right after the other
    assert order == ["a", "b", "b", "a"] * (template_choice.ROUNDS // 2) + ["a", "b"] * (template_choice.ROUNDS % 2)
