"""C kernels launch through one compiled binding (``targets/host/trampoline.py``), not ctypes:
the launcher of every C++ kernel of a program is a ``fxwrap.Launcher``; it gives the same
numbers as the ctypes launcher (tensors at storage offsets, sizes past 32 bits); a wrong
argument raises ``TypeError`` naming the kernel before the kernel runs."""
from __future__ import annotations

import pytest
import torch

import fxwrap
from fxwrap.targets.host.loader import launcher_for, make_launcher
from fxwrap.targets.host.trampoline import MAX_ARGS

SOURCE = """extern "C" void axpb(const float* x, const float* y, float* out, long long n, long long k) {
    for (long long i = 0; i < n; ++i) out[i] = x[i] + y[i] * (float)(k % 1009);
}"""


def _both():
    fast = launcher_for(SOURCE, "axpb", pointers=3, sizes=2)
    slow = make_launcher(fast.c_function, 3, 2, name="axpb", trampoline=False)
    return fast, slow


def test_trampoline_equals_ctypes():
    fast, slow = _both()
    assert type(fast).__name__ == "Launcher" and type(slow).__name__ == "function"
    base = torch.randn(40)
    x, y = base[3:23], torch.randn(20)  # x at a storage offset
    for n, k in ((20, 5), (13, (1 << 40) + 77), (0, 3)):
        want, got = torch.full((20,), float("nan")), torch.full((20,), float("nan"))
        slow(x, y, want, n, k)
        fast(x, y, got, n, k)
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
        assert torch.equal(got[:n], x[:n] + y[:n] * float(k % 1009))


def test_wrong_arguments_raise_before_the_kernel_runs():
    fast, _ = _both()
    x, y, out = torch.randn(4), torch.randn(4), torch.zeros(4)
    with pytest.raises(TypeError, match="kernel axpb: argument 2 is a NoneType, not a tensor"):
        fast(x, y, None, 4, 1)
    with pytest.raises(TypeError, match="kernel axpb takes 3 tensors and 2 sizes, got 4 arguments"):
        fast(x, y, out, 4)
    with pytest.raises(TypeError):
        fast(x, y, out, "four", 1)
    assert torch.equal(out, torch.zeros(4))


def test_too_many_arguments_keep_ctypes():
    fast, _ = _both()
    assert type(make_launcher(fast.c_function, MAX_ARGS, 1, name="wide")).__name__ == "function"
    assert type(make_launcher(fast.c_function, MAX_ARGS - 1, 1, name="widest")).__name__ == "Launcher"


def test_program_kernels_launch_through_the_binding():
    def f(x, w):
        return torch.softmax(x @ w, -1) * x.sum()

    x, w = torch.randn(8, 16), torch.randn(16, 16)
    program = fxwrap.lower(f, x, w, target="cpu", options={"cache": False})
    kernels = [n.target for n in program.runner.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert kernels and all(type(k.launcher()).__name__ == "Launcher" for k in kernels)
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    torch.testing.assert_close(program.run(x, w), f(x, w), rtol=1e-4, atol=1e-4)


def test_subclasses_and_parameters():
    """A ``Parameter`` is read as a tensor; another tensor subclass through its own ``data_ptr()``."""
    class Tagged(torch.Tensor):
        pass

    fast, slow = _both()
    x, y = torch.nn.Parameter(torch.randn(6), requires_grad=False), torch.randn(6).as_subclass(Tagged)
    want, got = torch.zeros(6), torch.zeros(6)
    slow(x, y, want, 6, 3)
    fast(x, y, got, 6, 3)
    assert torch.equal(got, want) and torch.equal(got, x.detach() + y.as_subclass(torch.Tensor) * 3)


def test_every_python_extension_is_built_on_the_one_skeleton():
    """fxwrap's C extensions (this trampoline, the CUDA launch binding) write their module
    boilerplate through ``trampoline.extension_source``: no other file of the package spells
    ``PyModuleDef`` or ``PyInit_``, and each source has the one module it names."""
    from pathlib import Path

    from fxwrap.targets.cuda_triton import native_launch
    from fxwrap.targets.host import trampoline

    package = Path(fxwrap.__file__).parent
    spelled = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                     if "PyModuleDef" in p.read_text() or "PyInit_" in p.read_text())
    assert spelled == ["targets/host/trampoline.py"]
    for module in (trampoline, native_launch):
        text = module.source()
        assert text.count("PyMODINIT_FUNC PyInit_") == 1 and f"PyInit_{module._MODULE}(void)" in text
        assert text.count("#include <Python.h>") == 1 and trampoline.TENSOR_READ in text
