"""User-written Triton kernels (``triton_kernel_wrapper_functional`` / ``_mutation`` nodes) -> lines.

Dynamo traces ``add_kernel[grid](x, y, out, n, BLOCK=64)`` (and ``wrap_triton`` inside a
``torch.library.triton_op``) into the higher-order op ``triton_kernel_wrapper_mutation``;
AOTAutograd's functionalization makes it ``triton_kernel_wrapper_functional``, whose
``tensors_to_clone`` are the tensors torch's mutation analysis says the kernel writes
(every tensor, when the analysis cannot run: it needs Triton's compiler for a GPU).  For
``relu(out)`` after the launch, with ``x`` and ``y`` graph inputs, the ATen graph reads::

    empty_like = aten.empty_like.default(arg0_1)
    wrapper = triton_kernel_wrapper_functional(kernel_idx=0, constant_args_idx=0, grid=[(2, 1, 1)],
        kwargs={'x_ptr': arg0_1, 'y_ptr': arg1_1, 'out_ptr': empty_like, 'n': 100},
        tensors_to_clone=['x_ptr', 'y_ptr', 'out_ptr'])
    relu = aten.relu.default(wrapper['out_ptr'])
    copy_ = aten.copy_.default(arg0_1, wrapper['x_ptr'])      # x "mutated": written back
    copy__1 = aten.copy_.default(arg1_1, wrapper['y_ptr'])

and becomes (cpu tensors, ``triton-interpret``)::

    buf0 = empty_strided((100,), (1,), dtype=torch.float32, device='cpu')
    # kernel add_kernel (triton-interpret): x_ptr:inout, y_ptr:inout, out_ptr:inout, n:size, ...
    add_kernel[(2, 1, 1)](x_ptr=arg0, y_ptr=arg1, out_ptr=buf0, n=100, BLOCK=64)  # user Triton kernel; ...
    fxwrap_pointwise_0(buf0, buf1)        # relu: an fxwrap kernel, fused as usual

Clones: a tensor to clone is written in place, with no copy, when nothing reads its
storage after the launch (Inductor's reinplacing does the same): a buffer the program
made that no later node reads, or a graph input whose only later use is copying the
kernel's result back into it (that ``copy_`` then copies a buffer into itself, which
the builders drop).  Otherwise the clone is a new buffer with the same strides (the
kernel indexes its pointer itself) and a copy into it, before the launch.

The kernel itself is the target's business (``KernelEmitter.user_kernel``): the Triton
targets launch it (``cuda``) or interpret it (``triton-interpret``); every other target
raises ``UnsupportedUserKernel`` naming the kernel, the target and what to do.
"""
from __future__ import annotations

import hashlib
import inspect
import operator

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from fxwrap.core.errors import UnsupportedUserKernel
from fxwrap.ir.symbolic import evaluate, is_non_overlapping_and_dense
from fxwrap.runtime.kernel import KernelArg
from fxwrap.runtime.launch import UserTritonLaunch
from fxwrap.runtime.user_kernels import importable_name, jit_function_of
from fxwrap.ir.lines import Buffer, DefineKernel
from fxwrap.ir.user_kernels import CallUserKernel
from fxwrap.wrapper_ir.nesting import NestedLowering

aten = torch.ops.aten


FUNCTIONAL, MUTATION = "triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation"


def is_user_kernel_launch(target) -> bool:
    """Whether an FX node's target is one of the two user-kernel higher-order ops (by name: the
    module defining them is imported only once a graph has one)."""
    return isinstance(target, torch._ops.HigherOrderOperator) and target.name() in (FUNCTIONAL, MUTATION)


def _side_table():
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
    return kernel_side_table


def jit_function(kernel):
    """The ``JITFunction`` inside a user kernel (itself, or under ``autotune`` / ``heuristics``)."""
    inner = jit_function_of(kernel)
    if inner is None:
        raise UnsupportedUserKernel(f"{kernel!r} is not a Triton JITFunction (nor an autotuned one)")
    return inner


