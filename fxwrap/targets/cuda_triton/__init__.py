"""The CUDA target: Triton kernels (``emitter.TritonEmitter``), the CUDA device interface,
autotuning, the CUDA-driver launcher and the Triton GEMM template; ``triton-interpret`` runs
the same kernels on CPU tensors through Triton's interpreter (docs/cuda-target.md)."""
