"""The CUDA target: Triton kernels (extern calls until the Triton emitter lands)."""
