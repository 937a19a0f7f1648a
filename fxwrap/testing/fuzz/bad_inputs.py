"""The bad-input fuzzer: wrong inputs into a lowered program and its saved-and-loaded copy.

A fuzz program (one with no buffers: a buffer update would make two calls differ) is
lowered with ``fxwrap.lower(..., target=...)``, saved and loaded with ``fxwrap.load``;
then each of the two gets the right inputs with fresh values and a series of wrong ones,
each from one change of the right ones::

    dtype       an input in another dtype (float32 <-> bfloat16, float64, int32, uint8)
    strides     the same values in another layout (transposed storage, every other
                element, stride 0 where the values allow it, contiguous where it was not)
    sizes       an input one larger or smaller in one dimension
    device      an input on the meta device (and on cuda, where there is one)
    none        None for a tensor
    scalar      a Python float or int for a tensor
    arity       one argument too few or too many

Each call must give eager's numbers for the same arguments (where eager raises in a line no
output reads: those of eager without its dead lines), or raise
``fxwrap.InputMismatchError``; a call with the wrong number of arguments may raise the
``TypeError`` that ``Program.run`` documents.  Anything else (another exception, wrong
numbers, eager failing where the program returned) is a problem, reported with the
change that caused it.
"""
from __future__ import annotations

import os
import random
import tempfile

import torch

import fxwrap
from fxwrap.testing.fuzz import harness

DTYPE_SWAPS = {torch.float32: (torch.bfloat16, torch.float64), torch.bfloat16: (torch.float32,),
               torch.int64: (torch.int32, torch.float32), torch.bool: (torch.uint8, torch.float32)}


def _relayout(t: torch.Tensor, rng: random.Random) -> tuple[torch.Tensor, str]:
    if not t.is_contiguous():
        return t.contiguous(), "made contiguous"
    if t.dim() >= 2 and rng.random() < 0.5:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2), "in transposed storage"
    if t.dim() >= 1:
        wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2], "every other element of a wider tensor"
    return t.reshape(1)[0], "a 0-dim view of a 1-element tensor"


def _resized(t: torch.Tensor, spec, rng: random.Random, seed: int) -> tuple[torch.Tensor, str]:
    if t.dim() == 0:
        return t.reshape(1), "one dimension more"
    d = rng.randrange(t.dim())
    shape = list(t.shape)
    shape[d] = max(1, shape[d] + rng.choice((-1, 1, 2)))
    spec = (spec[0], tuple(shape), spec[2], spec[3], spec[4], "contiguous", False)
    if spec[3] == "perm":  # a permutation stays one
        spec = (spec[0], tuple(shape), spec[2], "randint", (0, shape[0]), "contiguous", False)
    return harness.make_tensor(spec, seed, 777), f"dimension {d} of size {shape[d]}"


def variations(args: list, specs: list, rng: random.Random, seed: int):
    """``(description, args, i)`` triples: the right arguments with fresh values, then one
    change each (``i``: the argument changed, None for the fresh values and the arity)."""
    fresh = [harness.make_tensor((*s[:6], False), seed + 1, i) for i, s in enumerate(specs)]
    yield "the compiled layout, fresh values", fresh, None
    for i, (t, spec) in enumerate(zip(args, specs)):
        def changed(value, i=i):
            return [value if j == i else a.clone() for j, a in enumerate(args)]
        name = spec[0]
        for dtype in DTYPE_SWAPS.get(t.dtype, ()):
            yield f"{name} as {dtype}", changed(t.to(dtype)), i
        relaid, how = _relayout(t, rng)
        yield f"{name} {how}", changed(relaid), i
        resized, how = _resized(t, spec, rng, seed)
        yield f"{name} with {how}", changed(resized), i
        yield f"{name} on the meta device", changed(t.to("meta")), i
        if torch.cuda.is_available():
            yield f"{name} on cuda", changed(t.to("cuda")), i
        yield f"{name} as None", changed(None), i
        yield f"{name} as a Python scalar", changed(1.5 if t.is_floating_point() else 2), i
    if args:
        yield "one argument too few", [a.clone() for a in args[:-1]], None
    yield "one argument too many", [a.clone() for a in args] + [torch.ones(3)], None


def _outcome(fn, args):
    try:
        return "ok", fn(*args)
    except Exception as error:  # noqa: BLE001 - every exception is classified by the caller
        return "error", error


