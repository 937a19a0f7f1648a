"""Programs the fuzzer (``fxwrap.testing.fuzz``) found failing, minimised, on every CPU-side
target.  Each is the program of a reproducer file, cut down to the lines that still fail."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import fxwrap
from fxwrap.ir.lines import CallKernel
from fxwrap.testing.fuzz import check, generate, load

TARGETS = ["cpu", "reference", "triton-interpret", "mps_shim"]


def _needs(target: str):
    if target == "triton-interpret" and importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the triton-interpret target needs it (pip install fxwrap[triton])")


# seed 31 on triton-interpret: the backward of a slice over a size-1 dimension is a slice_scatter
# whose mask compared two index constants (0 < 1) in the kernel, and Triton's interpreter
# refused that mask ("ValueError: mask has unsupported dtype")
SLICE_OF_A_SIZE_1_DIM_BACKWARD = '''SEED = 31
DYNAMIC = True
BACKWARD = True
INPUTS = [
    ('x0', (16,), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('x1', (3, 1), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('x2', (4, 2, 2), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('i7', (1,), torch.int64, 'randint', (0, 1), 'contiguous', False),
    ('i8', (8,), torch.int64, 'randint', (0, 3), 'contiguous', False),
    ('x12', (8, 1), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('x13', (8,), torch.bfloat16, 'randn', None, 'offset', True),
]
BUFFERS = [
]


class Program(torch.nn.Module):
    def forward(self, x0, x1, x2, i7, i8, x12, x13):
        v5 = x1.narrow(1, 0, 1)
        v9 = torch.index_select(v5, 0, i8)
        v10 = -1.25 * v9
        v14 = torch.nn.functional.linear(v10, x12, x13)
        return (v14,)
'''

# seed 331 on reference (wrong numbers on every target): an index op read a gather of a lazy
# value lazily; the gather's own lazy read took the same placeholder symbol for its index as
# the index op had for its own, so the x[:, i7] position was replaced by the gather's index
GATHER_OF_A_LAZY_VALUE_INDEXED = '''SEED = 331
DYNAMIC = False
BACKWARD = True
INPUTS = [
    ('x0', (7, 7, 1), torch.float32, 'randn', None, 'strided', True),
    ('x1', (4, 3, 6), torch.float32, 'randn', None, 'contiguous', True),
    ('x2', (16, 16, 1), torch.float32, 'randn', None, 'contiguous', True),
    ('i5', (16, 16, 2), torch.int64, 'randint', (0, 1), 'contiguous', False),
    ('i7', (3,), torch.int64, 'randint', (0, 16), 'contiguous', False),
]
BUFFERS = [
]


class Program(torch.nn.Module):
    def forward(self, x0, x1, x2, i5, i7):
        v4 = torch.round(x2)
        v6 = torch.gather(v4, 2, i5)
        v8 = v6[:, i7]
        return (v8,)
'''

# seed 930737 on cpu (the H200 machine's CPU): a GEMM template whose group stores nothing
# (its values kept by other lines) was timed as a candidate of None (TypeError in
# template_choice._digest)
LINEAR_OF_AN_INDEX_SELECT = '''SEED = 930737
DYNAMIC = True
BACKWARD = True
INPUTS = [
    ('x0', (3, 3, 6, 3), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('i1', (5,), torch.int64, 'randint', (0, 3), 'contiguous', False),
    ('x3', (4, 3), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('x4', (4,), torch.bfloat16, 'randn', None, 'contiguous', True),
    ('x6', (4,), torch.bfloat16, 'randn', None, 'strided', True),
    ('x9', (3, 3), torch.bfloat16, 'randn', None, 'expanded', True),
]
BUFFERS = [
]


class Program(torch.nn.Module):
    def forward(self, x0, i1, x3, x4, x6, x9):
        v2 = torch.index_select(x0, 1, i1)
        v5 = torch.nn.functional.linear(v2, x3, x4)
        v7 = x4 > x6
        v8 = torch.sign(v2)
        v10 = torch.nn.functional.linear(v8, x9, None)
        return (v10, v5, v7,)
'''

PROGRAMS = {"slice-of-a-size-1-dim-backward": SLICE_OF_A_SIZE_1_DIM_BACKWARD,
            "gather-of-a-lazy-value-indexed": GATHER_OF_A_LAZY_VALUE_INDEXED}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_found_program_matches_eager(name, target):
    _needs(target)
    assert check(load(PROGRAMS[name]), target) == ("pass", "")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dynamic", [False, True])
def test_slice_of_a_size_1_dim_backward(target, dynamic):
    _needs(target)
    torch._dynamo.reset()
    x = torch.randn(3, 1, requires_grad=True)
    ref = x.detach().clone().requires_grad_()
    cot = torch.randn(3, 1)
    compiled = torch.compile(lambda t: t.narrow(1, 0, 1).sin(), backend=fxwrap.Backend(target), dynamic=dynamic)
    (got,) = torch.autograd.grad(compiled(x), x, cot)
    (want,) = torch.autograd.grad(ref.narrow(1, 0, 1).sin(), ref, cot)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_an_index_of_a_gather_of_a_pointwise_value(target):
    _needs(target)
    torch._dynamo.reset()
    x = torch.randn(4, 5, 3)
    index = torch.randint(0, 3, (4, 5, 2))
    rows = torch.tensor([2, 0, 4, 4])

    def fn(x, index, rows):
        return torch.gather(torch.sin(x), 2, index)[:, rows]
    got = torch.compile(fn, backend=fxwrap.Backend(target))(x, index, rows)
    torch.testing.assert_close(got, fn(x, index, rows))


@pytest.mark.parametrize("target", TARGETS)
def test_seed_4_an_indexed_write_joins_a_reshaped_job(target, monkeypatch):
    """Fuzz seed 4 (cpu, after the indexed-write kernels landed): the scheduler reshaped a job
    holding an indexed store, whose offset is an int64 value, not an index expression
    (SympifyError at compile time); such a job is never reshaped.  Found with the GEMM
    templates on (the fuzz command's default), which tests/conftest.py turns off."""
    _needs(target)
    monkeypatch.setenv("FXWRAP_TEMPLATES", "auto")
    assert check(load(generate(4)), target) == ("pass", "")


def test_seed_40_templates_time_a_product_with_an_expanded_bias(monkeypatch):
    """Fuzz seed 40 (cpu, templates on): a linear whose bias is an expanded input (stride 0)
    that needs its gradient.  Timing the GEMM template against the extern filled each
    argument elementwise, and a buffer whose elements overlap cannot be written so
    (RuntimeError at compile time); the timing inputs are now views of random storage."""
    monkeypatch.setenv("FXWRAP_TEMPLATES", "auto")
    torch._dynamo.reset()
    x = torch.randn(1, 4, 8, 1, requires_grad=True)
    w = torch.randn(4, 1, requires_grad=True)
    bias = torch.randn(1).expand(4).detach().requires_grad_()

    def fn(x, w, b):
        return torch.add(torch.nn.functional.linear(x, w, b), 0.5, alpha=2)
    got = torch.compile(fn, backend=fxwrap.Backend("cpu"))(x, w, bias)
    want = fn(x, w, bias)
    torch.testing.assert_close(got, want)
    cot = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad(got, (x, w, bias), cot),
                               torch.autograd.grad(want, (x, w, bias), cot))


