"""The check of one fuzz program: make its inputs, run it in eager and compiled, compare.

This module imports torch and fxwrap only: a reproducer file embeds its source
(``fxwrap.testing.fuzz.reproducer``), so a failure found by the fuzzer is checked by the
very code that found it.  A program is a Python module's namespace (see
``fxwrap.testing.fuzz.generator``) holding::

    SEED = 7
    DYNAMIC = False           # torch.compile(dynamic=True) where True
    BACKWARD = True           # gradients of the requires-grad inputs are compared too
    INPUTS = [("x0", (4, 8), torch.float32, "randn", None, "transposed", True), ...]
    BUFFERS = [("buf0", (8,), torch.float32, "randn", None, "contiguous", False)]
    class Program(torch.nn.Module): ...   # forward(self, x0, ...) returns a tuple

An input spec is ``(name, shape, dtype, kind, arg, layout, requires_grad)``: ``kind``
says how its values are drawn (``randn``; ``randint`` in ``[arg[0], arg[1])``; ``bool``;
``perm``, a permutation of ``range(shape[0])``) and ``layout`` how it sits in memory
(``contiguous``, ``transposed``: the last two dimensions swapped in storage, ``strided``:
every other element of the last dimension, ``offset``: a nonzero storage offset,
``expanded``: the first dimension broadcast with stride 0).

``check(ns, target)`` returns ``(status, message)``: status ``"pass"``, ``"mismatch"``
(wrong numbers: the worst), ``"compile_error"`` (the backend raised while compiling) or
``"runtime_error"`` (the compiled program raised when it ran) or ``"torch_error"`` (torch's
own ``aot_eager`` backend fails on the program too: not fxwrap's failure).  Floating results are
compared with per-dtype tolerances (a program that holds a bfloat16 value: bfloat16's for
every float result, ``loosest_dtype``), NaN-aware; where they differ beyond them, the
program is run again in float64 and the compiled result passes if it is no further from
that than eager is (its error is rounding, not a bug).  Integer and bool results must be
equal bit for bit.  A gradient that eager leaves None (no path from the input to an output)
may come back as zeros: AOTAutograd gives zeros where, say, a buffer is copied from the
input.
"""
from __future__ import annotations

import torch

import fxwrap

# (rtol, atol) by dtype; atol is scaled by the largest finite magnitude of eager's result
TOLERANCES = {torch.float32: (1e-3, 1e-4), torch.bfloat16: (4e-2, 4e-2), torch.float16: (1e-2, 1e-2),
              torch.float64: (1e-7, 1e-7)}


def _storage_shape(shape, layout):
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        return shape[:-2] + (shape[-1], shape[-2])
    if layout == "strided" and shape:
        return shape[:-1] + (2 * shape[-1],)
    if layout == "expanded" and shape:
        return (1,) + shape[1:]
    if layout == "offset":
        numel = 1
        for size in shape:
            numel *= size
        return (numel + 3,)
    return shape


def _draw(kind, arg, shape, dtype, generator):
    if kind == "randn":
        return torch.randn(shape, generator=generator).to(dtype)
    if kind == "randint":
        return torch.randint(arg[0], arg[1], shape, generator=generator).to(dtype)
    if kind == "bool":
        return torch.rand(shape, generator=generator) < 0.5
    if kind == "perm":
        return torch.randperm(shape[0], generator=generator).to(dtype)
    raise ValueError(f"fuzz input kind {kind!r} is none of randn, randint, bool, perm")


def _lay_out(base, shape, layout):
    if layout == "transposed" and len(shape) >= 2:
        return base.transpose(-1, -2)
    if layout == "strided" and shape:
        return base[..., ::2]
    if layout == "expanded" and shape:
        return base.expand(tuple(shape))
    if layout == "offset":
        return base[3:].view(tuple(shape))
    return base


def target_device(target: str) -> torch.device:
    """The device the tensors of a program compiled for ``target`` live on (its device type)."""
    return torch.device(fxwrap.get_plugin_manager().target(target).device_type)


def make_tensor(spec, seed, index, device="cpu"):
    """The input of ``spec``: the same values and the same layout for the same seed and index
    (drawn on the CPU, then laid out on ``device``)."""
    _name, shape, dtype, kind, arg, layout, requires_grad = spec
    generator = torch.Generator().manual_seed(seed * 1009 + index)
    base = _draw(kind, arg, _storage_shape(shape, layout), dtype, generator).to(device)
    tensor = _lay_out(base, tuple(shape), layout)
    if requires_grad:
        tensor = tensor.detach().requires_grad_()
    return tensor


def make_inputs(ns, upcast=False, device="cpu"):
    """Fresh inputs of the program (a new list each call: programs mutate their inputs)."""
    inputs = []
    for index, spec in enumerate(ns["INPUTS"]):
        tensor = make_tensor(spec, ns["SEED"], index, device)
        if upcast and tensor.is_floating_point():
            tensor = tensor.detach().double().requires_grad_(tensor.requires_grad)
        inputs.append(tensor)
    return inputs


