"""Input guards and ``Program.run``'s arguments and results on the CPU targets (the
cases are in ``tests/guard_cases.py``; ``tests/cuda`` runs them through Triton)."""
import functools

import pytest

import fxwrap
import guard_cases

LOWERS = {
    "cpu": functools.partial(fxwrap.lower, target="cpu"),
    "cpu-extern": functools.partial(fxwrap.lower, target="cpu", options={"kernels": False}),
    "reference": functools.partial(fxwrap.lower, target="reference"),
}


@pytest.mark.parametrize("case", guard_cases.CASES, ids=lambda c: c.__name__[5:])
@pytest.mark.parametrize("target", list(LOWERS))
def test_guard_case(case, target):
    case(LOWERS[target], "cpu")


def test_device_is_checked_for_inputs_kernels_read():
    """Only extern calls read ``x`` and ``w`` (the matrix product), which run on whatever
    device a tensor is on; they still must be on the compiled device (eager refuses the
    device mix), but a CPU scalar passes in their place, torch's rule for CPU scalars (SDPA's
    backward on CUDA gets its dropout seed as a CPU scalar where the traced graph said
    CUDA). ``b`` is read by a kernel, whose addresses must be on the compiled device."""
    import torch

    def f(x, w, b):
        return (x @ w).sin() + b

    program = fxwrap.lower(f, torch.randn(4, 8), torch.randn(8, 3), torch.randn(3), target="cpu")
    specs = {program.arguments.describe(source[1]).split()[0]: (spec.device, spec.cpu_scalar_ok)
             for spec, source in zip(program.input_guard.inputs, program.arguments.sources)}
    cpu = torch.device("cpu")
    assert specs == {"x": (cpu, True), "w": (cpu, True), "b": (cpu, False)}, specs
    with pytest.raises(fxwrap.InputMismatchError, match=r"b \(argument 2\) is on device meta"):
        program.run(torch.randn(4, 8), torch.randn(8, 3), torch.randn(3, device="meta"))
    with pytest.raises(fxwrap.InputMismatchError, match=r"x \(argument 0\) is on device meta"):
        program.run(torch.randn(4, 8, device="meta"), torch.randn(8, 3), torch.randn(3))


def test_an_extern_only_input_takes_a_cpu_scalar_and_no_other_device():
    """The CPU-scalar exception, for a program compiled for another device (``cuda``:
    only the device object, no GPU needed): a 0-dim CPU tensor passes for an input only
    externs read, a CPU tensor with dimensions does not, and neither passes where a
    kernel reads the input."""
    import torch

    from fxwrap.runtime.guards import InputGuard, TensorInputSpec

    cuda = torch.device("cuda")
    seed = TensorInputSpec("seed", torch.int64, cuda, (), (), cpu_scalar_ok=True)
    index = TensorInputSpec("index", torch.int64, cuda, (2,), (1,), cpu_scalar_ok=True)
    read = TensorInputSpec("read", torch.int64, cuda, (), ())
    assert seed.device_ok(torch.tensor(3)) and not read.device_ok(torch.tensor(3))
    assert not index.device_ok(torch.tensor([1, 2]))
    guard = InputGuard([seed])
    assert guard._fast(torch.tensor(7))  # the generated check, not only the explanation
    guard(torch.tensor(7))
    assert not InputGuard([index])._fast(torch.tensor([0, 1]))
    with pytest.raises(fxwrap.InputMismatchError, match=r"index.* is on device cpu; .* compiled for cuda"):
        InputGuard([index])(torch.tensor([0, 1]))
    with pytest.raises(fxwrap.InputMismatchError, match=r"read.* is on device cpu"):
        InputGuard([read])(torch.tensor(7))


def test_static_tensor_inputs_are_checked_by_one_tensor_guards_call():
    """After a call passes, the tensors of static layout go through one ``TensorGuards``
    check, the rest through the generated check; each mismatch still raises the worded
    error, and a flip the C++ check refuses but the program accepts (requires_grad) passes."""
    import torch

    from fxwrap.runtime.guards import InputGuard, SizeInputSpec, TensorInputSpec

    cpu = torch.device("cpu")
    specs = [TensorInputSpec(f"w{i}", torch.float32, cpu, (8, 4), (4, 1)) for i in range(5)]
    specs += [SizeInputSpec("s0"), TensorInputSpec("x", torch.float32, cpu, ("s0", 4), (4, 1))]
    guard = InputGuard(specs)
    weights = [torch.randn(8, 4) for _ in range(5)]
    guard(*weights, 3, torch.randn(3, 4))
    static = guard._static
    assert static is not None and len(static.pick((*weights, 3, None))) == 5
    assert static.check((*weights, 6, torch.randn(6, 4)))          # the symbolic input by the rest
    assert not static.check((*weights, 6, torch.randn(5, 4)))
    with pytest.raises(fxwrap.InputMismatchError, match=r"w2.* strides \(1, 8\)"):
        guard(*weights[:2], torch.randn(4, 8).t(), *weights[3:], 3, torch.randn(3, 4))
    with pytest.raises(fxwrap.InputMismatchError, match=r"w4.* dtype torch.float64"):
        guard(*weights[:4], torch.randn(8, 4, dtype=torch.float64), 3, torch.randn(3, 4))
    with pytest.raises(fxwrap.InputMismatchError, match=r"x.* size \(3, 5\)"):
        guard(*weights, 3, torch.randn(3, 5))
    flipped = [w.clone().requires_grad_() for w in weights]
    assert not static.check((*flipped, 3, torch.randn(3, 4)))
    guard(*flipped, 3, torch.randn(3, 4))  # the generated check accepts it, and the C++ one is
    assert guard._static.check((*flipped, 3, torch.randn(3, 4)))  # built again for such inputs
    for _ in range(4):  # inputs that keep flipping: after a few builds, the generated check alone
        guard(*weights, 3, torch.randn(3, 4))
        guard(*flipped, 3, torch.randn(3, 4))
    assert guard._static is None
