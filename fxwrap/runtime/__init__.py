"""What an emitted GraphModule calls at run time."""
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.memory import free

__all__ = ["Kernel", "KernelArg", "free"]
