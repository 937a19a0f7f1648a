"""``ConformanceSuite``: the kit's tests, as a class a vendor subclasses with its target.

    # tests/test_conformance.py of a plugin package
    import torch
    from fxwrap.testing import ConformanceSuite, Unsupported

    class TestNpuConformance(ConformanceSuite):
        target = "npu"
        unsupported = [Unsupported("the NPU has no float64", dtype=torch.float64)]

pytest collects every ``test_*`` method of the subclass; the base class (its name does
not start with ``Test``) is never collected itself.  See ``fxwrap/testing/__init__.py``
for what each test checks.
"""
from __future__ import annotations

import copy
import functools
import importlib.util
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch
import torch._dynamo

import fxwrap
from fxwrap.testing import checks, opinfo
from fxwrap.testing.capture import CAPTURE_CHECKS
from fxwrap.testing.models import FORWARD_TOLERANCE, GRADIENT_TOLERANCE, MODEL_CASES
from fxwrap.testing.ops import OP_CASES, OpCase, dtype_name

CHECKS = ("kernels", "all")


@dataclass(frozen=True)
class Unsupported:
    """A target's declared exclusion, reported as a pytest skip with ``reason``.

    ``name`` is an op case (``"sin"``, ``"to_float64"``), an OpInfo (``"softmax"``), a
    model (``"conv_net"``: inference and training; ``"conv_net_training"``: training
    only) or a memory/determinism program (``"mlp_training"``); None matches every name.  ``dtype`` matches op cases that take or produce it; None matches
    every dtype.  ``check`` is what is skipped:

    * ``"kernels"`` (default): the "ran in a kernel" assertion only.  The numbers are still
      compared with eager (the op runs as an ATen extern), and a declared op that does run
      in kernels fails, so a stale declaration cannot stay;
    * ``"all"``: the whole test (a target that cannot run it at all, or too slowly).

        Unsupported("Metal has no double: float64 runs as ATen externs", dtype=torch.float64)
        Unsupported("no bf16 reductions yet", name="sum", dtype=torch.bfloat16)
        Unsupported("the interpreter takes minutes for convolutions", name="conv_net", check="all")
    """

    reason: str
    name: str | None = None
    dtype: torch.dtype | None = None
    check: str = "kernels"

    def __post_init__(self):
        if self.check not in CHECKS:
            raise ValueError(f"Unsupported(check={self.check!r}): check is one of {CHECKS}")
        if not self.reason:
            raise ValueError("Unsupported needs a reason: it is shown as the skip's reason")

    def matches(self, name: str, dtypes: Sequence[torch.dtype], check: str) -> bool:
        return ((self.name is None or self.name == name)
                and (self.dtype is None or self.dtype in dtypes)
                and (self.check == "all" or self.check == check))


# A fixed OpInfo subset: one or two OpInfos per family the op cases cover, by OpInfo id.
OPINFO_OPS = (
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "maximum", "where", "clamp", "abs", "exp", "log",
    "sin", "tanh", "sigmoid", "nn.functional.gelu", "nn.functional.relu", "sum", "mean", "amax", "argmax",
    "var", "softmax", "log_softmax", "logsumexp", "transpose", "permute", "cat", "gather", "index_select",
    "nn.functional.embedding", "nn.functional.max_pool2d", "nn.functional.layer_norm",
)


@functools.lru_cache(maxsize=None)
def _opinfo(op_id: str):
    (op,) = [op for op in opinfo.select_ops([op_id]) if opinfo.op_id(op) == op_id]
    return op


def _memory_programs(target: str, device: torch.device) -> dict:
    """Programs whose memory plans the suite checks, by name, lowered for ``target`` on inputs
    of its ``device``."""

    def chain(x):  # many intermediates: frees and reuse
        y = torch.softmax(x * 2, -1)
        z = (y.exp() + x).sum(0)
        return (z * 3).sin(), y.amax(1)

    def split_views(x):  # results of an extern that alias its argument (split's pieces)
        pieces = torch.split(x.cos(), 3, 0)
        return pieces[1] * 2, pieces[0].t() + 1

    def mlp_training():
        model = MODEL_CASES["mlp"].build()
        x = MODEL_CASES["mlp"].batch().to(device)
        model = model.to(device)
        programs = []
        compiled = fxwrap.compile(model, target=target, options={"on_program": programs.append})
        compiled(x).sum().backward()
        return programs

    return {
        "chain": lambda: [fxwrap.lower(chain, torch.randn(12, 20, device=device), target=target)],
        "chain_dynamic": lambda: [fxwrap.lower(chain, torch.randn(12, 20, device=device), target=target,
                                               dynamic=True)],
        "split_views": lambda: [fxwrap.lower(split_views, torch.randn(12, 6, device=device), target=target)],
        "mlp_training": mlp_training,
    }


