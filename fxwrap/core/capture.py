"""From a dynamo FX graph to ATen graphs, through AOTAutograd.

``capture_backend(compile_graph, decompositions)`` is a dynamo backend; for

    @torch.compile(backend=...)
    def f(x): return torch.nn.functional.gelu(x) * 2

AOTAutograd traces the forward (and, when inputs need grad, the backward) into
ATen/prims graphs after applying ``decompositions`` and calls
``compile_graph(aten_gm, example_inputs, kind)`` with kind ``"inference"``,
``"forward"`` or ``"backward"``; a result with a ``boxed(args_list)`` method
(``runtime.boxed.ListCall``) is called that way, so the program can release each input
(a saved activation, in the backward) at its last use.  With ``dynamic=True`` the graphs take size
symbols (``s0``) as inputs beside the tensors.

A training pair talks to AOTAutograd through the compile's ``TracingContext``:
``saved_activation_outputs(gm)`` reads which outputs of the forward graph being compiled
are the activations saved for the backward graph (``fw_metadata``), and
``report_output_strides(strides)`` tells AOTAutograd the strides the compiled forward
really returns, which it gives the backward graph's example inputs (re-strided) when it
compiles the backward (at once, or lazily at the first backward call).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from functorch.compile import make_boxed_func
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
from torch._guards import TracingContext

from fxwrap.core import logs
from fxwrap.core.foreach import foreach_decompositions

aten = torch.ops.aten

# Decompositions fxwrap does not take from the core table: they are slower or
# less exact than the op, which the extern path calls directly, or wrong.
_KEEP_AS_OPS = {
    aten.addmm.default, aten._addmm_activation.default,
    # Wrong gradients: AOTAutograd differentiates the op with its own derivative
    # formula (_scaled_dot_product_flash_attention_for_cpu_backward), which reads the
    # saved logsumexp; the decomposition's logsumexp is not the kernel's, so
    # F.scaled_dot_product_attention's q/k/v grads come out wrong (max error ~20 on
    # randn inputs, tests/models/test_transformer.py).  The forward matches.
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def default_decompositions() -> dict:
    """PyTorch's core-ATen decomposition table, less the ops fxwrap keeps whole (a
    fresh dict; the table is built once per process: building it walks every
    registered op, about 0.1 s)."""
    return dict(_default_decompositions())


def kernel_decompositions() -> dict:
    """What targets that generate kernels also decompose: composite ops whose parts
    (reductions and pointwise math) fuse into fewer kernels than the op's own."""
    table = dict(_kernel_decompositions())
    # dynamo traces ``t.addcmul_(a, b, value=v)`` and ``addcdiv_`` as Inductor's prim
    # ``fma(a * b, v, t)``; registered once dynamo has imported it (before any backend runs)
    fma = getattr(getattr(torch.ops.prims, "fma", None), "default", None)
    if fma is not None:
        table[fma] = _multiply_add
    return table


def _multiply_add(a, b, c):
    """``prims.fma(a, b, c)`` as its eager implementation, ``a * b + c``: pointwise math a
    kernel fuses (an extern call would launch it alone, the optimizer's update split in three)."""
    return a * b + c


@functools.lru_cache(maxsize=1)
def _default_decompositions() -> dict:
    table = dict(core_aten_decompositions())
    for op in _KEEP_AS_OPS:
        table.pop(op, None)
    return table


@functools.lru_cache(maxsize=1)
def _kernel_decompositions() -> dict:
    from torch._decomp import get_decompositions
    table = get_decompositions([
        aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.silu,
        # batch norm: inference a pointwise epilogue (the first decomposes into the
        # second); training a Welford reduction over (N, H, W) plus pointwise math
        aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit,
        aten._native_batch_norm_legit_functional,
        # (torch's meta function gives these float32 running stats for bf16/fp16 ones,
        # where the kernels return the input's dtype: as externs their results would be
        # read as the wrong type)
        aten._batch_norm_with_update, aten._batch_norm_with_update_functional, aten._batch_norm_no_update,
        aten._softmax_backward_data, aten._log_softmax_backward_data,
        aten.native_layer_norm_backward, aten.gelu_backward, aten.silu_backward,
        aten.sigmoid_backward, aten.tanh_backward, aten.threshold_backward,
    ])
    table[aten.native_layer_norm.default] = functools.partial(
        _layer_norm_with_eager_zeros, table[aten.native_layer_norm.default])
    table.update(foreach_decompositions())  # the optimizers' foreach paths: pointwise kernels, not externs
    return table


