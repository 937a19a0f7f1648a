"""A program's kernels compile in a few translation units (``CppCompiler.compile_many``),
not one compiler process each: a process costs a start, the prelude's parse and a link,
which for most kernels is more than their own code (Llama, cold cache, 2 cores: 26 compiler
processes -> 5, the first call 11.3 s -> 7.0 s on a loaded machine)."""
from __future__ import annotations

import ctypes
import os
import pickle

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallKernel
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.host import compiler as compiler_module
from shared_helpers import record_compilers
from fxwrap.targets.host.compiler import CompileError, CppCompiler, SharedPrelude
from fxwrap.targets.host.loader import kernel_loader
from fxwrap.targets.host.saved import SharedObjectLoader, bind_c_kernel


def _kernel_builds(commands: list) -> list:
    """The commands that compile kernels: not the version check, the precompiled header
    or the launch binding (which includes Python's headers)."""
    return [c for c in commands if "--version" not in c and "c++-header" not in c
            and not any(a.startswith("-I") for a in c)]


class Mixed(torch.nn.Module):
    """Linear layers of other widths, each with its own activation: a distinct epilogue kernel each."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(24, 40), torch.nn.Linear(40, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.tanh(self.b(h)) * 1.5
        h = torch.sigmoid(self.c(h)) + x[:, :16]
        return h.softmax(-1), h.sum(0)


def test_a_programs_kernels_compile_in_as_many_units_as_load_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("FXWRAP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(CppEmitter, "load_threads", 2)
    commands = record_compilers(monkeypatch)
    torch.manual_seed(0)
    model, x = Mixed(), torch.randn(12, 24)
    program = fxwrap.lower(model, x, target="cpu", options={"templates": "off", "cache": False})
    kernels = [ln.kernel for ln in program.lines if isinstance(ln, CallKernel)]
    sources = {k.source.split("\n", 1)[1] for k in kernels}
    assert len(sources) >= 4
    builds = _kernel_builds(commands)
    assert len(builds) == 2, [c[-3:] for c in builds]  # one per unit, none per kernel
    assert not [c for c in commands if "c++-header" in c]  # units do not start the header's build
    # each kernel's cache entry is a link to its unit's shared object
    libraries = [k.launcher().library for k in kernels]
    assert len({os.stat(lib).st_ino for lib in libraries}) == 2
    for got, want in zip(program.run(x), model(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # a second program of the same kernels: all in the cache, no compiler
    commands.clear()
    again = fxwrap.lower(model, x, target="cpu", options={"templates": "off", "cache": False})
    assert _kernel_builds(commands) == []
    for got, want in zip(again.run(x), model(x)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # saved: the kernels of a unit carry one bytes object (a pickle stores it once) ...
    loaders = [SharedObjectLoader.of(lib, bind_c_kernel, kernel_loader) for lib in libraries]
    assert len({id(loader.binary) for loader in loaders}) == 2
    assert len(pickle.dumps(loaders)) < 2.5 * max(len(loader.binary) for loader in loaders)
    # ... and each binds its own symbol in the unit's binary
    program.save(tmp_path / "mixed.fxw")
    loaded = fxwrap.load(tmp_path / "mixed.fxw")
    x2 = torch.randn(12, 24)
    for got, want in zip(loaded.run(x2), model(x2)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


PRELUDE = SharedPrelude("#include <cstdint>\nstatic inline float twice(float v) { return 2.0f * v; }")


def _source(name: str, body: str) -> str:
    return (f"// fxwrap kernel {name}\n{PRELUDE.text}\n"
            f'extern "C" void {name}(const float* x, float* y, int64_t n) {{ for (int64_t i = 0; i < n; ++i) {body} }}\n')


def test_a_unit_that_does_not_build_leaves_each_kernel_to_compile_alone(tmp_path, monkeypatch):
    commands = record_compilers(monkeypatch)
    comp = CppCompiler(cache_dir=tmp_path)
    good = [_source(f"k{i}", f"y[i] = twice(x[i]) + {i}.0f;") for i in range(3)]
    bad = _source("k9", "y[i] = no_such_function(x[i]);")
    comp.compile_many([*good, bad], PRELUDE, units=1)
    assert len(_kernel_builds(commands)) == 1  # the unit, which failed: nothing cached
    assert all(comp.cache.lookup(comp.key(s)) is None for s in [*good, bad])
    for i, src in enumerate(good):  # each alone: right numbers
        fn = getattr(ctypes.CDLL(str(comp.compile(src, prelude=PRELUDE))), f"k{i}")
        x, y = torch.randn(7), torch.empty(7)
        fn(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()), ctypes.c_int64(7))
        torch.testing.assert_close(y, 2 * x + i)
    with pytest.raises(CompileError, match="no_such_function"):  # alone, its error names it
        comp.compile(bad, prelude=PRELUDE)


def test_units_split_the_sources_evenly_and_deterministically():
    items = [(f"k{i}", "x" * size) for i, size in enumerate([900, 100, 500, 400, 300, 200])]
    groups = compiler_module._balanced(items, 2)
    # largest first, each to the lighter group: 900+300 and 500+400+200+100, in the items' order
    assert [[k for k, _ in g] for g in groups] == [["k0", "k4"], ["k1", "k2", "k3", "k5"]]
    assert compiler_module._balanced(items, 2) == groups
    assert len(compiler_module._balanced(items, 10)) == 6
