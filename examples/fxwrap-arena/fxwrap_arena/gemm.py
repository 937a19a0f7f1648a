"""The arena target's own GEMM template: a blocked float32 ``mm`` / ``addmm`` with fxwrap's
epilogue fused in, where a vendor would call its GEMM library (see docs/templates.md)."""
import torch

import fxwrap
from fxwrap.targets.cstyle import LocalNames, Scope, append_block

aten = torch.ops.aten


class ArenaBlockedGemm(fxwrap.Template):
    """``C = A @ B`` in ``BLOCK x BLOCK`` output blocks (one OpenMP task each): the block's sums
    in ``acc[i][j]``, then the epilogue's stores over ``template_out = acc[i][j]``."""

    name = "arena_blocked_gemm"
    ops = frozenset({aten.mm.default, aten.addmm.default})
    BLOCK = 32

    def refusal(self, call):
        return None if call.dtype == torch.float32 else f"{call.dtype} operands (arena_blocked_gemm computes float32)"

    def render(self, kernel, emitter):
        call = kernel.template
        a, b = call.operands
        idx = emitter.render_index
        m, n, k = (idx(call.size(d)) for d in ("m", "n", "k"))
        x0, x1 = (v.name for v in call.index)
        fn = Scope(emitter, LocalNames(), None, kernel=kernel)
        epilogue = emitter.template_epilogue(kernel, fn, "acc[i][j]")
        B = self.BLOCK
        body = [f"const int64_t M = {m}, N = {n}, K = {k};",
                f"const int64_t mblocks = (M + {B - 1}) / {B}, nblocks = (N + {B - 1}) / {B};",
                "#pragma omp parallel for schedule(static)"]
        block = ["const int64_t m0 = (blk / nblocks) * %d, n0 = (blk %% nblocks) * %d;" % (B, B),
                 f"const int64_t mc = M - m0 < {B} ? M - m0 : {B}, nc = N - n0 < {B} ? N - n0 : {B};",
                 f"float acc[{B}][{B}] = {{}};"]
        product = [f"const float av = in_ptr0[(m0 + i) * {idx(a.stride[0])} + kk * {idx(a.stride[1])}];",
                   "#pragma omp simd",
                   f"for (int64_t j = 0; j < nc; ++j) acc[i][j] += av * in_ptr1[kk * {idx(b.stride[0])} + "
                   f"(n0 + j) * {idx(b.stride[1])}];"]
        kloop: list = []
        append_block(kloop, "for (int64_t i = 0; i < mc; ++i)", product)
        append_block(block, "for (int64_t kk = 0; kk < K; ++kk)", kloop)
        store = [f"const int64_t {x0} = m0 + i;", f"const int64_t {x1} = n0 + j;", *epilogue]
        row: list = []
        append_block(row, "for (int64_t j = 0; j < nc; ++j)", store)
        append_block(block, "for (int64_t i = 0; i < mc; ++i)", row)
        append_block(body, "for (int64_t blk = 0; blk < mblocks * nblocks; ++blk)", block)
        return emitter.template_source(kernel, fn.lines + body)
