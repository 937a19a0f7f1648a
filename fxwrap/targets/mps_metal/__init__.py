"""The MPS target: Metal kernels (extern calls until the Metal emitter lands)."""
