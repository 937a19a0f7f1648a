"""Helpers shared by several test folders: a per-test fresh state, random inputs in the four layouts of the
differential tests, the kernels of compiled programs, and builders of hand-made ``ScheduledKernel`` objects.

Importable by name (``import shared_helpers``) from any test: ``tests/`` is on
``sys.path`` through ``tests/conftest.py``.  The folders' own helper modules
(``emitter_helpers``, ``triton_helpers``) re-export these with their device.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import sympy
import torch
import torch._dynamo

import fxwrap
from fxwrap.targets.host import compiler as compiler_module
from fxwrap.ir.loops import Op, ScheduledKernel
from fxwrap.core.numerics import legalize
from fxwrap.ir.symbolic import evaluate
from fxwrap.testing.suite import fresh_state  # noqa: F401  (the folders' conftest.py register it)
from fxwrap.ir.lines import Buffer

CPU = torch.device("cpu")


def random_input(layout: str, dtype=torch.float32, shape=(37, 65), scale=1.0, device=None):
    """A fresh random 2-D input of ``shape``, laid out as asked (``contiguous``,
    ``transposed``, ``sliced``, or ``broadcast``: stride 0 along dim 0), in ``dtype`` on
    ``device`` (None: CPU, and no copy for float32)."""
    n, m = shape
    if layout == "contiguous":
        t = torch.randn(n, m)
    elif layout == "transposed":
        t = torch.randn(m, n).t()
    elif layout == "sliced":
        t = torch.randn(n + 3, 2 * m)[2:n + 2, ::2]
    else:  # broadcast: stride 0 along dim 0
        t = torch.randn(1, m).expand(n, m)
    return (t * scale).to(device=device, dtype=dtype)


@contextlib.contextmanager
def target_registered(target):
    """A plugin manager with the registered targets and ``target`` besides, in use inside the
    block (a test's own target, defined in the test file)."""
    from fxwrap.plugins.manager import PluginManager, use_plugin_manager
    manager = PluginManager().load()
    manager.targets[target.name] = target
    with use_plugin_manager(manager):
        yield manager


def defined_kernels(program) -> list:
    """The ``KernelSource`` of each kernel ``program`` defines, in its lines' order."""
    return [line.kernel for line in program.lines if type(line).__name__ == "DefineKernel"]


def kernels(programs) -> list:
    """Every ``fxwrap.Kernel`` that the compiled ``programs`` launch, in order."""
    return [n.target for p in programs for n in p.graph_module.graph.nodes
            if isinstance(n.target, fxwrap.Kernel)]


def contiguous(size):
    """Row-major strides of ``size`` (sympy)."""
    strides, run = [], sympy.Integer(1)
    for n in reversed(size):
        strides.append(run)
        run = run * sympy.sympify(n)
    return tuple(reversed(strides))


def buf(name, size, dtype=torch.float32, stride=None, device=CPU) -> Buffer:
    size = tuple(sympy.sympify(n) for n in size)
    stride = tuple(sympy.sympify(s) for s in stride) if stride is not None else contiguous(size)
    return Buffer(name, size, stride, dtype, device)


def ld(name, index, dtype=torch.float32, mask=None) -> Op:
    """``Op.load`` of ``name`` at ``index`` (a sympy expression, or an Op: indirect)."""
    return Op.load(name, index, dtype, mask)


def const(value, dtype=torch.float32) -> Op:
    return Op.const(value, dtype)


def op(name, dtype, *args) -> Op:
    return Op(name, dtype, tuple(args))


def acc(name, dtype, field=0) -> Op:
    return Op.acc(name, field, dtype)


def kernel(name, inputs, outputs, stores, ranges=(), reduction_ranges=(), reductions=(),
           sizes=(), origins=("test: handmade",)) -> ScheduledKernel:
    return ScheduledKernel(name, tuple(inputs), tuple(outputs), tuple(sizes),
                           tuple(sympy.sympify(r) for r in ranges),
                           tuple(sympy.sympify(r) for r in reduction_ranges),
                           tuple(reductions), tuple(stores), tuple(origins))


def unary_float(x):
    """Every elementwise unary op of issue 3 on ``x`` (domains kept valid), one output each."""
    pos = x.abs() + 0.5
    unit = torch.tanh(x) * 0.9
    return (x.abs(), -x, x.exp(), torch.exp2(x), x.expm1(), pos.log(), pos.log2(), pos.log10(),
            x.abs().log1p(), pos.sqrt(), pos.rsqrt(), x.sin(), x.cos(), unit.tan(), unit.asin(),
            unit.acos(), x.atan(), x.sinh(), x.cosh(), x.tanh(), x.asinh(), (pos + 1).acosh(),
            unit.atanh(), x.erf(), x.erfc(), unit.erfinv(), (x * 3).floor(), (x * 3).ceil(),
            (x * 3).round(), (x * 3).trunc(), x.sigmoid(), x.sign(), pos.reciprocal(),
            torch.relu(x), torch.nn.functional.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"),
            torch.nn.functional.silu(x), torch.nn.functional.softplus(x), x.clamp(-0.5, 0.5),
            x.clamp_min(0.1), x.clamp_max(0.2), torch.isnan(x / x), torch.isinf(1 / (x * 0)),
            torch.signbit(x), torch.logical_not(x > 0), torch.nn.functional.hardtanh(x),
            torch.nn.functional.leaky_relu(x), torch.nn.functional.elu(x))


def build_with(em, k: ScheduledKernel, device=CPU):
    """Render ``k`` with emitter ``em`` and load it; returns ``(launcher, source)``.  The
    launcher takes the kernel's inputs, outputs and sizes and allocates the workspaces the
    source declares (``source.workspaces``) on ``device``, zeroed where declared, as a
    program's ``Allocate`` (and ``ZeroFill``) lines would."""
    src = em.render(legalize(k))  # explicit compute dtypes and 16-bit rounding, as the kernel builder does
    launcher = em.load(src)
    if not src.workspaces:
        return launcher, src
    n = len(k.inputs) + len(k.outputs)

    def with_workspaces(*args):
        sizes = {s: int(v) for s, v in zip(k.size_symbols, args[n:])}
        ws = [(torch.zeros if w.zeroed else torch.empty)(int(evaluate(w.numel, sizes)), dtype=w.dtype, device=device)
              for w in src.workspaces]
        return launcher(*args[:n], *ws, *args[n:])
    return with_workspaces, src


def in_two_processes(code: str, timeout: float = 600) -> tuple[str, str]:
    """Run ``code`` (Python that prints its result on its last line of stdout) in two fresh
    interpreters that share nothing: other ``PYTHONHASHSEED`` values (set and dict orders
    differ), each its own empty ``FXWRAP_CACHE_DIR`` (no cache hit makes them agree), the
    program cache off.  Returns the two last lines: what a determinism test compares."""
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    outs = []
    for seed in ("1", "2"):
        with tempfile.TemporaryDirectory(prefix="fxwrap-determinism-") as cache:
            env = dict(os.environ, PYTHONHASHSEED=seed, FXWRAP_CACHE_DIR=cache, FXWRAP_PROGRAM_CACHE="0",
                       PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests), os.environ.get("PYTHONPATH", "")]))
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  timeout=timeout, cwd=cache)
            assert done.returncode == 0, f"child failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
            outs.append(done.stdout.strip().splitlines()[-1])
    return outs[0], outs[1]