def test_an_interpreter_that_cannot_call_triton_library_functions_is_named(monkeypatch):
    """Fuzz on the device (triton 3.6): with triton imported before TRITON_INTERPRET was set,
    that interpreter raised "Cannot call @triton.jit'd outside of the scope of a kernel" at
    every ``tl.sum``.  The launcher now says what to do; the fuzz command sets the variable."""
    pytest.importorskip("triton", reason="the triton-interpret target needs triton")
    from fxwrap.targets.cuda_triton.launcher import InterpretedLauncher

    class Refusing:
        __name__ = "fxwrap_reduction_0"

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                raise RuntimeError("Cannot call @triton.jit'd outside of the scope of a kernel")
            return run

    from fxwrap.runtime.launch import TritonLaunch
    launch = TritonLaunch(pointers=1, size_symbols=(), numels=(("x", "8"),), config=(("XBLOCK", 8),))
    launcher = InterpretedLauncher(Refusing(), launch)
    with pytest.raises(RuntimeError, match=r"fxwrap_reduction_0 \(target triton-interpret\).*TRITON_INTERPRET=1"):
        launcher(torch.zeros(8))
# every seed on cpu; the smallest on the other targets (the timing code is the same for all)
COMPILE_ERROR_SEEDS = [(seed, "cpu") for seed in (91, 354, 373, 561)] + [(561, t) for t in TARGETS if t != "cpu"]


