"""One OpInfo sample as a compiled function, run through fxwrap and compared with eager.

PyTorch's OpInfo database (``torch.testing._internal.common_methods_invocations.op_db``)
describes every operator with sample inputs.  This module turns a sample into
``fn(*tensors)`` (every tensor leaf of the sample an input, everything else closed over),
runs it on a backend and compares outputs, inputs after the call (ops may mutate them)
and, in grad mode, input gradients with eager's::

    op = select_ops(["sin"])[0]
    cases, dropped, _ = eager_cases(op, samples(op, 2)[0])
    for index, case, expected, expected_inputs in cases:
        outcome = run_backend(case, "fxwrap", expected, expected_inputs, {"target": "cpu"})

Used by the conformance kit (``ConformanceSuite.test_opinfo``) and by fxwrap's full sweep
(``tests/models/opinfo_sweep.py``).  Outputs are compared with
``torch.testing.assert_close(..., equal_nan=True)`` at its float32 defaults (rtol 1.3e-6,
atol 1e-5), the tolerances OpInfo tests use; integer, bool and non-tensor results must
be equal.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch._dynamo
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fxwrap.ir.lines import CallExtern, CallKernel

DTYPE = torch.float32
DEVICE = "cpu"


def _op_db():
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def op_id(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def all_ops():
    return list(_op_db())


def excluded_reason(op, device: str = DEVICE, dtype: torch.dtype = DTYPE) -> str | None:
    """Why an OpInfo is not swept (None: it is), before looking at its samples."""
    if dtype not in op.supported_dtypes(device):
        return f"{str(dtype).removeprefix('torch.')} not supported on {device}"
    if getattr(op, "has_nondeterministic_output", False):  # the flag exists from torch 2.13
        return "nondeterministic/uninitialised output (OpInfo flag)"
    return None


class _RecordOps(TorchDispatchMode):
    """Collects the ATen overloads that run under it."""

    def __init__(self):
        super().__init__()
        self.ops: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def is_random(ops) -> bool:
    return any(torch.Tag.nondeterministic_seeded in getattr(op, "tags", ()) for op in ops)


# ATen ops whose result is memory nobody wrote.  OpInfo marks the ops built on them
# (``has_nondeterministic_output``) from torch 2.13; on older torch a sample that ran
# nothing else has no defined result.
_UNINITIALISED = frozenset(("empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                            "new_empty_strided"))


def returns_uninitialised(ops) -> bool:
    """Eager ran only allocations that leave memory unwritten (``aten.empty*``)."""
    return bool(ops) and all(getattr(op, "_schema", None) is not None
                             and op._schema.name.removeprefix("aten::") in _UNINITIALISED for op in ops)


# -- samples as compiled functions ---------------------------------------------------

def _copy_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s whole storage, viewed with ``t``'s size, stride and offset."""
    t = t.detach()
    n = t.untyped_storage().nbytes() // t.element_size()
    storage = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
    return storage.clone().as_strided(t.size(), t.stride(), t.storage_offset())


@dataclass
class Case:
    """One sample as ``fn(*tensors)``: tensor leaves are inputs, the rest is closed over."""

    op: object
    tensors: list[torch.Tensor]
    spec: object
    leaves: list
    tensor_slots: list[int]
    grad: bool = False  # inputs keep the sample's requires_grad; gradients are compared too
    weights: list | None = None  # upstream gradients, one per differentiable output

    @classmethod
    def from_sample(cls, op, sample, grad: bool = False) -> "Case":
        leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
        slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
        tensors = [leaves[i] for i in slots]
        return cls(op, tensors, spec, leaves, slots, grad)

    def fresh_inputs(self) -> list[torch.Tensor]:
        """Independent copies of the inputs: same values, sizes, strides and storage
        offset (expanded and offset views stay what the sample made)."""
        return [_copy_layout(t).requires_grad_(self.grad and t.requires_grad) for t in self.tensors]

    def run(self, fn, inputs):
        """``fn(*inputs)`` and, in grad mode, the input gradients of
        ``sum((out * weight).sum())`` over the differentiable outputs (None where an
        input gets no gradient).  The first run draws the random weights."""
        out = fn(*inputs)
        if not self.grad:
            return out, None
        floats = [o for o in _leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if self.weights is None:
            self.weights = [torch.randn_like(o) for o in floats]
        wrt = [t for t in inputs if t.requires_grad]
        if not floats or not wrt:
            return out, None
        if len(floats) != len(self.weights):
            raise AssertionError(f"{len(floats)} differentiable outputs, eager has {len(self.weights)}")
        loss = sum(torch.real(o * w).sum() for o, w in zip(floats, self.weights))
        return out, list(torch.autograd.grad(loss, wrt, allow_unused=True))

    def function(self):
        op, spec, slots, template = self.op, self.spec, self.slots_tuple, tuple(self.leaves)

        def fn(*tensors):
            leaves = list(template)
            for slot, t in zip(slots, tensors):
                leaves[slot] = t
            inp, args, kwargs = pytree.tree_unflatten(leaves, spec)
            return op.op(inp, *args, **kwargs)

        return fn

    @property
    def slots_tuple(self) -> tuple[int, ...]:
        return tuple(self.tensor_slots)


# -- comparison ----------------------------------------------------------------------

def _leaves(value) -> list:
    if isinstance(value, tuple) and type(value) is not tuple:  # structseq / namedtuple
        value = tuple(value)
    return pytree.tree_leaves(value)


def compare(actual, expected, what: str = "output") -> None:
    """assert_close over every leaf; raises AssertionError naming the leaf."""
    got, want = _leaves(actual), _leaves(expected)
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} leaves, eager has {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor) or isinstance(g, torch.Tensor):
            if not (isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor)):
                raise AssertionError(f"{what}[{i}]: {type(g).__name__} vs eager {type(w).__name__}")
            torch.testing.assert_close(g.detach(), w.detach(), equal_nan=True,
                                       msg=lambda m, i=i: f"{what}[{i}]: {m}")
        elif isinstance(w, float) and isinstance(g, (int, float)):
            torch.testing.assert_close(float(g), w, equal_nan=True)
        elif g != w:
            raise AssertionError(f"{what}[{i}]: {g!r} vs eager {w!r}")