def _determinism_functions() -> dict:
    def norm_gelu_softmax(x, w):
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), w)
        return torch.softmax(torch.nn.functional.gelu(h) @ h.t(), -1).sum(0), h.amax(1)

    def views_and_indexing(x, i):
        return torch.cat([x.t()[::2], x[:, 1::2].t()], 0).sin()[i] * 2
    return {
        "norm_gelu_softmax": (norm_gelu_softmax, lambda: (torch.randn(8, 24), torch.randn(24))),
        "views_and_indexing": (views_and_indexing, lambda: (torch.randn(10, 12), torch.randint(0, 12, (7,)))),
    }


def resolve_target_name(suite: type, config) -> str:
    """The target a suite class checks: its ``target``, else ``--fxwrap-target``, else the
    ini option ``fxwrap_target``; a usage error naming the way out when none is set or the
    name is not a registered target."""
    name = suite.target or config.getoption("fxwrap_target", default=None)
    if not name:
        try:
            name = config.getini("fxwrap_target")
        except ValueError:  # the plugin is not loaded: no such ini option
            name = None
    if not name:
        raise pytest.UsageError(
            f"{suite.__name__} names no fxwrap target: set `target = \"<name>\"` on the class, or load the "
            "plugin (`pytest_plugins = [\"fxwrap.testing\"]` in your root conftest.py, or `-p fxwrap.testing`) "
            "and run with --fxwrap-target=<name>")
    try:
        fxwrap.get_plugin_manager().target(name)
    except KeyError as error:
        raise pytest.UsageError(f"{suite.__name__}: {error.args[0]}") from None
    return name


def fresh_state(request):
    """A fresh dynamo cache and a fresh random seed per test, the seed printed (pytest shows
    it on failure), and the whole-program cache off (each check compiles what it checks).
    A generator to register as an autouse fixture:
    ``fresh_state = pytest.fixture(autouse=True)(fxwrap.testing.suite.fresh_state)``."""
    torch._dynamo.reset()
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    random.seed(seed)
    print(f"seed {seed} for {request.node.nodeid}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FXWRAP_PROGRAM_CACHE", "0")
        yield
    torch._dynamo.reset()


