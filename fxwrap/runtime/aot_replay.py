"""What a compiled graph runs when it came from the warm-start cache, not from AOTAutograd.

AOTAutograd wraps the programs it compiles in runtime wrappers (input mutations written
back, aliased outputs regenerated, an ``autograd.Function`` joining forward and backward).
The warm-start cache (``fxwrap.programs.graph_cache``) stores only graphs whose wrappers are plain --
input mutations only those the program makes itself (data, of inputs autograd does not
differentiate: batch norm's running statistics), no output aliasing an input or another
output, no tensor subclass, no effect tokens, no functionalized RNG -- and replays them
with these two runners::

    InferenceReplay(program, mutated)     run(*args) == program(*args)

    TrainingReplay(forward, backward, layout, mutated)
        forward(*args)  -> user outputs + saved tensors + saved symints
        backward(*saved symints, *saved tensors, *grads of outputs that need one)
                        -> one gradient (or None) per input

``mutated``: the inputs the program writes in place that autograd sees; after a call their
version counters go up, as AOTAutograd's wrapper does, so that autograd refuses a backward
that reads a value saved before the write.

``ReplayLayout`` is the metadata (from AOTAutograd's ``ViewAndMutationMeta``) the
training runner needs: how many user outputs, where the saved tensors and symints sit
among the forward's outputs, which outputs need a gradient and in what memory format
the backward was compiled to take it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


class InferenceReplay:
    """An inference program called as dynamo calls a backend's result: ``run(*args)``."""

    def __init__(self, program: Callable, mutated: tuple[int, ...] = ()):
        self.program, self.mutated = program, mutated

    def __call__(self, *args):
        outputs = self.program(*args)
        _bump_versions(args, self.mutated)
        return outputs


def _bump_versions(args, mutated: tuple[int, ...]) -> None:
    for i in mutated:  # one tensor a call: the form every torch since 2.1 takes
        torch.autograd.graph.increment_version(args[i])


@dataclass(frozen=True)
class ReplayLayout:
    """Where things are among a training forward program's outputs (see module docstring).

    ``saved_tensors`` and ``saved_symints``: slices of the forward's outputs;
    ``needs_grad``: per user output, whether it requires grad (and so gets a tangent);
    ``tangent_layouts``: per tangent, how the backward program takes it: ``"contiguous"``,
    ``"channels_last"`` or the strides (a tuple of ints) it was traced with."""

    num_user_outputs: int
    saved_tensors: slice
    saved_symints: slice
    needs_grad: tuple[bool, ...]
    tangent_layouts: tuple[str | tuple[int, ...], ...]


_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def _laid_out(grad: torch.Tensor, layout: str | tuple[int, ...]) -> torch.Tensor:
    """``grad`` in the layout the backward program was compiled for (AOTAutograd's tangent coercion)."""
    if isinstance(layout, str):
        return grad.contiguous(memory_format=_FORMATS[layout])
    if tuple(grad.stride()) == layout:
        return grad
    return torch.empty_strided(grad.shape, layout, dtype=grad.dtype, device=grad.device).copy_(grad)


class TrainingReplay:
    """A forward/backward program pair as an ``autograd.Function``: ``run(*args)`` returns
    the user outputs, and their ``backward`` runs the backward program."""

    def __init__(self, forward: Callable, backward: Callable, layout: ReplayLayout, mutated: tuple[int, ...] = ()):
        self.forward, self.backward, self.layout, self.mutated = forward, backward, layout, mutated
        replay = self

        class Compiled(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *args):
                outs = list(replay.forward(*args))
                user = outs[:layout.num_user_outputs]
                ctx.save_for_backward(*outs[layout.saved_tensors])
                ctx.symints = outs[layout.saved_symints]
                ctx.mark_non_differentiable(*[o for o, g in zip(user, layout.needs_grad)
                                              if isinstance(o, torch.Tensor) and not g])
                return tuple(user)

            @staticmethod
            def backward(ctx, *grads):
                tangents = [_laid_out(g, how) for g, how in
                            zip((g for g, need in zip(grads, layout.needs_grad) if need), layout.tangent_layouts)]
                saved = list(ctx.saved_tensors)
                return tuple(replay.backward(*ctx.symints, *saved, *tangents))

        self._function = Compiled

    def __call__(self, *args):
        outputs = list(self._function.apply(*args))
        _bump_versions(args, self.mutated)
        return outputs