LOW_PRECISION = (torch.bfloat16, torch.float16)


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = (a.double() - b.double()).nan_to_num(0.0, 0.0, 0.0)  # NaN/inf placement is checked apart
    return diff.square().mean().sqrt().item() if diff.numel() else 0.0


def closer_to_float64(actual, expected, reference, what: str = "output", multiplier: float = 2.0) -> None:
    """For low-precision results that ``compare`` rejects: each floating leaf must be as
    close to the float64 ``reference`` (eager on the inputs upcast) as eager's own result,
    within ``multiplier`` (root-mean-square errors; Inductor's accuracy check uses the
    same rule), with NaN and inf where eager has them; raises AssertionError otherwise."""
    got, want, ref = _leaves(actual), _leaves(expected), _leaves(reference)
    if not len(got) == len(want) == len(ref):
        raise AssertionError(f"{what}: {len(got)} leaves, eager has {len(want)}")
    for i, (g, w, r) in enumerate(zip(got, want, ref)):
        if not (isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor) and w.dtype in LOW_PRECISION):
            compare(g, w, f"{what}[{i}]")
            continue
        g, w = g.detach(), w.detach()
        if g.shape != w.shape or not torch.equal(g.isnan(), w.isnan()) or not torch.equal(
                g.isinf() & ~g.isnan(), w.isinf() & ~w.isnan()):
            compare(g, w, f"{what}[{i}]")  # shapes or non-finite places differ: the plain verdict
        err, eager_err = _rmse(g, r), _rmse(w, r)
        tol = 1e-5 / 10  # Inductor's check adds atol / 10
        if err > multiplier * eager_err + tol:
            raise AssertionError(f"{what}[{i}]: {w.dtype} root-mean-square error to the float64 result "
                                 f"{err:.3g}, eager's {eager_err:.3g} (allowed {multiplier}x + {tol:g})")


def float64_reference(case: "Case", grad: bool = False):
    """Eager's result on the case's inputs with low-precision floating tensors upcast to
    float64, and a low-precision dtype argument with them (``_softmax_backward_data``'s
    ``input_dtype``), None where eager cannot run so: ``(outputs, input grads)`` as ``Case.run``."""
    inputs = [t.detach().double().requires_grad_(case.grad and t.requires_grad) if t.dtype in LOW_PRECISION
              else t for t in case.fresh_inputs()]
    leaves = [torch.float64 if isinstance(leaf, torch.dtype) and leaf in LOW_PRECISION else leaf
              for leaf in case.leaves]
    upcast = Case(case.op, inputs, case.spec, leaves, case.tensor_slots, case.grad,
                  [w.double() if w.dtype in LOW_PRECISION else w for w in case.weights]
                  if case.weights is not None else None)
    try:
        return upcast.run(upcast.function(), inputs), inputs
    except Exception:  # noqa: BLE001 - no float64 kernel: the plain verdict stands
        return None


# -- one sample ----------------------------------------------------------------------

@dataclass
class Outcome:
    status: str  # "ok", "mismatch", "error"
    detail: str = ""
    programs: int = 0
    kernels: int = 0  # kernel launches in the programs
    externs: int = 0  # ATen calls doing compute (not size/offset reads) in the programs
    # a low-precision result outside eager's tolerance that is as close to the float64
    # result as eager's (``closer_to_float64``): status "ok", the difference kept here
    arbitrated: str = ""


