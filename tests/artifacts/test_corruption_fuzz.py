"""Every file fxwrap reads back is untrusted: a corruption fuzzer.

* Cache files (``FXWRAP_CACHE_DIR``): a process fills the cache; every file of one kind
  (kernel sources and binaries, launch trampolines, whole programs, warm-start graphs,
  template timings) is cut in half or has bytes flipped; a new process compiles the same
  model again and must give eager's numbers (a damaged entry is a miss and a rebuild), with
  no raw exception.
* A saved program: bytes flipped or the file cut at seeded positions; ``fxwrap.load`` must
  raise ``ProgramFileError`` or give a program that computes eager's numbers.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fxwrap

CHILD = Path(__file__).with_name("corruption_child.py")

# (folder under the cache root, file suffix): every kind of file the CPU target's compile writes
# (the precompiled prelude header, cpu_cpp/pch, is built in the background and is not
# always there when a small compile ends: not in this list; tests/cpu/test_precompiled_header_damage.py
# waits for it, damages it and checks that it is built again)
KINDS = [("cpu_cpp", ".cpp"), ("cpu_cpp", ".so"), ("cpu_cpp", ".sha256"), ("launch", ".so"), ("launch", ".cpp"),
         ("programs", ".pkl"), ("graphs", ".pkl"), ("templates", ".json")]


def _child(cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, FXWRAP_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    for name in ("FXWRAP_PROGRAM_CACHE", "FXWRAP_TEMPLATES"):  # tests/conftest.py turns them off; here they are on
        env.pop(name, None)
    return subprocess.run([sys.executable, str(CHILD)], env=env, capture_output=True, text=True, timeout=600)


def _damage(path: Path, mode: str, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if mode == "truncate":
        path.write_bytes(bytes(data[:len(data) // 2]))
        return
    for _ in range(max(1, len(data) // 512)):  # flip a byte in every 512, at seeded positions
        at = rng.randrange(len(data))
        data[at] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("cache-filled")
    result = _child(cache)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
    return cache


@pytest.mark.parametrize("mode", ["truncate", "flip"])
@pytest.mark.parametrize("folder,suffix", KINDS, ids=[f"{f}{s}" for f, s in KINDS])
def test_a_damaged_cache_file_is_a_miss_and_a_rebuild(filled_cache, tmp_path, folder, suffix, mode):
    cache = tmp_path / "cache"
    import shutil
    shutil.copytree(filled_cache, cache)
    files = sorted(p for p in (cache / folder).rglob(f"*{suffix}") if p.is_file())
    assert files, f"the compile wrote no {folder}/*{suffix} file: {sorted(str(p) for p in cache.rglob('*'))[:20]}"
    rng = random.Random(f"{folder}{suffix}{mode}")
    for path in files:
        _damage(path, mode, rng)
    result = _child(cache)
    assert result.returncode == 0 and "OK" in result.stdout, \
        f"{len(files)} damaged {folder}/*{suffix} files ({mode}):\n{result.stderr[-4000:]}"


def _saved_program(tmp_path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    program = fxwrap.lower(model, x, options={"cache": False})
    path = tmp_path / "model.fxwrap"
    program.save(path)
    return path, x, model(x).detach()


def test_a_damaged_saved_program_is_a_program_file_error_or_right(tmp_path):
    path, x, expected = _saved_program(tmp_path)
    data = path.read_bytes()
    rng = random.Random(37)
    raw = []
    damaged = [("cut", data[:n]) for n in sorted({0, 1, 30, len(data) // 3, len(data) // 2, len(data) - 1})]
    for at in sorted(rng.sample(range(len(data)), 40)):
        flipped = bytearray(data)
        flipped[at] ^= 0xFF
        damaged.append((f"flip@{at}", bytes(flipped)))
    for what, blob in damaged:
        try:
            loaded = fxwrap.programs.artifacts.loads(blob, origin=f"model.fxwrap ({what})")
            torch.testing.assert_close(loaded.run(x), expected)
        except fxwrap.ProgramFileError:
            pass
        except Exception as exc:  # noqa: BLE001  (what the test counts)
            raw.append(f"{what}: {type(exc).__name__}: {exc}"[:300])
    assert not raw, "\n".join(raw)


def test_a_changed_kernel_source_inside_a_valid_file_is_named(tmp_path):
    """The archive intact (its CRC right), the pickled kernel source changed: the kernel's
    saved digest catches it (before: ``undefined symbol: fxwrap_...`` from the compiler)."""
    import io
    import zipfile
    path, x, _ = _saved_program(tmp_path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    payload = members["program.pkl"]
    at = payload.index(b"fxwrap kernel ") + len(b"fxwrap kernel ")  # the first kernel's source comment
    members["program.pkl"] = payload[:at] + (b"X" if payload[at:at + 1] != b"X" else b"Y") + payload[at + 1:]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, blob in members.items():
            archive.writestr(name, blob)
    with pytest.raises(fxwrap.ProgramFileError, match=r"program.pkl is damaged: kernel fxwrap_\w+ .*is damaged"):
        fxwrap.programs.artifacts.loads(buffer.getvalue(), origin="model.fxwrap")
