"""The CPU target's GEMM template: ``mm`` / ``addmm`` / ``bmm`` (and ``linear``, which is
``addmm`` over a transposed weight view) in float32 and bfloat16, with the scheduler's
epilogue applied to each register tile before it is stored.

The kernel (``CppGemm.render``), for ``C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]``:

* **cache blocking**: the ``n`` range is cut into ``NC``-wide column blocks and ``k``
  into ``KC``-deep slices; for each (block, slice) the ``B`` panel is *packed* into a
  contiguous buffer on the task's stack (``NR`` columns side by side per ``k``; for
  bfloat16 two ``k`` interleaved per column, the layout ``_mm512_dpbf16_ps`` reads),
  whatever ``B``'s strides (a transposed weight is packed like a row-major one);
* **micro-kernel**: an ``MR x NR`` register tile (float32 accumulators, ``NR / 16`` AVX-512
  vectors per row through GCC vector extensions; the AVX-512-BF16 dot product for
  bfloat16 where the compiler targets it, ``-march=native``), ``A`` read in place (one
  broadcast per row and ``k``) through its strides;
* **OpenMP** over (batch, column block, row tile) tasks, one task per thread chunk, a
  static schedule: results never depend on the thread count (each output element is
  one ordered sum over ``k``);
* **epilogue**: once a tile's sum over ``k`` is complete, the fused stores run over it
  (``CStyleEmitter.template_epilogue``: bias, activation, residual add, casts to
  bfloat16), reading ``template_out`` from the tile, then the tile is gone.

The bfloat16 path converts nothing before the product: ``A`` and ``B`` are bfloat16,
products and sums float32 (as oneDNN's), the epilogue rounds once where the graph does.
"""
from __future__ import annotations

import torch

from fxwrap.core.errors import EmitError
from fxwrap.core.templates import Template, TemplateCall
from fxwrap.targets.base import KernelSource
from fxwrap.targets.cstyle import LocalNames, Scope, append_block

aten = torch.ops.aten


def _cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