def kernel_digest(kernel) -> str:
    """A digest of a user kernel: its JIT function's ``cache_key`` (source and the sources of
    the functions it calls) and, autotuned, its configs: what the program cache keys on."""
    jit = jit_function(kernel)
    parts = [jit.fn.__module__, jit.fn.__qualname__, str(jit.cache_key)]
    parts += [repr(_config_record(c)) for c in getattr(kernel, "configs", None) or ()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def user_kernel_key(gm: torch.fx.GraphModule) -> list:
    """What the program cache adds to its key for the user kernels ``gm`` launches: their side
    table indices are per process, so the key names each kernel by digest, with its constants."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_user_kernel_launch(node.target):
            table = _side_table()
            found.append((node.name, kernel_digest(table.get_kernel(node.kwargs["kernel_idx"])),
                          sorted((k, repr(v)) for k, v in
                                 table.get_constant_args(node.kwargs["constant_args_idx"]).items())))
    return found


def _config_record(config) -> dict:
    """A ``triton.Config`` as plain data (what a saved program rebuilds it from)."""
    record = {"kwargs": dict(sorted(config.kwargs.items()))}
    for attr in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        value = getattr(config, attr, None)
        if value is not None:
            record[attr] = value
    return record


def build(builder: NestedLowering, node: torch.fx.Node) -> None:
    """Emit the lines of user-kernel launch ``node`` into ``builder`` (see the module doc)."""
    kw = node.kwargs
    table = _side_table()
    kernel = table.get_kernel(kw["kernel_idx"])
    constants = dict(table.get_constant_args(kw["constant_args_idx"]))
    jit = jit_function(kernel)
    name = jit.fn.__name__
    where = builder.origin_of(node).location or "?"
    if kw.get("tma_descriptor_metadata"):
        raise UnsupportedUserKernel(
            f"user Triton kernel {name} ({where}) takes TMA descriptors, which fxwrap does not pass "
            f"yet (target {builder.target_name}); create the descriptor inside the kernel "
            "(tl.make_tensor_descriptor) or launch it outside the compiled function")
    emitter = builder.user_kernel_emitter()
    if emitter is None:
        raise UnsupportedUserKernel(
            f"user Triton kernel {name} ({where}) cannot run on target {builder.target_name!r} without "
            "generated kernels (options kernels=False); compile it with kernels on, for target 'cuda' or "
            "'triton-interpret'")
    functional = node.target.name() == FUNCTIONAL
    given = dict(kw["kwargs"])
    if functional:
        written = [n for n in given if n in set(kw["tensors_to_clone"])]
    else:
        written = _mutated_by(kw, given)
    if written:
        builder.write_barrier(node)  # later readers of values made before see them unwritten
    tensors, scalars = {}, {}
    for arg_name, arg in given.items():
        value = builder.value(arg)
        if isinstance(value, Buffer):
            if functional and arg_name in written and not _writable_in_place(builder, node, arg_name, arg):
                value = _clone(builder, value, arg)
            tensors[arg_name] = value
        elif isinstance(value, (tuple, list, dict)) or isinstance(arg, torch.fx.Node) and value is None:
            raise UnsupportedUserKernel(
                f"user Triton kernel {name} ({where}): argument {arg_name} is a {type(value).__name__}; "
                f"fxwrap passes tensors, ints and floats (target {builder.target_name})")
        else:
            scalars[arg_name] = value
    grids = tuple(tuple(builder.value(v) for v in g) for g in kw["grid"])
    order = [n for n in jit.arg_names if n in tensors or n in scalars]
    order += [n for n in (*tensors, *scalars) if n not in order]
    signature = [KernelArg(n, ("inout" if n in written else "input") if n in tensors else "size") for n in order]
    signature += [KernelArg(f"grid{i}_{d}", "size") for i in range(len(grids)) for d in range(3)]
    configs = getattr(kernel, "configs", None)
    module, qualname = importable_name(kernel)  # add_kernel = JITFunction(_add): add_kernel
    launch = UserTritonLaunch(
        language="triton", symbol=name,
        module=module, qualname=qualname, digest=kernel_digest(kernel),
        jit_key=str(jit.cache_key),
        params=tuple(order), grids=len(grids),
        constants=tuple(sorted(constants.items(), key=lambda kv: _position(jit, kv[0]))),
        configs=tuple(_config_record(c) for c in configs) if configs is not None else None,
        reset_to_zero=tuple(getattr(kernel, "reset_to_zero", None) or ()),
        restore_value=tuple(getattr(kernel, "restore_value", None) or ()),
    )
    compiled = emitter.user_kernel(name, _source(jit, where), tuple(signature), launch, kernel)
    args = tuple(tensors[n] if n in tensors else scalars[n] for n in order)
    builder.emit(DefineKernel(compiled))
    builder.emit(CallUserKernel(compiled, args, grids))
    builder.define(node, {n: tensors[n] for n in written} if functional else None)


def _position(jit, name: str) -> tuple:
    names = list(jit.arg_names)
    return (names.index(name), name) if name in names else (len(names), name)


def _source(jit, where: str) -> str:
    """The kernel's Python source under a header naming it (``Kernel.source``)."""
    try:
        text = inspect.getsource(jit.fn)
    except (OSError, TypeError):
        text = getattr(jit, "src", "") or ""
    header = f"# user Triton kernel {jit.fn.__module__}.{jit.fn.__qualname__} (launched at {where})\n"
    return header + text


def _mutated_by(kw, given: dict) -> list[str]:
    """The tensors a ``triton_kernel_wrapper_mutation`` launch writes: torch's analysis of the
    kernel where it runs (it compiles the kernel to Triton IR: a GPU), else every tensor."""
    tensors = [n for n, v in given.items() if isinstance(v, torch.fx.Node)
               and isinstance(v.meta.get("val"), torch.Tensor)]
    try:
        from torch._higher_order_ops.triton_kernel_wrap import get_mutated_tensors
        fakes = {n: (v.meta["val"] if isinstance(v, torch.fx.Node) else v) for n, v in given.items()}
        found = set(get_mutated_tensors(kw["kernel_idx"], kw["constant_args_idx"], fakes,
                                        kw.get("tma_descriptor_metadata", {})))
        return [n for n in tensors if n in found]
    except Exception:  # noqa: BLE001 - no analysis here: assume the kernel writes every tensor
        return tensors


def _storage(node) -> StorageWeakRef | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def _shares(node, storage: StorageWeakRef) -> bool:
    found = _storage(node)
    return found is not None and found == storage


def _writable_in_place(builder, node, arg_name: str, arg) -> bool:
    """Whether the launch may write ``arg`` itself instead of a clone: nothing reads its
    storage after the launch (see the module doc), and no other argument shares it."""
    if not isinstance(arg, torch.fx.Node) or arg.op == "get_attr":
        return False
    storage = _storage(arg)
    if storage is None:
        return False
    others = [v for n, v in node.kwargs["kwargs"].items() if n != arg_name]
    if any(_shares(v, storage) for v in others):
        return False
    value = builder.value_of(arg)
    if arg.op != "placeholder":
        if not builder.owns_storage(builder.value(arg)):
            return False  # a view of other storage, or a constant
    elif not isinstance(value, Buffer) or not builder.owns_storage(value):
        return False
    position = builder.position(node)
    for later in node.graph.nodes:
        if builder.position(later) <= position:
            continue
        if arg.op == "placeholder" and _copies_result_back(later, node, arg_name, arg):
            continue
        if any(_shares(used, storage) for used in later.all_input_nodes if used is not node):
            return False
    return True


def _copies_result_back(later, node, arg_name: str, arg) -> bool:
    """``copy_(arg, node[arg_name])``: the input-mutation epilogue writing the result back."""
    if later.target is not aten.copy_.default or later.args[0] is not arg:
        return False
    src = later.args[1]
    return (isinstance(src, torch.fx.Node) and src.target is operator.getitem
            and src.args[0] is node and src.args[1] == arg_name and len(later.users) == 0)


def _clone(builder, value: Buffer, arg) -> Buffer:
    """A new buffer with ``value``'s strides (the kernel indexes its pointer itself) holding a
    copy of it, for a launch that writes a tensor still read afterwards."""
    hints = builder.hints
    size = [evaluate(n, hints) for n in value.size]
    stride = [evaluate(s, hints) for s in value.stride]
    if not is_non_overlapping_and_dense(size, stride):
        raise UnsupportedUserKernel(
            f"a user Triton kernel writes {arg}, a tensor with gaps or overlaps (size {tuple(value.size)}, "
            f"stride {tuple(value.stride)}) that the program reads again afterwards: fxwrap cannot copy it "
            f"with its strides (target {builder.target_name}); pass a .contiguous() copy to the kernel")
    dst = builder.fresh_buffer_like(value)
    builder.copy_into(dst, value, arg)
    return dst