ROOT = Path(__file__).resolve().parents[1]


def run_child(script: Path, cache_dir, *args) -> dict:
    """Run test script ``script`` in a new process with its own ``FXWRAP_CACHE_DIR`` and the
    program cache on; the JSON its last line of output prints (a failed run fails the test with
    its stderr)."""
    env = dict(os.environ, FXWRAP_CACHE_DIR=str(cache_dir), FXWRAP_PROGRAM_CACHE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def record_compilers(monkeypatch) -> list:
    """Every compiler command fxwrap runs from now on (each process goes through
    ``targets.host.compiler.run_compiler``), recorded in the returned list as it runs."""
    commands = []
    run = compiler_module.run_compiler

    def recording_run(cmd, *args, **kwargs):
        commands.append(list(cmd))
        return run(cmd, *args, **kwargs)
    monkeypatch.setattr(compiler_module, "run_compiler", recording_run)
    return commands


def compiled_autograd_backward(device: str, width: int) -> list:
    """A loss's backward compiled by compiled autograd through fxwrap (its graph's inputs one
    list of tensors), its gradient checked against eager's; the programs it compiled."""
    from torch._dynamo import compiled_autograd
    torch.manual_seed(0)
    w = torch.randn(width, width, device=device, requires_grad=True)
    x = torch.randn(width // 2, width, device=device)

    def loss(a):
        return ((a @ w).sin() * 2).relu().sum()

    programs = []
    backend = fxwrap.Backend(options={"on_program": programs.append})
    try:
        with compiled_autograd._enable(torch.compile(backend=backend)):
            torch.compile(loss, backend=backend)(x).backward()
        got = w.grad.clone()
    finally:
        torch._dynamo.reset()
    w.grad = None
    loss(x).backward()
    torch.testing.assert_close(got, w.grad)
    return programs
