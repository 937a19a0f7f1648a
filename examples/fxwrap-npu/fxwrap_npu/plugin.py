"""The entry point ``npu = "fxwrap_npu.plugin"`` (group ``fxwrap``) names this module."""
import fxwrap

from fxwrap_npu.target import NpuDevice, NpuEmitter


@fxwrap.hookimpl
def fxwrap_targets():
    return [fxwrap.Target("npu", "npu", NpuDevice(), NpuEmitter, fxwrap.WrapperCodegen)]
