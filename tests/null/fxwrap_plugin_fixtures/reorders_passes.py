"""Edits target ``cpu``'s pass lists (``fxwrap_pipeline``): adds an ATen-graph pass that
turns ``sin`` into ``cos`` (a rewrite no built-in pass makes, so the numbers show it ran)
and one that records its turn, reorders both and a built-in pass, and puts a Wrapper-IR
pass on each side of the memory plan, each counting the ``Free`` lines it sees."""
import torch

from fxwrap import hookimpl
from fxwrap.core.passes import GraphPass, LinesPass
from fxwrap.ir.lines import Free

aten = torch.ops.aten
ran = []     # the added ATen passes, in the order they ran
frees = {}   # Wrapper-IR pass name -> Free lines it saw


def sin_to_cos(graph):
    ran.append("sin to cos")
    for node in graph.gm.graph.nodes:
        if node.target is aten.sin.default:
            node.target = aten.cos.default
    graph.gm.recompile()


def after_the_rewrite(graph):
    ran.append("after the rewrite")


def counting(name):
    def run(lines, program):
        frees[name] = sum(isinstance(line, Free) for line in lines)
        return lines
    return LinesPass(name, run)


@hookimpl
def fxwrap_pipeline(pipeline, target):
    if target.name != "cpu":
        return
    pipeline.aten.append(GraphPass("after the rewrite", after_the_rewrite))
    pipeline.aten.insert_before("after the rewrite", GraphPass("sin to cos", sin_to_cos))
    pipeline.aten.move_after("after the rewrite", "sin to cos")       # no-op order check: stays after
    pipeline.aten.move_before("patterns", "follow input layouts")     # a built-in pass moved first
    pipeline.wrapper.insert_before("memory plan", counting("before the plan"))
    pipeline.wrapper.append(counting("after the plan"))