@pytest.mark.parametrize(("seed", "target"), COMPILE_ERROR_SEEDS)
def test_cuda_run_compile_error_seeds(seed, target, monkeypatch):
    """Seeds 91, 354, 373, 561 (compile errors of the H100 fuzz run, and on every CPU-side
    target with the templates on): timing a GEMM template copied random values into an
    expanded input (stride 0), which torch refuses ("more than one element of the
    written-to tensor refers to a single memory location").  The timing cache is off:
    every compile times its candidates."""
    _needs(target)
    monkeypatch.setenv("FXWRAP_TEMPLATES", "auto")
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    assert check(load(generate(seed)), target) == ("pass", "")


@pytest.mark.parametrize("templates", ["auto", "always"])
def test_a_template_over_an_expanded_input(templates, monkeypatch):
    """The smallest form of the seeds above: ``x.expand(6, 4) @ w`` with the GEMM template
    timed (``auto``) or taken (``always``)."""
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    torch._dynamo.reset()
    x, w = torch.randn(1, 4).expand(6, 4), torch.randn(4, 3)
    compiled = torch.compile(torch.matmul, backend=fxwrap.Backend("cpu", options={"templates": templates}))
    torch.testing.assert_close(compiled(x, w), torch.matmul(x, w))


def test_a_template_after_a_kernel_with_workspaces():
    """Seed 373 on cpu (wrong numbers where the template was chosen): a GEMM template
    rendered after a reduction that has workspaces (``all`` over a dynamic size: its split
    plan's partials) declared that reduction's ``ws_ptr`` parameters too, so its size
    arguments landed in pointer parameters (M was a pointer's bits)."""
    torch._dynamo.reset()
    programs = []

    def fn(x, a, w):
        return (x <= 0).all(dim=0), a @ w
    x, a, w = torch.randn(6, 5), torch.randn(6, 4), torch.randn(4, 3)
    compiled = torch.compile(fn, backend=fxwrap.Backend("cpu", options={"templates": "always",
                                                                        "on_program": programs.append}),
                             dynamic=True)
    for got, want in zip(compiled(x, a, w), fn(x, a, w)):
        torch.testing.assert_close(got, want)
    calls = [line for p in programs for line in p.lines if type(line).__name__ == "CallKernel"]
    assert any("template" in c.kernel.name for c in calls) and any(
        any(getattr(arg, "name", "").startswith("ws") for arg in c.args) for c in calls), \
        "the program no longer has a template after a kernel with workspaces: the test checks nothing"


@pytest.mark.parametrize(("seed", "target"), [(269, "cpu"), (962, "triton-interpret"), (592, "triton-interpret"),
                                             (662, "triton-interpret"), (1970, "reference"), (232, "mps_shim"),
                                             (232, "cpu"), (941330, "reference"), (941330, "cpu")])
def test_bad_input_seeds(seed, target):
    """Seeds 269 (cpu) and 962 (triton-interpret), bad-input fuzzer: ``fxwrap.lower(module,
    ..., dynamic=True)`` gave a program with no argument map, so ``Program.run`` raised
    TypeError for every call: dynamo passed ``b5.storage_offset()``, ``x1.stride(0)`` and
    ``x2.shape[0]`` (a size a guard made 2 in every buffer) as size inputs that no buffer
    dimension carries, and a module's parameter names were its ``__call__``'s (``*args``),
    not ``forward``'s.  Seed 592: a smaller input makes a gather index out of range; the
    program raises as eager does (IndexError), which the fuzzer counted as a problem.  Seed
    662: a float index into a line whose result is dead: eager raises, the program (which
    does not read that argument) gives the right outputs; the fuzzer compares them.  Seed
    1970: a float32 result of a bfloat16 erf, one bfloat16 ulp off: the bad-input runs now
    compare with the program's loosest dtype's tolerance, as its first run does.  Seed 232
    (mps_shim): a narrower input makes a dead ``index_select`` (no output reads it) go out of
    range; eager raises, the program rightly computes its live outputs, which the fuzzer now
    compares with eager's outputs without dead lines (``aot_eager``).  Seed 941330: an
    ``index_put`` whose values' size (``i3.shape[1]``) must equal the indexed shape's (3),
    which no dynamo guard states: ``i3`` one wider ran the kernel where eager raises; the
    input guard now checks the relation the lowering relied on."""
    _needs(target)
    from fxwrap.testing.fuzz import check_bad_inputs
    problems, calls = check_bad_inputs(load(generate(seed)), target)
    assert calls > 0 and not problems, "\n".join(problems)


