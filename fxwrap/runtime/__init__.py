"""What an emitted GraphModule calls at run time."""
from fxwrap.runtime.guards import InputGuard, InputMismatchError, check_inputs
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.memory import free
from fxwrap.runtime import weight_layouts  # noqa: F401  (registers torch.ops.fxwrap.cached_layout)

__all__ = ["InputGuard", "InputMismatchError", "Kernel", "KernelArg", "check_inputs", "free"]
