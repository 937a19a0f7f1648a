"""Graph capture on CUDA: one ``torch.cuda.CUDAGraph`` per recording.

``CudaGraphCapture`` is the CUDA device's ``GraphCapture`` (``fxwrap.runtime.graph_replay``
holds the runner and its rules)::

    record(run, inputs)   capture run(*inputs) into a CUDAGraph with a pool of its own
                          (recordings never share output memory), then replay it once
    replay(graph)         graph.replay()

A CPU synchronization inside the run (a value read back) makes capture fail with a
``RuntimeError``; the runner then runs the program plainly (the partition pass keeps such
lines out of captured partitions in the first place).
"""
from __future__ import annotations

import torch

from fxwrap.runtime.graph_replay import GraphCapture


class CudaGraphCapture(GraphCapture):
    """``CudaDevice().graph_capture()``: recordings are ``torch.cuda.CUDAGraph``s."""

    device_type = "cuda"

    def record(self, run, inputs):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            outputs = run(*inputs)
        graph.replay()  # capture ran nothing: this is the run
        return graph, outputs

    def replay(self, recording) -> None:
        recording.replay()

    def synchronize(self) -> None:
        torch.cuda.synchronize()
