"""fxwrap-c99: an out-of-tree fxwrap target whose kernels are plain C99, ``options={"target": "c99"}``."""
