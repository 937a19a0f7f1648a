"""A damaged precompiled prelude header (``cpu_cpp/pch/.../prelude.h.gch``) in the kernel
cache is found, said, and built again, as a damaged kernel ``.so`` is (``host.cache``).

Before: a cut header made g++ fail with "cannot read PCH file" on every kernel, which then
compiled a second time without it, in every later process, and nothing rebuilt the header;
a header with bytes changed was handed to g++ as it was.  Each process here is a fresh one
sharing one new cache directory, as a user's runs share ``FXWRAP_CACHE_DIR``."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# compiles a program whose kernel bakes in ``scale`` (so every run compiles a new kernel),
# checks it against eager on fresh random inputs, then waits for the header's build
CHILD = textwrap.dedent("""
    import sys
    import torch
    import fxwrap
    from fxwrap.targets.cpu_cpp.emitter import SHARED_PRELUDE
    from fxwrap.targets.host.compiler import default_compiler

    scale = float(sys.argv[1])

    def f(x, y):
        return torch.relu(x * scale + y).sum(1) + torch.tanh(y).mean(1)

    gen = torch.Generator().manual_seed(int(scale * 1000))
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 8, generator=gen)
    program = fxwrap.lower(f, x, y, target="cpu", options={"cache": False})
    for _ in range(2):
        x2, y2 = torch.randn(16, 8, generator=gen), torch.randn(16, 8, generator=gen)
        torch.testing.assert_close(program.run(x2, y2), f(x2, y2))
    print("HEADER", default_compiler().precompiled_header(SHARED_PRELUDE, wait=True))
""")


def _run(tmp_path: Path, cache: Path, scale: float) -> tuple[subprocess.CompletedProcess, list[str]]:
    """A fresh process compiling with ``cache``; also the compiler commands it ran."""
    log = tmp_path / f"cxx-{scale}.log"
    cxx = tmp_path / "cxx.sh"  # g++, each command line written to $CXX_LOG first
    cxx.write_text('#!/bin/sh\nprintf "%s\\n" "$*" >> "$CXX_LOG"\nexec g++ "$@"\n')
    env = dict(os.environ, FXWRAP_CACHE_DIR=str(cache), CXX=f"sh {cxx}", CXX_LOG=str(log), OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", CHILD, str(scale)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and "HEADER /" in result.stdout, result.stderr[-3000:]
    return result, log.read_text().splitlines() if log.exists() else []


def _damage(path: Path, mode: str) -> None:
    data = bytearray(path.read_bytes())
    if mode == "truncate":
        path.write_bytes(bytes(data[:len(data) // 2]))
        return
    rng = random.Random(mode)
    for _ in range(max(1, len(data) // 4096)):  # a byte in every 4 KiB, at seeded positions
        data[rng.randrange(len(data))] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("mode", ["truncate", "flip"])
def test_a_damaged_precompiled_header_is_rebuilt(tmp_path, mode):
    cache = tmp_path / "cache"
    _run(tmp_path, cache, 1.5)  # fills the cache, header included
    [gch] = list((cache / "cpu_cpp" / "pch").rglob("prelude.h.gch"))
    seal = gch.with_name(gch.name + ".sha256")
    assert seal.read_text() == hashlib.sha256(gch.read_bytes()).hexdigest()
    _damage(gch, mode)

    result, commands = _run(tmp_path, cache, 2.5)  # the right numbers, and the header built again
    assert any("c++-header" in c for c in commands), commands
    assert not any("-include" in c for c in commands), commands  # never compiled with the damaged one
    assert seal.read_text() == hashlib.sha256(gch.read_bytes()).hexdigest()
    assert "precompiled header" in result.stderr and "is damaged" in result.stderr, result.stderr[-3000:]

    result, commands = _run(tmp_path, cache, 3.5)  # later processes compile with the rebuilt header
    assert "damaged" not in result.stderr, result.stderr[-3000:]
    kernels = [c for c in commands if ".so" in c.split()[-1]]
    assert kernels and all("-include" in c for c in kernels), commands  # no second compile without it
    assert not any("c++-header" in c for c in commands), commands
