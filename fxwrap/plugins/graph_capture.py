"""Graph capture's partition pass: a built-in plugin on the public ``fxwrap_pipeline``
hook, the way a vendor would write one.

When the options ask for graph capture (``mode="reduce-overhead"``, ``"max-autotune"`` or
fxwrap's ``"cudagraphs"``) and the target's device declares it
(``DeviceInterface.graph_capture()`` is not None), every program's lines get their
``PartitionBoundary`` lines (``fxwrap.wrapper_ir.partitions``), last, after every other
plugin's passes and the debug modes'.  ``api.finish_program`` then gives the program
``fxwrap.runtime.graph_replay.capture_runner``.
"""
from __future__ import annotations

from fxwrap.core.passes import LinesPass
from fxwrap.plugins.hookspecs import hookimpl
from fxwrap.wrapper_ir.partitions import partition_for_capture

PLUGIN_NAME = "fxwrap-graph-capture"


@hookimpl
def fxwrap_pipeline(pipeline, target, options):
    """The partition pass, last, when ``options`` ask for graphs and ``target``'s device records them."""
    if getattr(options, "cuda_graphs", False) and target.device.graph_capture() is not None:
        pipeline.wrapper.append(LinesPass.of(partition_for_capture(target.device_type, target.name),
                                             "graph capture partitions"))
