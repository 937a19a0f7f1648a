"""The MPS target: Metal kernels.

``emitter.MetalEmitter`` renders a ``ScheduledKernel`` to Metal source (``prelude``
holds the helpers, ``reduction`` the threadgroup-per-row reductions); ``launcher``
runs it through ``torch.mps.compile_shader``; ``shim_runner`` compiles the same
source as C++ against ``shim/fxwrap_metal_shim.h`` and runs it on CPU tensors.
"""
