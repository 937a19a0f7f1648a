"""The CPU target: C++/OpenMP kernels (extern calls until the C++ emitter lands)."""
