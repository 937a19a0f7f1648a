"""Every differential lowering test the CPU target passes, run through the Metal target
(emitted Metal source compiled as C++ against the shim and executed on CPU tensors).

The tests are those of ``tests/cpu/test_lowerings.py`` (one source of truth), loaded
with ``TARGET = "mps_shim"``; float64 cases are skipped (with the reason) in ``conftest.py`` and
covered by ``test_mps_fallback.py``.
"""
from metal_helpers import lowering_tests_module

_lowerings = lowering_tests_module()
for _name in dir(_lowerings):
    if _name.startswith("test_"):
        globals()[f"test_lowering_{_name[5:]}"] = getattr(_lowerings, _name)
del _name
