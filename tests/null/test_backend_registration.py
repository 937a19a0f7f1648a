"""``backend="fxwrap"`` is registered with dynamo race-free once fxwrap is imported
(fxwrap/registration.py): torch's own first lookup, from the entry point, checks then
registers, and 3 of 4 threads compiling at once failed with ``duplicate name: fxwrap``."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

THREADS = textwrap.dedent("""
    import sys, threading, torch
    {imports}
    n = 8; barrier = threading.Barrier(n); errors = []
    def work(i):
        x = torch.randn(16) + i
        barrier.wait()
        try:
            got = torch.compile(lambda t: t.sin() * 2 + 1, backend="fxwrap")(x)
            torch.testing.assert_close(got, x.sin() * 2 + 1)
        except Exception as e:
            errors.append(f"{{type(e).__name__}}: {{e}}")
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    [t.start() for t in threads]; [t.join() for t in threads]
    print("ERRORS", errors)
""")


def _run(code: str, tmp_path) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "FXWRAP_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_eight_threads_compile_with_the_backend_name_at_once_after_import_fxwrap(tmp_path):
    out = _run(THREADS.format(imports="import fxwrap"), tmp_path)
    assert "ERRORS []" in out, out


def test_eight_threads_after_dynamo_was_loaded_before_fxwrap(tmp_path):
    out = _run(THREADS.format(imports="import torch._dynamo\nimport fxwrap"), tmp_path)
    assert "ERRORS []" in out, out


def test_import_fxwrap_loads_no_dynamo_and_registers_when_dynamo_loads(tmp_path):
    out = _run(textwrap.dedent("""
        import sys, torch, fxwrap
        print("DYNAMO_AFTER_IMPORT", "torch._dynamo" in sys.modules)
        from torch._dynamo.backends import registry
        print("REGISTERED", registry._COMPILER_FNS.get("fxwrap") is fxwrap.registration.dynamo_backend)
    """), tmp_path)
    assert "DYNAMO_AFTER_IMPORT False" in out and "REGISTERED True" in out, out


def test_a_single_thread_needs_no_import(tmp_path):
    """The entry point path (torch registers the name itself on its first lookup)."""
    out = _run(textwrap.dedent("""
        import torch
        x = torch.randn(8)
        got = torch.compile(lambda t: t.cos() - 1, backend="fxwrap")(x)
        torch.testing.assert_close(got, x.cos() - 1)
        print("OK")
    """), tmp_path)
    assert "OK" in out
