"""Lowering rules, registered into ``fxwrap.core.lowering.REGISTRY`` on import."""
from fxwrap.core.rules import indexed_writes, indexing, pointwise, pooling, reductions, scans, views  # noqa: F401