def make_module(ns, upcast=False, device="cpu"):
    module = ns["Program"]()
    for index, spec in enumerate(ns["BUFFERS"]):
        module.register_buffer(spec[0], make_tensor(spec, ns["SEED"], 1000 + index, device))
    return module.double() if upcast else module


def cotangents(outputs, seed):
    generator = torch.Generator().manual_seed(seed * 1009 + 999)
    return [torch.randn(o.shape, generator=generator).to(o.device, o.dtype) for o in outputs]


def run(ns, compiled_with=None, upcast=False, device="cpu"):
    """Run the program once on ``device``; returns ``{"outputs", "inputs", "buffers", "grads"}``,
    each a list of tensors (inputs and buffers after the run: programs mutate them)."""
    module = make_module(ns, upcast, device)
    inputs = make_inputs(ns, upcast, device)
    fn = module if compiled_with is None else compiled_with(module)
    outputs = fn(*inputs)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    grads = []
    if ns["BACKWARD"]:
        differentiable = [o for o in outputs if isinstance(o, torch.Tensor) and o.requires_grad]
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        if differentiable and leaves:
            cots = cotangents(differentiable, ns["SEED"])
            grads = list(torch.autograd.grad(differentiable, leaves, cots, allow_unused=True))
    return {"outputs": [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs],
            "inputs": [x.detach() for x in inputs], "buffers": [b.detach() for b in module.buffers()],
            "grads": grads}


def _describe_difference(got, want):
    diff = (got - want).abs()
    diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)
    flat = int(diff.argmax()) if diff.numel() else 0
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), got.shape)) if got.dim() else ()
    return (f"max abs difference {float(diff.max()) if diff.numel() else 0.0:.3g} at {index}: "
            f"got {float(got.reshape(-1)[flat]) if got.numel() else 0.0!r}, "
            f"eager {float(want.reshape(-1)[flat]) if want.numel() else 0.0!r}")


def _rms(a, b):
    error = (a - b).abs()
    error = error[torch.isfinite(error)]
    return float(error.pow(2).mean().sqrt()) if error.numel() else 0.0


def loosest_dtype(ns):
    """The float dtype of the program with the loosest tolerance: a float32 result computed
    through a bfloat16 value (an input, a buffer, a ``.to(torch.bfloat16)``) carries
    bfloat16's rounding, and where the compiled program rounds one step differently (on the
    GPU an FMA-contracted product), that is one bfloat16 ulp of the float32 result."""
    forward = ns["Program"].forward.__code__
    names = set(forward.co_names)
    for name in forward.co_names:  # the cond branches forward calls
        names.update(getattr(getattr(ns.get(name), "__code__", None), "co_names", ()))
    dtypes = [spec[2] for spec in [*ns["INPUTS"], *ns["BUFFERS"]]]
    dtypes += [getattr(torch, name) for name in ("bfloat16", "float16") if name in names]
    floats = [d for d in dtypes if d in TOLERANCES]
    return max(floats, key=lambda d: TOLERANCES[d], default=None)


