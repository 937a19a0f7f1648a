"""``TemplateConformance``: what a GEMM template must do, as tests a vendor subclasses.

    # tests/test_template_conformance.py of a plugin package
    import torch
    from fxwrap.testing.templates import TemplateConformance

    class TestMyGemm(TemplateConformance):
        target = "npu"                 # the target the template is registered for
        template = "my_gemm"           # its Template.name
        dtypes = (torch.float32,)      # what its refusal() accepts
        ops = ("mm", "addmm")          # of "mm", "addmm", "bmm"

Every case compiles with ``options={"templates": "always"}`` and checks that the
template's kernel ran -- the one launch of the program, the ``TemplateChoice`` naming
the template, no ATen matrix product left -- and that its results are eager's on fresh
random inputs: each epilogue (bias, relu, gelu, residual add, a bf16 cast), transposed
and sliced operands, odd sizes (1, primes, not multiples of any tile) and
``dynamic=True``.  pytest collects the ``test_*`` methods of the subclass; this base
class (no ``Test`` prefix) is not collected itself.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import fxwrap
from fxwrap.ir.lines import CallExtern, CallKernel, TemplateChoice

aten = torch.ops.aten
_PRODUCTS = {aten.mm.out, aten.addmm.out, aten.bmm.out, aten.mm.default, aten.addmm.default, aten.bmm.default}

EPILOGUES = {
    "none": lambda y, b, r: y,
    "bias": lambda y, b, r: y + b,
    "bias_relu": lambda y, b, r: torch.relu(y + b),
    "bias_gelu": lambda y, b, r: F.gelu(y + b),
    "residual": lambda y, b, r: y * 0.5 + r,
}
SIZES = ((1, 1, 1), (1, 37, 5), (7, 1, 9), (33, 65, 17), (64, 48, 96))
LAYOUTS = ("nn", "nt", "tn", "tt", "sliced")


def _operands(m, k, n, layout, dtype, device, batch=None):
    lead = () if batch is None else (batch,)

    def randn(*shape):
        return torch.randn(*shape, dtype=dtype, device=device)
    if layout == "sliced":
        return randn(*lead, m, 2 * k)[..., ::2], randn(*lead, k + 3, n + 2)[..., 2:-1, 1:-1]
    a = randn(*lead, m, k) if layout[0] == "n" else randn(*lead, k, m).mT
    b = randn(*lead, k, n) if layout[1] == "n" else randn(*lead, n, k).mT
    return a, b


class TemplateConformance:
    """Subclass with ``target``, ``template`` and what the template accepts."""

    target: str = ""
    template: str = ""
    dtypes: tuple = (torch.float32,)
    ops: tuple = ("mm", "addmm")
    #: other templates of the target listed before this one that ``templates="always"`` gives
    #: the shapes they specialize in (fxwrap's ``triton_gemv``: one-row products): a case of
    #: such a shape passes when one of them ran it
    shares_with: tuple = ()

    def tolerance(self, dtype) -> dict:
        return dict(atol=3e-2, rtol=3e-2) if dtype in (torch.bfloat16, torch.float16) else dict(atol=1e-4, rtol=1e-4)

    # -- helpers -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The target's device: every input is made there, and eager runs there too."""
        return torch.device(fxwrap.get_plugin_manager().target(self.target).device_type)

    def randn(self, *shape, dtype) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=self.device)

    def compile(self, fn, dynamic=False):
        torch._dynamo.reset()  # every case a fresh compile (one code object, many closures)
        programs: list = []
        options = {"templates": "always", "on_program": programs.append}
        return torch.compile(fn, backend=fxwrap.Backend(self.target, options), dynamic=dynamic,
                             fullgraph=True), programs

    def check_ran(self, programs, launches: int = 1):
        lines = [ln for p in programs for ln in p.lines]
        choices = [ln for ln in lines if isinstance(ln, TemplateChoice)]
        assert choices and all(c.chosen in (self.template, *self.shares_with) for c in choices), \
            f"template {self.template!r} did not run: {[c.text for c in choices]}"
        assert not [ln for ln in lines if isinstance(ln, CallExtern) and ln.op in _PRODUCTS], \
            "a matrix product still runs as an ATen call"
        assert sum(isinstance(ln, CallKernel) for ln in lines) == launches, "the epilogue is not fused"

    def _need(self, op, dtype):
        if op not in self.ops or dtype not in self.dtypes:
            pytest.skip(f"{self.template} does not declare {op} on {dtype}")

    # -- the tests ---------------------------------------------------------------------
    @pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
    def test_epilogue(self, epilogue, dtype):
        self._need("mm", dtype)
        ep = EPILOGUES[epilogue]

        def fn(a, w, b, r):
            return ep(a @ w, b, r)

        c, programs = self.compile(fn)
        a, w = _operands(29, 40, 51, "nn", dtype, self.device)
        b, r = self.randn(51, dtype=dtype), self.randn(29, 51, dtype=dtype)
        torch.testing.assert_close(c(a, w, b, r), fn(a, w, b, r), **self.tolerance(dtype))
        self.check_ran(programs)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
    def test_linear_relu(self, dtype):
        """``relu(linear(x, w, b))``: addmm over the transposed weight, relu fused."""
        self._need("addmm", dtype)

        def fn(x, w, b):
            return torch.relu(F.linear(x, w, b))

        c, programs = self.compile(fn)
        x, w, b = self.randn(19, 45, dtype=dtype), self.randn(38, 45, dtype=dtype), self.randn(38, dtype=dtype)
        torch.testing.assert_close(c(x, w, b), fn(x, w, b), **self.tolerance(dtype))
        self.check_ran(programs)

    def test_cast_to_bfloat16(self):
        self._need("mm", torch.float32)

        def fn(a, w):
            return torch.sigmoid(a @ w).to(torch.bfloat16)

        c, programs = self.compile(fn)
        a, w = _operands(21, 33, 18, "nn", torch.float32, self.device)
        torch.testing.assert_close(c(a, w), fn(a, w), atol=1e-2, rtol=1e-2)
        self.check_ran(programs)

    @pytest.mark.parametrize("layout", LAYOUTS)
    def test_layouts(self, layout):
        dtype = self.dtypes[0]
        self._need("mm", dtype)

        def fn(a, w):
            return torch.mm(a, w) - 1

        c, programs = self.compile(fn)
        a, w = _operands(23, 31, 27, layout, dtype, self.device)
        torch.testing.assert_close(c(a, w), fn(a, w), **self.tolerance(dtype))
        self.check_ran(programs)

    @pytest.mark.parametrize("m,k,n", SIZES)
    def test_odd_sizes(self, m, k, n):
        dtype = self.dtypes[0]
        self._need("mm", dtype)

        def fn(a, w):
            return torch.tanh(a @ w)

        c, programs = self.compile(fn)
        a, w = _operands(m, k, n, "nt", dtype, self.device)
        torch.testing.assert_close(c(a, w), fn(a, w), **self.tolerance(dtype))
        self.check_ran(programs)

    def test_bmm(self):
        dtype = self.dtypes[0]
        self._need("bmm", dtype)

        def fn(a, w, r):
            return torch.bmm(a, w) + r

        c, programs = self.compile(fn)
        a, w = _operands(13, 22, 17, "nt", dtype, self.device, batch=3)
        r = self.randn(3, 13, 17, dtype=dtype)
        torch.testing.assert_close(c(a, w, r), fn(a, w, r), **self.tolerance(dtype))
        self.check_ran(programs)

    def test_dynamic_shapes(self):
        dtype = self.dtypes[0]
        self._need("addmm", dtype)

        def fn(x, w, b):
            return F.silu(F.linear(x, w, b))

        c, programs = self.compile(fn, dynamic=True)
        w, b = self.randn(24, 40, dtype=dtype), self.randn(24, dtype=dtype)
        for rows in (5, 17, 64):
            x = self.randn(rows, 40, dtype=dtype)
            torch.testing.assert_close(c(x, w, b), fn(x, w, b), **self.tolerance(dtype))
        assert any(isinstance(ln, TemplateChoice) and ln.chosen == self.template for p in programs for ln in p.lines)
