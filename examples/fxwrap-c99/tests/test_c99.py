"""The C99 example target: a dialect of fxwrap's C-family engine, not of its C++ emitter.
Its kernels are strict C99 with the target's own helper prefix and calling convention."""
import pathlib
import re
import subprocess

import torch
import torch.utils._pytree as pytree

import fxwrap
from fxwrap_c99.emitter import C99Emitter


def _kernels(program):
    return [line.kernel for line in program.lines if type(line).__name__ == "DefineKernel"]


def f(x, i):
    return ((x.relu() * 2).sum(-1), x.softmax(-1), x.argmin(1), torch.var_mean(x, 1),
            x.cumsum(1), x.cummin(1), (i // 3) % 4, i << 2, x[i.clamp(0, 4)], x.erfinv())


def test_c99_numbers_and_source(tmp_path):
    x = torch.randn(5, 9)
    x[1, 3] = float("nan")
    i = torch.randint(-20, 20, (5, 9))
    program = fxwrap.lower(f, x, i, target="c99")
    for got, expected in zip(pytree.tree_leaves(program(x, i)), pytree.tree_leaves(f(x, i)), strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True)
    kernels = _kernels(program)
    assert len(kernels) >= 3
    for k in kernels:
        body = k.source.split("\nvoid ", 1)[1]  # the kernel function, after the prelude
        assert "(void *const *buffers, const int64_t *sizes)" in body.splitlines()[0]
        assert "fx_" not in body and "static_cast" not in body and "std::" not in body
        path = tmp_path / f"{k.name}.c"
        path.write_text(k.source)  # strict C99: no GNU extension, no implicit declaration
        cmd = ["cc", "-std=c99", "-pedantic-errors", "-Werror=implicit-function-declaration", "-c", str(path),
               "-o", str(tmp_path / "k.o")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_c99_is_a_dialect_of_the_engine_not_of_cpp():
    assert fxwrap.CStyleEmitter in C99Emitter.__mro__ and not issubclass(C99Emitter, fxwrap.CppEmitter)
    own = {name for name, _ in vars(C99Emitter).items() if not name.startswith("__")}
    assert own <= {"language", "prefix", "prelude", "code_for_op", "supported_dtypes", "function_head",
                   "render_body", "load"}


def test_the_documented_kernel():
    """docs/adding-a-device.md shows this kernel (after ``<!-- c99-kernel -->``): render it again."""
    doc = (pathlib.Path(__file__).resolve().parents[3] / "docs" / "adding-a-device.md").read_text()
    shown = re.search(r"<!-- c99-kernel -->\n```c\n(.*?)```", doc, flags=re.S).group(1)
    program = fxwrap.lower(lambda x: (x.relu() * x).sum(-1), torch.randn(4, 8), target="c99")
    (kernel,) = _kernels(program)
    assert "\nvoid " + kernel.source.split("\nvoid ", 1)[1] == "\n" + shown


def test_work_item_schedule_gives_eagers_numbers(monkeypatch):
    """The schedule hook (``CStyleEmitter.work_item_index``): the C99 dialect made
    grid-parallel by one attribute, its kernels one row per work item (no row loop) and a
    launcher calling each over ``launch.grid`` items; numbers as eager's."""
    import ctypes

    import sympy

    from fxwrap.targets.host.loader import load_library
    from fxwrap_c99 import emitter

    def head(self, kernel, cname):
        return f"void {cname}(void *const *buffers, const int64_t *sizes, const int64_t item)"

    def load(self, source):
        fn = getattr(load_library(emitter._compiler().compile(source.text)), source.launch.symbol)
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        pointers, names = source.launch.pointers, source.launch.size_symbols
        items = sympy.sympify(source.launch.grid)

        def launch(*args):
            bufs = (ctypes.c_void_p * pointers)(*[t.data_ptr() for t in args[:pointers]])
            sizes = [int(s) for s in args[pointers:]]
            dims = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
            n = int(items.xreplace({s: sizes[names.index(s.name)] for s in items.free_symbols}))
            for item in range(n):
                fn(bufs, dims, item)
        return launch

    monkeypatch.setattr(C99Emitter, "work_item_index", "item")
    monkeypatch.setattr(C99Emitter, "function_head", head)
    monkeypatch.setattr(C99Emitter, "load", load)
    torch._dynamo.reset()
    x = torch.randn(5, 9)
    x[1, 3] = float("nan")
    i = torch.randint(-20, 20, (5, 9))
    program = fxwrap.lower(f, x, i, target="c99", options={"cache": False})
    for got, expected in zip(pytree.tree_leaves(program(x, i)), pytree.tree_leaves(f(x, i)), strict=True):
        torch.testing.assert_close(got, expected, equal_nan=True)
    kernels = _kernels(program)
    assert len(kernels) >= 3
    for k in kernels:
        assert "const int64_t xindex = item;" in k.source and "for (int64_t xindex" not in k.source


def test_a_saved_c99_program_names_the_c99_package(tmp_path):
    """The C99 target reuses fxwrap's WrapperCodegen and CpuDevice: the saved file still names
    its plugin's package (read off the emitter), not fxwrap, for a load without the plugin."""
    import json
    import zipfile

    x = torch.randn(4, 5)
    torch._dynamo.reset()
    fxwrap.lower(lambda t: t.sin() + 1, x, target="c99").save(tmp_path / "p.fxwrap")
    header = json.loads(zipfile.ZipFile(tmp_path / "p.fxwrap").read("header.json"))
    assert header["target_package"] == {"module": "fxwrap_c99", "distribution": "fxwrap-c99"}


def test_a_copy_the_dialect_cannot_render_falls_back_with_its_writer():
    """Fuzz seeds 920044 and 70 more (c99, on the H200 machine's CPU): a bf16 gather's
    backward is ``scatter_add(zeros, ...)``; C99 has no bf16, so the zeros became an ATen
    call, but the kernel copying them into scatter_add's result (which it then writes in
    place) named only the zeros' node, and the compile failed with "dtype torch.bfloat16
    has no c type".  The writer now runs as the functional ATen call it is."""
    torch._dynamo.reset()

    def f(x, i):
        return torch.gather(torch.flip(x, (0,)), 0, i)

    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, generator=g).bfloat16().requires_grad_()
    i = torch.randint(0, 6, (4,), generator=g)
    ref = x.detach().clone().requires_grad_()
    w = torch.randn(4, generator=g).bfloat16()
    (torch.compile(f, backend=fxwrap.Backend("c99"))(x, i) * w).sum().backward()
    (f(ref, i) * w).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


class GeluC99Emitter(C99Emitter):
    """The C99 dialect with an exact GELU of its own (an intrinsic, spelled with the C type)."""

    prelude = C99Emitter.prelude + (
        "\nstatic inline float my_gelu_float(float x)\n"
        "{\n  const double v = x;\n  return (float)(0.5 * v * (1.0 + erf(v * 0.7071067811865476)));\n}\n")
    intrinsics = (fxwrap.Intrinsic("my_gelu", "my_gelu_{t}({0})", replaces=torch.ops.aten.gelu.default,
                                   when={"approximate": "none"}),)


def test_an_intrinsic_of_the_c99_dialect(tmp_path):
    """The engine renders a dialect's intrinsic through its spelling: ``gelu(sin(x)) * y`` is
    one strict-C99 kernel calling ``my_gelu_float``; numbers as eager's."""
    target = fxwrap.Target("c99-gelu", "cpu", fxwrap.CpuDevice(), GeluC99Emitter, priority=-20)
    x, y = torch.randn(6, 11), torch.randn(6, 11)
    program = fxwrap.lower(lambda a, b: torch.nn.functional.gelu(a.sin()) * b, x, y, target=target)
    (kernel,) = _kernels(program)
    body = kernel.source.split("\nvoid ", 1)[1]
    assert re.search(r"= my_gelu_float\(tmp\d+\);", body) and "erf" not in body, body
    torch.testing.assert_close(program.run(x, y), torch.nn.functional.gelu(x.sin()) * y)
    path = tmp_path / "k.c"
    path.write_text(kernel.source)
    proc = subprocess.run(["cc", "-std=c99", "-pedantic-errors", "-c", str(path), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