def _layer_norm_with_eager_zeros(decomposition, x, normalized_shape, weight, bias, eps):
    """torch's ``native_layer_norm`` decomposition, whose exact zeros carry eager's sign.

    Eager's kernels compute ``x * scale + shift``, so an element equal to its row's mean
    (a constant row, a normalized size of 1) is ``+0.0``; the decomposition's
    ``(x - mean) * rstd * weight`` makes it ``-0.0`` where the weight is negative, and a
    sign-sensitive op after it (``atan2``, ``1 / x``, ``copysign``) then differs from eager
    by 2*pi or an infinity's sign (fuzz seed 940753).  Adding ``+0.0`` turns ``-0.0`` into
    ``+0.0`` and changes no other value."""
    out, mean, rstd = decomposition(x, normalized_shape, weight, bias, eps)
    if weight is not None and bias is None:
        out = out + 0.0
    return out, mean, rstd


def aten_graph_text(gm: torch.fx.GraphModule) -> str:
    """An ATen graph as readable Python, each group of nodes under the user's source line
    it came from (``# File: model.py:12 in forward, code: ...``): ``print_readable``."""
    return gm.print_readable(print_output=False)


def capture_backend(compile_graph: Callable, decompositions: dict, partition: str = "min_cut") -> Callable:
    """A dynamo backend that hands every ATen graph AOTAutograd makes to ``compile_graph``.

    ``partition``: how a training graph is split (``CompileOptions.partition``).
    ``"min_cut"`` (AOTAutograd's min-cut rematerialization, Inductor's choice) saves for
    the backward the fewest bytes it can and recomputes cheap pointwise values there;
    ``"save_all"`` saves every value the backward reads.
    """

    def compiler(kind: str):
        def compile_boxed(gm: torch.fx.GraphModule, example_inputs):
            if logs.enabled("capture"):
                logs.logger("capture").debug("%s ATen graph:\n%s", kind, aten_graph_text(gm))
            compiled = compile_graph(gm, example_inputs, kind)
            boxed = getattr(compiled, "boxed", None)
            if boxed is None:
                return make_boxed_func(compiled)

            def call(args: list):  # the list is emptied by the program (runtime/boxed.py)
                return boxed(args)
            call._boxed_call = True
            return call
        return compile_boxed

    return aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions,
        keep_inference_input_mutations=True,
        partition_fn=_PARTITIONS[partition],
    )


def saved_activation_outputs(gm: torch.fx.GraphModule) -> range | None:
    """The positions of forward graph ``gm``'s outputs that AOTAutograd saves for the
    backward graph (tensors; after them come saved size symbols); None outside an
    AOTAutograd training compile, or when the metadata does not fit the graph.  Private
    API: ``TracingContext.fw_metadata.tensors_saved_for_backwards_slice`` (torch 2.11+)."""
    context = TracingContext.try_get()
    try:
        saved = context.fw_metadata.tensors_saved_for_backwards_slice
    except (AttributeError, AssertionError, TypeError):  # no context or metadata, counts unset
        return None
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    count = len(values) if isinstance(values, (tuple, list)) else 1
    if not isinstance(saved, slice) or saved.step not in (None, 1) or saved.start is None \
            or not 0 <= saved.start <= count:
        return None
    return range(*saved.indices(count))  # stop: None or -(saved size symbols)


def static_input_indices(gm: torch.fx.GraphModule, kind: str) -> tuple[int, ...]:
    """The positions of ``gm``'s inputs whose memory stays put from call to call, which graph
    capture uses in place (``fxwrap.runtime.graph_replay``).  An inference or forward graph:
    what AOTAutograd says (parameters and buffers: ``fw_metadata.static_input_indices``, the
    list Inductor's ``compile_fx`` reads; private API, torch 2.4+); none outside a compile.  A
    backward graph: every input but the tangents (saved activations live in the forward's
    recording, parameters where they are), as Inductor's ``compile_fx`` does.  A static input
    whose storage moves anyway makes a new recording, never a stale read."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [i for i, p in enumerate(placeholders) if isinstance(p.meta.get("val"), torch.Tensor)]
    if kind == "backward":
        return tuple(i for i in tensors if not placeholders[i].name.startswith("tangents"))
    context = TracingContext.try_get()
    indices = getattr(getattr(context, "fw_metadata", None), "static_input_indices", None) or ()
    return tuple(i for i in tensors if i in set(indices))


def report_output_strides(strides: list[tuple[int, ...] | None]) -> None:
    """Tell AOTAutograd the strides each output of the forward graph being compiled
    really has (None: a non-tensor or a symbolic layout); it re-strides the backward
    graph's example inputs of saved activations to match.  Nothing outside a compile
    that asks for them.  Private API: ``TracingContext.output_strides`` (torch 2.11+)."""
    context = TracingContext.try_get()
    if context is not None and getattr(context, "output_strides", None) is not None:
        context.output_strides.clear()
        context.output_strides.extend(strides)


def _min_cut(joint_module, joint_inputs, **kwargs):
    # compiler="inductor": pointwise ops fuse into their consumers, so recomputing them is
    # cheap; fxwrap's scheduler fuses as Inductor's does
    return min_cut_rematerialization_partition(joint_module, joint_inputs, compiler="inductor", **kwargs)


_PARTITIONS = {"min_cut": _min_cut, "save_all": default_partition}