@pytest.mark.parametrize("target", TARGETS)
def test_seed_1271_copy_of_a_number_into_an_input(target):
    """Fuzz seeds 1271 and 1985 (reference, on the H100 machine's CPU): ``x.copy_(0.5)``
    under ``dynamic=True`` reaches ``aten.copy`` with a Python number as the source, which
    the copy rule read as a tensor (AttributeError at compile time)."""
    _needs(target)
    torch._dynamo.reset()

    def fn(x):
        x.copy_(0.5)
        return torch.logsumexp(x, dim=(0,), keepdim=True) * x

    x, ref = torch.randn(5), torch.randn(5)
    got = torch.compile(fn, backend=fxwrap.Backend(target), dynamic=True)(x)
    torch.testing.assert_close(got, fn(ref))
    torch.testing.assert_close(x, ref)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("same", [False, True])
def test_seed_1206_a_bool_of_scalars_meets_a_block(target, same):
    """Fuzz seed 1206 (triton-interpret): ``any(x != y)`` of two stride-0 inputs.  The kernel
    loads both at offset 0 (scalars); Triton's interpreter labels the scalar comparison with
    float32, broadcasts it into the accumulator block as float data and refuses ``acc | c``
    ("ufunc 'bitwise_or' not supported").  Such a bool is now made through
    ``tl.where(c, True, False)``, which compiled Triton folds away."""
    _needs(target)
    torch._dynamo.reset()

    def fn(x, y, z):
        ne = x != y
        return ne.any(0), (ne ^ ne.any(0)).any(0), ne | (z > 0), (x < 0) & (z < 0)

    y = torch.randn(1)
    x = (y.clone() if same else torch.randn(1)).expand(6)
    z = torch.randn(6)
    compiled = torch.compile(fn, backend=fxwrap.Backend(target), dynamic=True)
    for got, want in zip(compiled(x, y.expand(6), z), fn(x, y.expand(6), z)):
        torch.testing.assert_close(got, want)
    assert check(load(generate(1206)), target) == ("pass", "")


@pytest.mark.parametrize("shape", [(1, 3, 2), (2, 3, 2), (1, 5, 4), (3, 1, 2)])
def test_a_concatenation_read_through_masked_loads_matches_eager(shape):
    """``cat([sin(x), 2 * sin(x)], 1)``: one kernel whose loads are masked by the row's half.
    gcc 12.2 at -O3 for AVX-512 if-converted them into wrong lanes (0 where eager has
    ``2 * sin(x)``, shape (1, 3, 2), fuzz seed 701246); such a kernel opts out of
    loop if-conversion (``FX_NO_IFCVT``, cpu_cpp/prelude.py)."""
    def f(x):
        v = x.sin()
        return torch.cat([v, v * 2], 1)

    x = torch.randn(*shape)
    program = fxwrap.lower(f, x, target="cpu", options={"cache": False})
    torch.testing.assert_close(program.run(x), f(x))
    heads = [line for k in [line.kernel for line in program.lines if isinstance(line, CallKernel)] for line in k.source.splitlines() if line.startswith('extern "C"')]
    assert any("NO_IFCVT" in h for h in heads), heads


