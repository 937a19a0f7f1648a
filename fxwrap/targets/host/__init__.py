"""What the targets that run on the host share: the CPU device interface (``device``),
the C++ compiler driver (``compiler``) with its atomic on-disk cache (``cache``), and the
ctypes loader of shared objects (``loader``).

The CPU target builds its kernels with them; the Metal shim builds its translation
unit with them; ``triton-interpret``, ``mps_shim`` and ``reference`` run on CPU tensors
through ``CpuDevice``.
"""