def compare(what, got, want, ref=None, loosest=None):
    """None where ``got`` matches eager's ``want``, else a message naming ``what``; a float
    result is compared with the tolerance of its dtype or of ``loosest``, the looser."""
    if got is None or want is None:
        return None if got is None and want is None else f"{what}: got {got!r}, eager {want!r}"
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{what}: got {got!r}, eager {want!r}"
    if not isinstance(got, torch.Tensor):
        return f"{what}: got a {type(got).__name__}, eager a tensor"
    if got.shape != want.shape or got.dtype != want.dtype:
        return (f"{what}: got shape {tuple(got.shape)} dtype {got.dtype}, "
                f"eager shape {tuple(want.shape)} dtype {want.dtype}")
    if got.device != want.device:
        return f"{what}: got a tensor on {got.device}, eager's is on {want.device}"
    if not want.is_floating_point():
        if torch.equal(got, want):
            return None
        wrong = int((got != want).sum())
        return f"{what}: {wrong} of {want.numel()} {want.dtype} elements differ ({_describe_difference(got.double(), want.double())})"
    g, w = got.detach().double(), want.detach().double()
    rtol, atol = TOLERANCES.get(want.dtype, (1e-3, 1e-4))
    if loosest is not None:
        rtol, atol = max(rtol, TOLERANCES[loosest][0]), max(atol, TOLERANCES[loosest][1])
    finite = w[torch.isfinite(w)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    if torch.allclose(g, w, rtol=rtol, atol=atol * scale, equal_nan=True):
        return None
    if ref is not None and isinstance(ref, torch.Tensor) and ref.shape == want.shape:
        r = ref.detach().double()
        same_nans = torch.equal(torch.isnan(g), torch.isnan(w)) or torch.equal(torch.isnan(g), torch.isnan(r))
        if same_nans and _rms(g, r) <= 1.5 * _rms(w, r) + atol * scale / 10:
            return None
    return f"{what} ({want.dtype}, shape {tuple(want.shape)}): {_describe_difference(g, w)}"


def _zero_or_none(grad):
    return grad is None or (isinstance(grad, torch.Tensor) and not bool(grad.ne(0).any()))


def compare_runs(got, want, ref=None, loosest=None):
    """Every difference between two ``run`` results, as messages (``loosest``: see ``compare``)."""
    problems = []
    for part in ("outputs", "inputs", "buffers", "grads"):
        if len(got[part]) != len(want[part]):
            problems.append(f"{part}: got {len(got[part])}, eager {len(want[part])}")
            continue
        refs = ref[part] if ref is not None and len(ref[part]) == len(want[part]) else [None] * len(want[part])
        for i, (g, w, r) in enumerate(zip(got[part], want[part], refs)):
            if part == "grads" and _zero_or_none(g) and _zero_or_none(w):
                continue  # torch.compile gives zeros where no path reaches an output (eager: None)
            message = compare(f"{part[:-1]} {i}", g, w, r, loosest)
            if message:
                problems.append(message)
    return problems


def compiler(target, dynamic):
    """``torch.compile`` with the fxwrap backend on ``target``."""
    def compile_module(module):
        return torch.compile(module, backend=fxwrap.Backend(target), dynamic=dynamic)
    return compile_module


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message (at file:line)`` of the error that fxwrap raised:
    under dynamo's ``BackendCompilerFailed`` (whose own first line names only the backend),
    the one it wraps, and the innermost frame of the traceback::

        RuntimeError: unsupported operation: more than one element ... (at template_choice.py:286)
    """
    inner = getattr(error, "inner_exception", None) or error.__cause__ or error
    lines = [line for line in str(inner).strip().splitlines() if line.strip()]
    frame = inner.__traceback__  # the innermost frame (this module imports torch and fxwrap only)
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = "" if frame is None else \
        f" (at {frame.tb_frame.f_code.co_filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{frame.tb_lineno})"
    return f"{type(inner).__name__}: {lines[0] if lines else ''}{where}"


def _is_compile_error(error):
    return type(error).__name__ == "BackendCompilerFailed"


def check(ns, target):
    """``(status, message)``: the program of ``ns`` compiled for ``target`` against eager.

    Where fxwrap raises, the program is compiled once more with torch's own ``aot_eager``
    backend: if that raises as well, the failure is torch's (status ``"torch_error"``), not
    fxwrap's.  Where fxwrap's numbers differ from eager's, so is a difference that
    ``aot_eager`` shows too while fxwrap matches it (the traced graph is not eager)."""
    torch._dynamo.reset()
    device = target_device(target)  # eager runs where the compiled program does
    try:
        want = run(ns, device=device)
    except Exception as error:  # noqa: BLE001 - the program mixes devices in eager too (a CPU
        # factory call beside inputs on another device): no verdict on fxwrap
        return "torch_error", f"eager fails on {device}: {type(error).__name__}: {error}"[:2000]
    try:
        got = run(ns, compiler(target, ns["DYNAMIC"]), device=device)
    except Exception as error:  # noqa: BLE001 - every exception is a finding, classified
        status = "compile_error" if _is_compile_error(error) else "runtime_error"
        text = describe_error(error)
        torch._dynamo.reset()
        try:
            run(ns, lambda module: torch.compile(module, backend="aot_eager", dynamic=ns["DYNAMIC"]),
                device=device)
        except Exception:  # noqa: BLE001 - torch fails without fxwrap too
            status = "torch_error"
        return status, text[:2000]
    finally:
        torch._dynamo.reset()
    loosest = loosest_dtype(ns)
    problems = compare_runs(got, want, loosest=loosest)
    if problems:
        try:
            ref = run(ns, upcast=True, device=device)
        except Exception:  # noqa: BLE001 - no float64 reference: judge against eager alone
            ref = None
        if ref is not None:
            problems = compare_runs(got, want, ref, loosest)
    if problems:
        # torch's own stack (aot_eager: the same AOTAutograd graphs, run by eager kernels)
        # differs from eager just as fxwrap does: the traced graph, not fxwrap, is the
        # cause (prod's backward over a size-1 dimension is finite where eager's is NaN)
        torch._dynamo.reset()
        try:
            aot = run(ns, lambda module: torch.compile(module, backend="aot_eager", dynamic=ns["DYNAMIC"]),
                      device=device)
        except Exception:  # noqa: BLE001 - no second opinion: the mismatch stands
            aot = None
        finally:
            torch._dynamo.reset()
        if aot is not None and compare_runs(aot, want, loosest=loosest) and not compare_runs(got, aot, loosest=loosest):
            return "torch_error", ("aot_eager differs from eager as fxwrap does (fxwrap matches aot_eager): "
                                   + "; ".join(problems))[:2000]
        return "mismatch", "; ".join(problems)
    return "pass", ""
