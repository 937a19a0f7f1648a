"""The CPU target: C++/OpenMP kernels.

``emitter.CppEmitter`` renders a ``ScheduledKernel`` to an ``extern "C"`` function and
loads it with the host toolchain (``fxwrap.targets.host``: ``compiler``/``cache`` build
it with ``$CXX`` into ``$FXWRAP_CACHE_DIR``, ``loader`` binds a ctypes launcher);
``prelude`` holds the C++ helpers every kernel includes.
"""