@pytest.mark.parametrize("target", TARGETS)
def test_seeds_920585_921802_any_of_bools_meets_a_bool(target):
    """Fuzz seeds 920585 and 921802 (cpu, on the H200 machine's CPU): ``maximum(any(b), c)``
    of bools; the C++ kernel's any-reduction state is a ``bool`` while bool values are byte
    locals, and ``fx_max(bool&, const uint8_t&)`` did not compile."""
    _needs(target)
    torch._dynamo.reset()

    def fn(b, c):
        v = torch.stack([b, b], 1)
        return ~torch.maximum(torch.any(v), c), torch.all(b, dim=1)

    g = torch.Generator().manual_seed(5)
    for c in (torch.tensor(False), torch.tensor(True)):
        b = torch.rand(5, 8, generator=g) > 0.3
        got = torch.compile(fn, backend=fxwrap.Backend(target))(b, c)
        for x, y in zip(got, fn(b, c)):
            assert torch.equal(x, y)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(20, 3), (4, 5, 3), (7, 2)])
def test_seed_920798_a_select_over_unrolled_lanes(target, shape):
    """Fuzz seed 920798 (cpu, on the H200 machine's CPU and here): relu's backward, a select
    ``where(relu(a) <= 0, 0, b)``, over a last dimension of 3 is unrolled into three lanes in
    the vectorized loop; gcc (12.2, 13.3) if-converted it with masked moves that mixed the
    lanes up (981 of 6000 elements wrong with AVX2).  Such kernels opt out of if-conversion."""
    _needs(target)
    torch._dynamo.reset()

    def fn(a, b):
        return torch.where(torch.relu(a) <= 0, 0.0, b)

    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    torch.testing.assert_close(torch.compile(fn, backend=fxwrap.Backend(target))(a, b), fn(a, b))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("view", ["unsqueeze", "transpose"])
def test_seed_931065_a_value_of_a_view_read_before_its_base_is_written(target, view):
    """Fuzz seed 931065 (cpu, on the H200 machine's CPU): ``v = f(x.unsqueeze(0))`` then
    ``x.add_(y)``.  The kernel computing ``v`` from the view took the write into ``x`` too
    (the scheduler compared buffer names, not the storage a view reads), with the view and
    ``x`` as two ``__restrict__`` pointers: ``v`` read values already written (0.98 off).
    A transposed view would read other iterations' writes even without ``restrict``."""
    _needs(target)
    torch._dynamo.reset()

    def fn(x, y):
        v = x.unsqueeze(0) if view == "unsqueeze" else x.t()
        out = v / (torch.abs(v ** 3) + 1)
        x.add_(y)
        return out, torch.logsumexp(x.unsqueeze(0), dim=(0, 1))

    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g)
    xe, xc = x.clone(), x.clone()
    expected = fn(xe, y)
    got = torch.compile(fn, backend=fxwrap.Backend(target))(xc, y)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(xc, xe)


PROD_OF_A_LOG_OVER_A_SIZE_1_DIM = '''SEED = 930216
DYNAMIC = True
BACKWARD = True
INPUTS = [
    ('x0', (2, 8, 6), torch.float32, 'randn', None, 'transposed', True),
]
BUFFERS = [
]


class Program(torch.nn.Module):
    def forward(self, x0):
        return (torch.prod(torch.log(x0).unsqueeze(3), 3, keepdim=True),)
'''


def test_seed_930216_a_difference_aot_eager_shares_is_torchs():
    """Fuzz seed 930216 (cpu and c99, on the H200 machine's CPU): ``prod`` over a size-1
    dimension of ``log(x)``.  Eager's backward is NaN where ``x < 0`` (``result / input``);
    the traced backward, which ``aot_eager`` runs with eager kernels too, is finite there.
    fxwrap matches ``aot_eager``: the harness calls it torch's difference, not a mismatch."""
    from fxwrap.testing.fuzz.harness import check
    status, message = check(load(PROD_OF_A_LOG_OVER_A_SIZE_1_DIM), "cpu")
    assert status == "torch_error" and "aot_eager differs from eager as fxwrap does" in message, (status, message)


@pytest.mark.parametrize("target", TARGETS)
def test_seed_930737_a_template_that_stores_nothing_is_no_candidate(target, monkeypatch):
    """Seed 930737 with GEMM templates timed (the fuzz default): see LINEAR_OF_AN_INDEX_SELECT."""
    _needs(target)
    monkeypatch.setenv("FXWRAP_TEMPLATES", "auto")
    monkeypatch.setenv("FXWRAP_TEMPLATE_CACHE", "0")
    assert check(load(LINEAR_OF_AN_INDEX_SELECT), target) == ("pass", "")