def _launches(programs) -> tuple[int, int]:
    """(kernel launches, compute extern calls) of the programs' Wrapper IR."""
    lines = [line for p in programs for line in p.lines]
    kernels = sum(isinstance(line, CallKernel) for line in lines)
    # ATen ops only: not size/offset reads, not fxwrap's run-time checks (Python functions)
    externs = sum(isinstance(line, CallExtern) and isinstance(line.op, torch._ops.OpOverload)
                  and not line.op._schema.name.startswith("aten::sym_") for line in lines)
    return kernels, externs


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__


def run_backend(case: Case, backend, expected, expected_inputs, options=None) -> Outcome:
    torch._dynamo.reset()
    programs = []
    if backend == "fxwrap":
        compiled = torch.compile(case.function(), backend="fxwrap",
                                 options=dict(options or {}, on_program=programs.append))
    else:
        compiled = torch.compile(case.function(), backend=backend)
    inputs = case.fresh_inputs()
    expected_out, expected_grads = expected
    try:
        out, grads = case.run(compiled, inputs)
    except AssertionError as exc:
        return Outcome("mismatch", str(exc)[:2000], len(programs))
    except Exception as exc:  # noqa: BLE001 - an error is a counted outcome
        return Outcome("error", _short_error(exc))
    finally:
        torch._dynamo.reset()
    checks = [(out, expected_out, "output")]
    if not case.grad:
        checks.append((inputs, expected_inputs, "input after call"))
    if expected_grads is not None or grads is not None:
        checks.append((grads, expected_grads, "input grads"))
    try:
        for actual, wanted, what in checks:
            compare(actual, wanted, what)
    except AssertionError as exc:
        if not any(t.dtype in LOW_PRECISION for t in case.tensors):
            return Outcome("mismatch", str(exc)[:2000], len(programs))
        reference = float64_reference(case)
        if reference is None:
            return Outcome("mismatch", str(exc)[:2000], len(programs))
        (ref_out, ref_grads), ref_inputs = reference
        references = {"output": ref_out, "input after call": ref_inputs, "input grads": ref_grads}
        try:
            for actual, wanted, what in checks:
                closer_to_float64(actual, wanted, references[what], what)
        except AssertionError as worse:
            return Outcome("mismatch", f"{str(exc)[:1500]}\nagainst float64: {worse}"[:2000], len(programs))
        return Outcome("ok", "", len(programs), *_launches(programs), arbitrated=str(exc).splitlines()[0][:300])
    return Outcome("ok", "", len(programs), *_launches(programs))


def dynamo_settings():
    """One compile per sample, never throttled into a silent eager fallback, and
    errors raised rather than suppressed (a context manager)."""
    return torch._dynamo.config.patch(cache_size_limit=1 << 16, accumulated_cache_size_limit=1 << 16,
                                      suppress_errors=False)


def samples(op, count: int, grad: bool = False, device: str = DEVICE, dtype: torch.dtype = DTYPE):
    """The first ``count`` samples (marked for grad where OpInfo differentiates them),
    or the reason they cannot be made."""
    try:
        return list(itertools.islice(op.sample_inputs(device, dtype, requires_grad=grad), count)), None
    except Exception as exc:  # noqa: BLE001 - OpInfo's sample generator failed
        return [], f"sample_inputs failed: {_short_error(exc)}"


def select_ops(names=()) -> list:
    """OpInfos by name or ``name.variant`` (all of them when ``names`` is empty)."""
    wanted = set(names)
    ops = [op for op in all_ops() if not wanted or op.name in wanted or op_id(op) in wanted]
    unknown = wanted - {op.name for op in ops} - {op_id(op) for op in ops}
    if unknown:
        raise KeyError(f"no OpInfo named {sorted(unknown)}")
    return ops

def eager_cases(op, sample_list, grad: bool = False):
    """The samples as ``(index, case, expected, expected_inputs)``, each run once in eager, and
    the reasons for the samples dropped: sparse inputs (fxwrap compiles strided tensors)
    and samples eager itself rejects.  Also returns every ATen op eager ran (to tell
    random ops by their ``nondeterministic_seeded`` tag): ``(cases, dropped, seen_ops)``."""
    cases, dropped, seen = [], [], set()
    for index, sample in enumerate(sample_list):
        case = Case.from_sample(op, sample, grad)
        if any(t.layout != torch.strided for t in case.tensors):
            dropped.append("sparse input")
            continue
        recorder = _RecordOps()
        inputs, recorded_inputs = case.fresh_inputs(), case.fresh_inputs()
        try:
            with recorder, torch.no_grad():  # the inputs' copies made outside: only the op's ATen calls
                case.function()(*recorded_inputs)
            expected = case.run(case.function(), inputs)
        except Exception as exc:  # noqa: BLE001 - not a valid sample for eager on the CPU
            dropped.append(f"eager raised {_short_error(exc)}")
            continue
        seen |= recorder.ops
        cases.append((index, case, expected, inputs))
    return cases, dropped, seen