def _as_list(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _judge(what: str, compiled, eager, loosest=None) -> str | None:
    kind, value = compiled
    if kind == "error":
        if isinstance(value, fxwrap.InputMismatchError):
            return None
        if isinstance(value, TypeError) and what.startswith("one argument"):
            return None
        if eager[0] == "error":  # eager raises too (an index out of range of a smaller input)
            return None
        return f"{what}: raised {type(value).__name__}: {str(value).splitlines()[0] if str(value) else ''}"[:400]
    if eager[0] == "error":
        return f"{what}: returned a result where eager raises {type(eager[1]).__name__}"
    got, want = _as_list(value), _as_list(eager[1])
    # an input on the meta device that the program reads is an InputMismatchError (above); one
    # it does not read (no graph input: dynamo dropped it) changes nothing: eager's numbers
    if len(got) != len(want):
        return f"{what}: returned {len(got)} values, eager {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, torch.Tensor) and w.device.type == "meta":  # eager's is a view of the meta input
            if not (isinstance(g, torch.Tensor) and g.device.type == "meta" and g.shape == w.shape
                    and g.dtype == w.dtype):
                return f"{what}: output {i} is not eager's meta tensor and no InputMismatchError was raised"
            continue
        message = harness.compare(f"output {i}", g, w, loosest=loosest)
        if message:
            return f"{what}: wrong numbers: {message}"
    return None


def _without_dead_code(module, dynamic: bool, call_args):
    """``module`` on ``call_args`` with its dead lines left out, as every compiler leaves them
    out: through ``aot_eager`` (dynamo's ``eager`` keeps them).  Seed 232: an
    ``index_select`` whose result no output reads goes out of range for a smaller input;
    eager raises, the program computes its outputs, which must be these."""
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            return torch.compile(module, backend="aot_eager", dynamic=dynamic)(
                *[a.clone() if isinstance(a, torch.Tensor) else a for a in call_args])
    finally:
        torch._dynamo.reset()


def check_bad_inputs(ns: dict, target: str, seed: int | None = None) -> tuple[list[str], int]:
    """``(problems, calls)`` of the bad-input fuzzer on the program of ``ns`` (a namespace of
    ``generator.load``); a program with buffers, or for a target whose device is not the CPU,
    is skipped (no problems, no calls)."""
    if ns["BUFFERS"]:
        return [], 0
    if harness.target_device(target).type != "cpu":
        return [], 0  # the variations are drawn on the CPU: the CPU-side targets only, for now
    seed = ns["SEED"] if seed is None else seed
    rng = random.Random(seed)
    specs = ns["INPUTS"]
    args = [harness.make_tensor((*s[:6], False), ns["SEED"], i) for i, s in enumerate(specs)]
    module = harness.make_module(ns)

    def eager(*call_args):
        cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in call_args]
        with torch.no_grad():
            return module(*cloned)

    torch._dynamo.reset()
    try:
        program = fxwrap.lower(module, *[a.clone() for a in args], target=target, dynamic=ns["DYNAMIC"])
    except Exception as error:  # noqa: BLE001 - a failing compile is the main check's business
        return [f"lower raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:400]], 0
    finally:
        torch._dynamo.reset()
    runners = [("Program.run", program.run)]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "program.fxw")
        try:
            program.save(path)
            runners.append(("loaded run", fxwrap.load(path).run))
        except Exception as error:  # noqa: BLE001
            return [f"save/load raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:400]], 0
        problems, calls = [], 0
        # the arguments the program reads (dynamo drops one that only dead code uses: eager
        # may raise on a wrong one there, where the program computes what it computes anyway)
        sources = program.arguments.sources if program.arguments is not None else ()
        read = {s[1] for s in sources if s[0] in ("arg", "int", "float")} | \
            {s[2] for s in sources if s[0] in ("size", "stride", "offset")}
        for what, call_args, changed in variations(args, specs, rng, ns["SEED"]):
            want = _outcome(eager, call_args)
            if want[0] == "error" and changed is not None and program.arguments is not None and changed not in read:
                want = _outcome(eager, args)  # an argument the program does not read: the right one's numbers
            elif want[0] == "error":
                want = _outcome(lambda *a: _without_dead_code(module, ns["DYNAMIC"], a), call_args)
            for runner_name, run in runners:
                cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in call_args]
                calls += 1
                problem = _judge(what, _outcome(run, cloned), want, harness.loosest_dtype(ns))
                if problem:
                    problems.append(f"{runner_name}: {problem}")
    return problems, calls