class CppGemm(Template):
    """``mm``/``addmm``/``bmm`` on float32 or bfloat16 CPU tensors, any strides.

    ``CppGemm().render(kernel, emitter)`` -> a ``KernelSource`` of one ``extern "C"``
    function with the kernel's usual signature (the call's operands first)::

        extern "C" void fxwrap_template_0(const float* __restrict__ in_ptr0,   // A
                                          const float* __restrict__ in_ptr1,   // B
                                          const float* __restrict__ in_ptr2,   // bias
                                          float* __restrict__ out_ptr0)
        ...  pack B panel; for each MR x NR tile: acc = sum_k A*B; epilogue(acc) -> out_ptr0
    """

    name = "cpp_gemm"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default})
    MR = 8     # rows of a register tile
    NR = 32    # columns of a register tile (two 16-lane vectors)
    KC = 256   # depth of a packed B panel
    NC = 256   # columns of a packed B panel (KC * NC * 4 bytes on a task's stack: 256 KiB)

    def refusal(self, call: TemplateCall) -> str | None:
        if call.dtype not in (torch.float32, torch.bfloat16):
            return f"{call.dtype} operands (cpp_gemm computes float32 and bfloat16)"
        if call.output.device.type != "cpu":
            return f"operands on {call.output.device}"
        if any(h == 0 for _, h in call.hints):
            return "an empty product"
        return None

    # ------------------------------------------------------------------ render
    def render(self, kernel, emitter) -> KernelSource:
        call = kernel.template
        if call is None:
            raise EmitError(f"kernel {kernel.name} has no template call (template {self.name})")
        names = LocalNames()
        fn = Scope(emitter, names, None, kernel=kernel)
        a, b = call.operands
        it = emitter.index_type
        bf16 = call.dtype == torch.bfloat16
        idx = emitter.render_index
        batched = len(call.index) == 3
        a_stride = [idx(s) for s in a.stride]
        b_stride = [idx(s) for s in b.stride]
        if not batched:
            a_stride = ["0", *a_stride]
            b_stride = ["0", *b_stride]
        sizes = {k: idx(v) for k, v in call.sizes}
        vars_ = [v.name for v in call.index]
        mvar, nvar = vars_[-2], vars_[-1]
        bvar = vars_[0] if batched else None

        tile = Scope(emitter, names, fn, declares=[bvar] if bvar else [], kernel=kernel)
        epilogue = emitter.template_epilogue(kernel, tile, "acc[i][j]")

        MR, NR, NC = self.MR, self.NR, self.NC
        load_a = "fx_bf16_to_float(A[i * sam + kk * sak])" if bf16 else "A[i * sam + kk * sak]"
        body = [
            f"const {it} M = {sizes['m']};", f"const {it} N = {sizes['n']};", f"const {it} K = {sizes['k']};",
            f"const {it} NB = {sizes['batch']};",
            f"const {it} sab = {a_stride[0]}, sam = {a_stride[1]}, sak = {a_stride[2]};",
            f"const {it} sbb = {b_stride[0]}, sbk = {b_stride[1]}, sbn = {b_stride[2]};",
            f"const {it} mtiles = (M + {MR - 1}) / {MR};",
            f"const {it} nblocks = (N + {NC - 1}) / {NC};",
        ]
        task = [f"const {it} bi = task / (nblocks * mtiles);",
                f"const {it} rest = task % (nblocks * mtiles);",
                f"const {it} nb = rest / mtiles;",
                f"const {it} m0 = (rest % mtiles) * {MR};",
                f"const {it} n_start = nb * {NC};",
                f"const {it} n_end = fx_imin(n_start + {NC}, N);",
                f"const {it} mc = fx_imin({MR}, M - m0);"]
        if bvar:
            task.append(f"const {it} {bvar} = bi;")
        tile.flush_into(task)
        stype = "fx_bf16" if bf16 else "float"
        task += [f"const {stype}* const A0 = in_ptr0 + bi * sab + m0 * sam;",
                 f"const {stype}* const B0 = in_ptr1 + bi * sbb;"]
        inner = [f"float acc[{MR}][{NR}];",
                 f"for (int i = 0; i < {MR}; ++i) for (int j = 0; j < {NR}; ++j) acc[i][j] = 0.0f;",
                 f"const {it} nc = fx_imin({NR}, n_end - n0);"]
        kloop = [f"const {stype}* const A = A0;",
                 "for (int i = 0; i < mc; ++i) {",
                 f"  const float a = {load_a};",
                 f"  const {stype}* const Bk = B0 + kk * sbk + n0 * sbn;",
                 "  #pragma omp simd",
                 f"  for ({it} j = 0; j < nc; ++j) acc[i][j] += a * "
                 + ("fx_bf16_to_float(Bk[j * sbn]);" if bf16 else "Bk[j * sbn];"),
                 "}"]
        append_block(inner, f"for ({it} kk = 0; kk < K; ++kk)", kloop)
        ep = [f"const {it} {mvar} = m0 + i;", f"const {it} {nvar} = n0 + j;", *epilogue]
        ep_loop: list[str] = []
        append_block(ep_loop, f"for ({it} j = 0; j < nc; ++j)", ep)
        ep_outer: list[str] = []
        append_block(ep_outer, f"for ({it} i = 0; i < mc; ++i)", ep_loop)
        inner += ep_outer
        append_block(task, f"for ({it} n0 = n_start; n0 < n_end; n0 += {NR})", inner)
        body.append(f"const {it} tasks = NB * nblocks * mtiles;")
        body.append("#pragma omp parallel for schedule(static) if (tasks > 1 && M * N * K >= 262144)")
        append_block(body, f"for ({it} task = 0; task < tasks; ++task)", task)
        return _source(emitter, kernel, fn.lines + body)


def _source(emitter, kernel, body: list[str]) -> KernelSource:
    """The ``KernelSource`` of a template kernel: the emitter's header, prelude and
    signature around ``body`` (so the emitter's ``load`` builds it like its own)."""
    cname = emitter.function_name(kernel)
    text = "\n".join([
        *emitter.header_comment(kernel),
        *emitter.headers,
        emitter.prelude.strip("\n"),
        "",
        emitter.function_head(kernel, cname),
        "{",
        *("  " + line if line else "" for line in body),
        "}",
        "",
    ])
    launch = {"symbol": cname, "language": emitter.language,
              "pointers": len(kernel.inputs) + len(kernel.outputs),
              "size_symbols": tuple(s.name for s in kernel.size_symbols)}
    launch.update(emitter.launch_metadata(kernel))
    return KernelSource(kernel.name, text, emitter.language, emitter.signature(kernel), launch)
