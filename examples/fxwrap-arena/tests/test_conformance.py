"""fxwrap's conformance kit on the arena target: how a plugin package checks its target.

``python -m pytest -ra examples/fxwrap-arena/tests/test_conformance.py`` runs every
check of ``fxwrap.testing.ConformanceSuite`` (op by op against eager with a "ran in a
kernel" check, an OpInfo subset, three models for inference and training, memory
plans, deterministic code) with ``target = "arena"``.  The arena declares nothing
unsupported: its kernels are the C++ emitter's.
"""
from fxwrap.testing import ConformanceSuite


class TestArenaConformance(ConformanceSuite):
    target = "arena"
