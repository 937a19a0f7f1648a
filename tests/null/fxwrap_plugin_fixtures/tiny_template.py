"""A target ``tiny`` (the reference emitter, evaluating kernels with torch) with a tiny GEMM
template ``torch_gemm``: the product by ``torch.matmul``, the epilogue by the reference
launcher, reading the product where the loop IR says ``template_out``."""
import dataclasses

import sympy
import torch

import fxwrap
from fxwrap.ir.loops import Op, OpCode, Store, rewrite
from fxwrap.ir.symbolic import contiguous_strides
from fxwrap.targets.base import KernelSource, WrapperCodegen
from fxwrap.targets.host.device import CpuDevice
from fxwrap.targets.reference.emitter import ReferenceEmitter, ReferenceLauncher
from fxwrap.ir.lines import Buffer

aten = torch.ops.aten
rendered = []  # kernel names the template rendered


class TorchGemm(fxwrap.Template):
    name = "torch_gemm"
    ops = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten._weight_int8pack_mm.default})

    def refusal(self, call):
        if call.op == aten._weight_int8pack_mm.default:
            return None
        return None if call.dtype == torch.float32 else f"{call.dtype} (float32 only)"

    def render(self, kernel, emitter):
        call = kernel.template
        size = call.output.size
        acc = Buffer("tiny_acc", tuple(size), contiguous_strides(size), call.acc_dtype, call.output.device)
        index = sympy.expand(sum((x * s for x, s in zip(call.index, acc.stride)), sympy.Integer(0)))
        read = {OpCode.TEMPLATE_OUT: lambda n: Op.load("tiny_acc", index, n.dtype)}
        stores = tuple(Store(st.buffer, st.index, rewrite(st.value, read)) for st in kernel.stores)
        inner = dataclasses.replace(kernel, inputs=(*kernel.inputs, acc), stores=stores, template=None)
        rendered.append(kernel.name)
        return KernelSource(kernel.name, f"# torch_gemm {call.describe()}", emitter.language,
                            launch={"kernel": inner, "extra": {"gemm_inputs": len(kernel.inputs),
                                                               "int8": call.op == aten._weight_int8pack_mm.default}})


class GemmLauncher:
    def __init__(self, launch):
        self.epilogue = ReferenceLauncher(launch.kernel)
        self.n_inputs = launch.extra["gemm_inputs"]
        self.int8 = launch.extra["int8"]

    def __call__(self, *args):
        b = args[1].float().t() if self.int8 else args[1].float()  # int8 w is (N, K)
        product = torch.matmul(args[0].float(), b).contiguous()
        return self.epilogue(*args[:self.n_inputs], product, *args[self.n_inputs:])


class TinyEmitter(ReferenceEmitter):
    def load(self, source):
        return GemmLauncher(source.launch) if "gemm_inputs" in source.launch.extra else super().load(source)


@fxwrap.hookimpl
def fxwrap_targets():
    return [fxwrap.Target("tiny", "cpu", CpuDevice(), TinyEmitter, WrapperCodegen, priority=-20)]


@fxwrap.hookimpl
def fxwrap_templates(target):
    return [TorchGemm()] if target.name == "tiny" else []
