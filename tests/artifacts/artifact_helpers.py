"""Shared by the tests of saved programs and of the program cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import fxwrap

HERE = Path(__file__).resolve().parent
ROOT = Path(fxwrap.__file__).resolve().parent.parent

# what loading a program must never import
COMPILER_MODULES = ("torch._dynamo", "torch._functorch.aot_autograd", "torch._inductor", "sympy",
                    "fxwrap.core", "fxwrap.wrapper_ir", "fxwrap.plugins", "fxwrap.api",
                    "fxwrap.programs.program_cache", "fxwrap.targets.cpu_cpp.emitter", "fxwrap.targets.cuda_triton.emitter",
                    "fxwrap.targets.mps_metal.emitter", "fxwrap.targets.reference.emitter")
# a C++ compiler that does not exist: any kernel compile in the child process fails
NO_COMPILER = "fxwrap-test-no-such-compiler"


def prefixed(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def compiler_modules(modules, allowed=()) -> list[str]:
    return [m for m in modules if any(prefixed(m, c) for c in COMPILER_MODULES)
            and not any(prefixed(m, a) for a in allowed)]


def child_env(cache_dir: Path, **extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               FXWRAP_CACHE_DIR=str(cache_dir), CXX=NO_COMPILER)
    # TRITON_INTERPRET stays as tests/conftest.py set it: Triton's interpreter (the
    # triton-interpret target) needs it from triton's first import on
    env.update(extra)
    return env


def run_python(args, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, f"child failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return out


def load_in_fresh_process(program_file: Path, case: dict, tmp_path: Path, **env) -> dict:
    """Load and run ``program_file`` in a new interpreter with an empty cache dir and no
    C++ compiler; returns the child's report (its modules, its kernels' loaders)."""
    case_file = tmp_path / "case.pt"
    torch.save(case, case_file)
    cache = tmp_path / "fresh-cache"
    out = run_python([str(HERE / "load_and_run.py"), str(program_file), str(case_file)], child_env(cache, **env))
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # nothing was compiled into the fresh cache: no kernel cache entries, no Triton build dirs
    report["cache_files"] = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file()) \
        if cache.exists() else []
    return report


def compile_entries(report: dict) -> list[str]:
    """Files a compile would have left in the child's cache dir (the kernel caches)."""
    return [f for f in report["cache_files"] if f.split(os.sep)[0] in ("cpu_cpp", "programs")]