class ConformanceSuite:
    """The conformance kit's tests; subclass it as ``Test...`` with ``target = "<name>"``.

    Class attributes a subclass sets:

    * ``target``: the fxwrap target's name.  None: taken from ``--fxwrap-target`` (or the
      ini option ``fxwrap_target``), with ``pytest_plugins = ["fxwrap.testing"]``.
    * ``unsupported``: ``Unsupported`` declarations; each matching check is a skip with
      its reason (``pytest -ra`` lists them), never left out silently.
    * ``op_cases``, ``opinfo_ops``, ``models``: what runs (default: everything the kit
      has).  A narrower list leaves the rest out of collection: prefer ``Unsupported(...,
      check="all")``, which shows them as skips with the reason.
    * ``opinfo_samples``: OpInfo samples per op (default 1: the op cases cover dtypes and
      layouts; raise it for a wider net).

    A method a subclass may define: ``delay_stream(self, ms)``, which queues ``ms``
    milliseconds of work on the device's current stream (CUDA: ``torch.cuda._sleep``).
    With it, ``test_stream_order`` checks that launches go to the current stream; without
    it, that test is a skip saying so.
    """

    target: str | None = None
    unsupported: Sequence[Unsupported] = ()
    op_cases: Sequence[OpCase] = tuple(OP_CASES)
    opinfo_ops: Sequence[str] = OPINFO_OPS
    opinfo_samples: int = 1
    models: Sequence[str] = tuple(MODEL_CASES)
    memory_programs: Sequence[str] = ("chain", "chain_dynamic", "split_views", "mlp_training")
    determinism_functions: Sequence[str] = ("norm_gelu_softmax", "views_and_indexing")
    capture_checks: Sequence[str] = tuple(CAPTURE_CHECKS)

    # -- pytest wiring ------------------------------------------------------------------

    def pytest_generate_tests(self, metafunc):
        """Parametrizes each test over this subclass's lists (pytest calls this per class)."""
        params = {
            "op_case": (list(self.op_cases), [c.id for c in self.op_cases]),
            "opinfo_name": (list(self.opinfo_ops), list(self.opinfo_ops)),
            "model_name": (list(self.models), list(self.models)),
            "memory_program": (list(self.memory_programs), list(self.memory_programs)),
            "determinism_function": (list(self.determinism_functions), list(self.determinism_functions)),
            "capture_check": (list(self.capture_checks), list(self.capture_checks)),
        }
        for name, (values, ids) in params.items():
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, values, ids=ids)

    @pytest.fixture(autouse=True)
    def _fresh_state(self, request):
        yield from fresh_state(request)

    @pytest.fixture
    def target_name(self, request) -> str:
        """The target under test: the class's ``target``, else ``--fxwrap-target``/ini."""
        return resolve_target_name(type(self), request.config)

    def declared(self, names: str | Sequence[str], dtypes: Sequence[torch.dtype], check: str) -> Unsupported | None:
        """The first ``unsupported`` declaration matching one of ``names``, or None."""
        names = (names,) if isinstance(names, str) else tuple(names)
        return next((u for u in self.unsupported for name in names if u.matches(name, dtypes, check)), None)

    def _skip_if_excluded(self, target_name: str, names: str | Sequence[str],
                          dtypes: Sequence[torch.dtype] = (torch.float32,)) -> None:
        found = self.declared(names, dtypes, "all")
        if found is not None:
            name = names if isinstance(names, str) else names[-1]
            pytest.skip(f"{name}: declared unsupported on target {target_name!r}: {found.reason}")

    @staticmethod
    def device(target_name: str) -> torch.device:
        return torch.device(fxwrap.get_plugin_manager().target(target_name).device_type)

    # -- the tests ----------------------------------------------------------------------

    def test_op(self, target_name, op_case):
        """One ATen op: eager's numbers on fresh random inputs, computed inside generated
        kernels (exactly ``op_case.kernels`` launches, no extern of the op or of anything)."""
        dtypes = tuple(d for d in (op_case.dtype, op_case.out_dtype) if d is not None)
        self._skip_if_excluded(target_name, op_case.name, dtypes)
        device = self.device(target_name)
        what = f"op {op_case.id}"
        example = [t.to(device) for t in op_case.make_inputs()]
        program = fxwrap.lower(op_case.fn, *example, target=target_name)
        inputs = op_case.make_inputs()
        got = program.run(*[t.to(device) for t in inputs])
        want = op_case.fn(*inputs)
        tolerance = op_case.tolerances()
        for i, (g, w) in enumerate(zip(_as_tuple(got), _as_tuple(want))):
            torch.testing.assert_close(
                g.cpu(), w, equal_nan=True, **tolerance,
                msg=lambda m, i=i: (f"{what} on target {target_name!r}: output {i} differs from eager "
                                    f"(rtol {tolerance['rtol']}, atol {tolerance['atol']}): {m}"))
            if op_case.zero_signs and w.is_floating_point():
                checks.check_zero_signs(g.cpu(), w, f"{what} on target {target_name!r}: output {i}")
        declared = self.declared(op_case.name, dtypes, "kernels")
        if declared is None:
            checks.check_ran_in_kernels(program, op_case.ops, op_case.kernels, what)
            return
        try:
            checks.check_ran_in_kernels(program, op_case.ops, op_case.kernels, what)
        except AssertionError:
            pytest.skip(f"{what}: numbers match eager; 'ran in a kernel' not checked, declared unsupported "
                        f"on target {target_name!r}: {declared.reason}")
        raise AssertionError(
            f"{what} on target {target_name!r} ran inside generated kernels, but the suite declares it "
            f"unsupported ({declared.reason!r}): drop or narrow that Unsupported declaration")

    def test_intrinsics(self, target_name):
        """Each intrinsic the target's emitter declares for an ATen op (``fxwrap.Intrinsic``): a
        call it covers, on random ``(8, 24)`` operands of its first dtype, gives eager's numbers
        in one generated kernel that calls it (its spelling in the source), with no extern."""
        self._skip_if_excluded(target_name, "intrinsics")
        target = fxwrap.get_plugin_manager().target(target_name)
        declared = [i for i in getattr(target.emitter, "intrinsics", ()) if i.replaces is not None]
        if not declared:
            pytest.skip(f"target {target_name!r} declares no intrinsic that replaces an ATen op")
        device = self.device(target_name)
        for intrinsic in declared:
            overload, dtype = intrinsic.overload, intrinsic.dtypes[0]
            scalars, tensors = {}, []
            for arg in overload._schema.arguments:
                if isinstance(arg.type, torch.TensorType):
                    tensors.append(arg.name)
                elif isinstance(arg.type, torch.NumberType):
                    scalars[arg.name] = 0.75

            def call(*values, overload=overload, names=tuple(tensors), fixed={**scalars, **dict(intrinsic.when)}):
                return overload(**dict(zip(names, values)), **fixed)

            what = f"intrinsic {intrinsic.name} ({intrinsic.replaces}, {dtype_name(dtype)})"
            example = [torch.randn(8, 24, dtype=dtype, device=device) for _ in tensors]
            program = fxwrap.lower(call, *example, target=target_name)
            inputs = [torch.randn(8, 24, dtype=dtype) for _ in tensors]
            torch.testing.assert_close(
                program.run(*[t.to(device) for t in inputs]).cpu(), call(*inputs), equal_nan=True,
                msg=lambda m: f"{what} on target {target_name!r} differs from eager: {m}")
            checks.check_ran_in_kernels(program, [overload], 1, what)
            checks.check_intrinsic_called(program, intrinsic, what)

    def test_opinfo(self, target_name, opinfo_name):
        """Every compared sample of one OpInfo (float32) gives eager's numbers through the target."""
        self._skip_if_excluded(target_name, opinfo_name)
        if importlib.util.find_spec("expecttest") is None:
            pytest.skip("torch's OpInfo database needs expecttest: pip install expecttest "
                        "(or fxwrap's [test] extra)")
        device = self.device(target_name).type
        op = _opinfo(opinfo_name)
        reason = opinfo.excluded_reason(op, device)
        if reason is not None:
            pytest.skip(f"OpInfo {opinfo_name}: {reason}")
        sample_list, why = opinfo.samples(op, self.opinfo_samples, device=device)
        if why is not None:
            pytest.skip(f"OpInfo {opinfo_name}: {why}")
        cases, dropped, _ = opinfo.eager_cases(op, sample_list)
        assert cases, f"OpInfo {opinfo_name}: no usable sample ({'; '.join(dropped)})"
        failures = []
        with opinfo.dynamo_settings():
            for index, case, expected, expected_inputs in cases:
                outcome = opinfo.run_backend(case, "fxwrap", expected, expected_inputs, {"target": target_name})
                if outcome.status != "ok":
                    failures.append(f"sample {index}: {outcome.status}: {outcome.detail}")
        assert not failures, (f"OpInfo {opinfo_name} on target {target_name!r} differs from eager:\n  "
                              + "\n  ".join(failures))

    def test_model_inference(self, target_name, model_name):
        """A small model in eval mode, compiled for the target, gives eager's outputs."""
        self._skip_if_excluded(target_name, model_name)
        case = MODEL_CASES[model_name]
        device = self.device(target_name)
        model = case.build().eval()
        compiled_model = copy.deepcopy(model).to(device)
        programs = []
        compiled = fxwrap.compile(compiled_model, target=target_name, options={"on_program": programs.append})
        with torch.no_grad():
            for call in range(2):  # the second call runs the compiled program on a new batch
                x = case.batch()
                torch.testing.assert_close(
                    compiled(x.to(device)).cpu(), model(x), **FORWARD_TOLERANCE,
                    msg=lambda m, c=call: f"model {model_name} (inference, call {c}) on target "
                                          f"{target_name!r} differs from eager: {m}")
        assert programs, f"model {model_name}: no fxwrap program was compiled for target {target_name!r}"

    def test_model_training(self, target_name, model_name):
        """One forward and backward of a small model in train mode: outputs, the input's and
        every parameter's gradient, and updated buffers (batch norm statistics) match eager."""
        self._skip_if_excluded(target_name, (model_name, f"{model_name}_training"))
        case = MODEL_CASES[model_name]
        device = self.device(target_name)
        model = case.build().train()
        compiled_model = copy.deepcopy(model).to(device)
        programs = []
        compiled = fxwrap.compile(compiled_model, target=target_name, options={"on_program": programs.append})
        x = case.batch()
        x_compiled = x.to(device).requires_grad_()
        x.requires_grad_()
        out_compiled, out = compiled(x_compiled), model(x)
        weight = torch.randn_like(out)
        (out_compiled * weight.to(device)).sum().backward()
        (out * weight).sum().backward()
        where = f"model {model_name} (training) on target {target_name!r}"
        torch.testing.assert_close(out_compiled.detach().cpu(), out.detach(), **FORWARD_TOLERANCE,
                                   msg=lambda m: f"{where}: output differs from eager: {m}")
        torch.testing.assert_close(x_compiled.grad.cpu(), x.grad, **GRADIENT_TOLERANCE,
                                   msg=lambda m: f"{where}: the input's gradient differs from eager: {m}")
        compiled_params = dict(compiled_model.named_parameters())
        for name, param in model.named_parameters():
            got = compiled_params[name].grad
            assert got is not None, f"{where}: parameter {name} got no gradient"
            torch.testing.assert_close(got.cpu(), param.grad, **GRADIENT_TOLERANCE,
                                       msg=lambda m, n=name: f"{where}: gradient of {n} differs from eager: {m}")
        compiled_buffers = dict(compiled_model.named_buffers())
        for name, buffer in model.named_buffers():
            torch.testing.assert_close(compiled_buffers[name].cpu(), buffer, **FORWARD_TOLERANCE,
                                       msg=lambda m, n=name: f"{where}: buffer {n} differs from eager: {m}")
        assert {p.kind for p in programs} >= {"forward", "backward"}, (
            f"{where}: expected a forward and a backward program, got {[p.kind for p in programs]}")

    def test_memory_plan(self, target_name, memory_program):
        """Every program's plan frees or returns each storage once, never uses one after its
        free, and reports a peak between the largest storage and the sum of all."""
        self._skip_if_excluded(target_name, memory_program)
        programs = _memory_programs(target_name, self.device(target_name))[memory_program]()
        assert programs, f"memory program {memory_program}: nothing compiled for target {target_name!r}"
        for program in programs:
            checks.check_memory_plan(program, f"{memory_program} {program.kind} program")

    def test_deterministic(self, target_name, determinism_function):
        """The same function lowered twice gives byte-identical ``program.code()`` and kernel sources."""
        self._skip_if_excluded(target_name, determinism_function)
        fn, make_inputs = _determinism_functions()[determinism_function]
        inputs = [t.to(self.device(target_name)) for t in make_inputs()]
        first = fxwrap.lower(fn, *inputs, target=target_name)
        torch._dynamo.reset()
        second = fxwrap.lower(fn, *inputs, target=target_name)
        checks.check_same_output([first], [second], f"function {determinism_function}")


    delay_stream = None

    def test_stream_order(self, target_name):
        """Launches go to the current stream (``checks.check_stream_order``): a program run
        on a side stream after work queued there sees that work's result."""
        target = fxwrap.get_plugin_manager().target(target_name)
        if target.device.current_stream() is None:
            pytest.skip(f"target {target_name!r}: its device has no streams (current_stream() is None)")
        if self.delay_stream is None:
            pytest.skip(f"target {target_name!r}: the suite defines no delay_stream(ms) to hold a stream with")
        checks.check_stream_order(target_name, self.device(target_name), self.delay_stream)

    def test_graph_capture(self, target_name, capture_check):
        """Graph capture's shared rules on a target whose device declares ``graph_capture()``
        (``fxwrap.testing.capture``); a visible skip on one that does not."""
        self._skip_if_excluded(target_name, f"graph_capture_{capture_check}")
        target = fxwrap.get_plugin_manager().target(target_name)
        if target.device.graph_capture() is None:
            pytest.skip(f"target {target_name!r}: its device declares no graph capture "
                        "(DeviceInterface.graph_capture() is None)")
        CAPTURE_CHECKS[capture_check](target_name, self.device(target_name))


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


__all__ = ["ConformanceSuite", "OPINFO_OPS", "Unsupported", "dtype_name"]
