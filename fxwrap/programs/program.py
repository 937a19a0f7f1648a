"""A compiled program: ``Program`` (one graph's Wrapper IR, GraphModule, memory plan and
runner) and ``TrainingPrograms`` (a forward and a backward one).

    >>> program = fxwrap.lower(lambda x: x.sin() + 1, torch.randn(8))
    >>> program.kind, program.peak_bytes, program.run(torch.randn(8)).shape
    ('inference', 32, torch.Size([8]))

``finish_program`` gives a program (compiled, or loaded from the program cache) its runner.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from fxwrap.programs.arguments import ArgumentMap, OutputMap
from fxwrap.programs.artifacts import dumps, loads, save
from fxwrap.core import logs
from fxwrap.core.memory import MemoryPlan
from fxwrap.ir.lines import Buffer, Line, Return, SizeInput
from fxwrap.runtime.graph_replay import capture_runner
from fxwrap.targets.base import Target
from fxwrap.wrapper_ir.fx import annotated_code, input_guard_of
from fxwrap.wrapper_ir.printer import program_source


@dataclass
class Program:
    """One compiled graph (an inference, forward or backward graph).

    ``lines`` is the Wrapper IR, ``graph_module`` its FX form, ``code()`` the
    printed program, ``peak_bytes`` the memory plan's peak (at ``hints``: the
    value of every size symbol when the graph was compiled), and calling the
    Program runs what the target's wrapper made of the graph.
    """

    kind: str
    target: Target
    inputs: list[Buffer | SizeInput]
    lines: list[Line]
    graph_module: torch.fx.GraphModule
    memory: MemoryPlan
    runner: Callable = field(repr=False)
    constants: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    hints: dict = field(default_factory=dict, repr=False)
    arguments: ArgumentMap | None = field(default=None, repr=False)
    outputs: OutputMap | None = field(default=None, repr=False)
    #: positions of the inputs graph capture uses in place (``core.capture.static_input_indices``)
    static_inputs: tuple[int, ...] = field(default=(), repr=False)
    #: the program cache's key of this program, where it was stored or loaded there
    cache_key: str | None = field(default=None, repr=False)

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def input_guard(self):
        """The ``fxwrap.runtime.guards.InputGuard`` the GraphModule checks its inputs with."""
        return input_guard_of(self.graph_module)

    def code(self) -> str:
        return program_source(self.inputs, self.lines)

    @property
    def output_strides(self) -> list[tuple[int, ...] | None]:
        """The strides of each output the program returns; None for a non-tensor output
        or one whose strides depend on size symbols."""
        returned = next((line for line in reversed(self.lines) if isinstance(line, Return)), None)
        strides = []
        for value in (returned.values if returned is not None else ()):
            stride = value.stride if isinstance(value, Buffer) else None
            static = stride is not None and all(getattr(s, "is_Integer", isinstance(s, int)) for s in stride)
            strides.append(tuple(int(s) for s in stride) if static else None)
        return strides

    def __call__(self, *graph_inputs):
        """Run with the graph's inputs, in ``inputs`` order (dynamo's, not the function's);
        a training forward returns its outputs followed by what it saves for the backward.
        Runs without autograd, as ``run`` does (the program writes into ``out=`` tensors,
        which autograd refuses where an input, a parameter say, requires grad)."""
        with torch.no_grad():
            return self.runner(*graph_inputs)

    def save(self, path: str | os.PathLike) -> None:
        """Write the program to ``path``: one file that ``fxwrap.load(path)`` runs without
        the compiler (``fxwrap.programs.artifacts``)."""
        save(self, path)

    def __reduce__(self):
        # pickle stores what save() writes; pickle.loads gives a LoadedProgram
        return (loads, (dumps(self),))

    def __copy__(self) -> "Program":
        return replace(self)

    def run(self, *args):
        """Run with the lowered function's own positional arguments (``lower`` programs):
        ``fxwrap.lower(f, x, w).run(x2, w2)``; parameters and sizes are filled in, and the
        result has the function's own structure (a tensor, a tuple, a dict ...).

        Raises ``TypeError`` for a missing or extra argument and
        ``fxwrap.InputMismatchError`` for an input the program was not compiled for (see
        ``fxwrap.runtime.guards``) or a Python scalar other than one baked in.
        """
        if self.arguments is None:
            raise TypeError(f"this {self.kind} program has no argument map (only inference and forward "
                            "programs made by fxwrap.lower have one); call it with its graph inputs, "
                            "in program.inputs order")
        with torch.no_grad():  # a compiled graph: autograd is AOTAutograd's business, not the caller's
            outputs = self.runner(*self.arguments(args))
        return outputs if self.outputs is None else self.outputs(outputs, args)


@dataclass
class TrainingPrograms:
    """``lower(..., training=True)``: the forward and backward programs."""

    forward: Program
    backward: Program

    def save(self, path: str | os.PathLike) -> None:
        """Both programs in one file; ``fxwrap.load(path)`` gives a ``LoadedTrainingPrograms``."""
        save(self, path)

    def __reduce__(self):
        return (loads, (dumps(self),))


def finish_program(program: Program, session) -> Program:
    """Give ``program`` (compiled, or loaded from the program cache) its runner: the
    target's wrapper of its GraphModule, recorded and replayed partition by partition
    (``fxwrap.runtime.graph_replay.capture_runner``) where the options ask for graphs
    (``cuda_graphs``: mode "cudagraphs", "reduce-overhead", "max-autotune") and the device
    records them (``DeviceInterface.graph_capture()``); with option ``arena=False`` what the
    wrapper runs with nothing kept across calls (``WrapperCodegen.compile_graph_per_call``)."""
    target, kind, graph_module = session.target, program.kind, program.graph_module
    wrapper = target.wrapper(target)
    capture = target.device.graph_capture() if session.options.cuda_graphs else None
    if capture is not None:
        program.runner = capture_runner(wrapper.compile_graph_per_call(graph_module), graph_module, capture,
                                        static=program.static_inputs, name=f"{kind} program")
    elif session.options.arena:
        program.runner = wrapper.compile_graph(graph_module)
    else:
        program.runner = wrapper.compile_graph_per_call(graph_module)
    return program


def log_program(program: Program, origin: str) -> None:
    """The program's Wrapper IR and FX code to the ``wrapper`` and ``fx`` log stages;
    ``origin`` says where a program that was not compiled now came from."""
    if logs.enabled("wrapper"):
        logs.logger("wrapper").debug("%s program (target %s)%s:\n%s", program.kind, program.target.name, origin,
                                     program.code())
    if logs.enabled("fx"):
        logs.logger("fx").debug("%s GraphModule%s:\n%s", program.kind, origin, annotated_code(program.graph_module))
