"""Programs that take their inputs in a list and let go of each at its last use.

AOTAutograd calls a compiled backward with the saved activations in one list that it
gives away ("boxed": ``compiled_bw(args)``, ``_boxed_call = True``); the callee is meant
to empty it.  A GraphModule called as ``gm(*args)`` cannot: the caller's argument tuple
keeps every input alive until the call returns, so every activation saved for the
backward stays allocated for the whole backward, on top of the gradients it makes.
``boxed_graph_module(gm)`` is a copy of ``gm`` whose code takes the list, unpacks it and
clears it; FX's code already drops each local at its last use, so an input is freed
where the program stops reading it::

    def forward(self, inputs):
        arg0, arg1, arg2 = inputs;  inputs.clear()
        ...
        fxwrap_kernel_3(arg0, buf4);  arg0 = None      # arg0 is released here
"""
from __future__ import annotations

import torch


class ListInputsCodeGen(torch.fx.graph.CodeGen):
    """FX code generation for ``forward(self, inputs)``: the placeholders are unpacked
    from the list ``inputs``, which is then cleared."""

    def gen_fn_def(self, free_vars, maybe_return_annotation, *args, **kwargs) -> str:
        names = [v.split(":")[0].split("=")[0].strip() for v in free_vars]
        names = [n for n in names if n != "self"]
        head = f"def {self._func_name}(self, inputs){maybe_return_annotation}:"
        if not names:
            return head + "\n    inputs.clear()"
        return head + f"\n    {', '.join(names)}, = inputs;  inputs.clear()"


class ListCall:
    """``gm``'s copy with ``ListInputsCodeGen``: ``call(*args)`` like ``gm``, and
    ``call.boxed(args_list)``, which empties ``args_list`` (the boxed convention)."""

    def __init__(self, gm: torch.fx.GraphModule):
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(gm.graph, {}))
        graph.set_codegen(ListInputsCodeGen())
        self.graph_module = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)

    def __call__(self, *args):
        return self.graph_module(list(args))

    def boxed(self, args: list):
        return self.graph_module(args)
