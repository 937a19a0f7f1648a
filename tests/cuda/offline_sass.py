"""The machine code of a GPU kernel without a GPU: a ``fxwrap.Kernel`` rendered for the ``cuda``
plans (``fxwrap.testing.offline_cuda``) compiled by Triton's NVIDIA backend for sm_90 (an H100 /
H200) and disassembled with the ``cuobjdump`` Triton ships, so a test can count what a kernel
executes per element::

    (program,) = offline_programs(lambda x: x.argmax(-1), torch.empty(4096, 32000, dtype=torch.bfloat16))
    sass = sm90_sass(kernels([program])[0])
    row_loop_instructions(sass)   # 67: the SASS instructions of one step of the row loop

``unavailable()`` says why this cannot run here (no NVIDIA backend or tools in the Triton
install), for a skip with the reason.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

import triton

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError as error:  # an older Triton: no offline targets
    GPUTarget = ASTSource = None
    API_MISSING = f"this Triton has no compiler API for offline targets ({error})"
else:
    API_MISSING = None

TRITON_TYPES = {"torch.float32": "*fp32", "torch.bfloat16": "*bf16", "torch.float16": "*fp16",
                "torch.int64": "*i64", "torch.int32": "*i32", "torch.int8": "*i8"}
_INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def _cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def unavailable() -> str | None:
    """Why sm_90 code cannot be built here, or None."""
    if API_MISSING:
        return API_MISSING
    if not os.path.exists(_cuobjdump()):
        return f"Triton's NVIDIA backend ships no cuobjdump ({_cuobjdump()})"
    return None


def sm90_sass(kernel) -> str:
    """The SASS of ``kernel``'s main function (the one its launch names) at its first config,
    pointers 16-byte aligned as Triton's launcher specializes them.  Compiled in a fresh
    process without ``TRITON_INTERPRET``: where the interpreter is on, Triton's own jitted
    functions are the interpreter's and cannot be compiled."""
    launch = kernel.launch
    if launch.size_symbols:
        raise ValueError(f"kernel {kernel.name} takes size arguments {launch.size_symbols}: "
                         "sm90_sass compiles kernels of static sizes only")
    config = dict(launch.config)
    num_warps = config.pop("num_warps")
    dtypes = list(launch.pointer_dtypes) + list(launch.workspace_dtypes or ())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{launch.symbol}.py")
        with open(path, "w") as f:
            f.write(kernel.source)
        cubin = os.path.join(folder, "kernel.cubin")
        job = {"path": path, "symbol": launch.symbol, "config": config, "num_warps": num_warps,
               "pointer_types": [TRITON_TYPES[d] for d in dtypes], "cubin": cubin}
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        subprocess.run([sys.executable, __file__, json.dumps(job)], env=env, check=True)
        return subprocess.run([_cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout


def _compile(job: dict) -> None:
    """Compile ``job["symbol"]`` of the module at ``job["path"]`` for sm_90 into ``job["cubin"]``."""
    spec = importlib.util.spec_from_file_location(job["symbol"], job["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, job["symbol"])
    config, pointers = job["config"], iter(job["pointer_types"])
    signature = {name: "constexpr" if name in config else next(pointers) for name in fn.arg_names}
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(n),): v for n, v in config.items()},
                       attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                              if signature[n].startswith("*")})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": job["num_warps"]})
    with open(job["cubin"], "wb") as f:
        f.write(compiled.asm["cubin"])


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of every instruction."""
    return [(int(m.group(1), 16), m.group(2).strip()) for m in map(_INSTRUCTION.match, sass.splitlines()) if m]


def row_loop_instructions(sass: str) -> int | None:
    """The instructions of the kernel's loop (from a backward branch's target to the branch),
    the longest if there are several; None without a loop."""
    code = instructions(sass)
    longest = None
    for address, text in code:
        branch = re.search(r"BRA (0x[0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            n = sum(1 for a, _ in code if int(branch.group(1), 16) <= a <= address)
            longest = n if longest is None else max(longest, n)
    return longest


if __name__ == "__main__":
    _compile(json.loads(sys.argv[1]))
