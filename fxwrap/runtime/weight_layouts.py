"""A parameter's copy in the layout a convolution wants, made once and reused while the
parameter is unchanged (option ``cache_weight_layouts``).

A CPU conv net compiled channels-last copies every NCHW weight to NHWC on every call; for
a ResNet-18-shaped net at batch 1 that copy was two thirds of a call (benchmarks/
weight_relayout.py).  With the option, the layout pass calls
``torch.ops.fxwrap.cached_layout(weight, stride)`` instead of a copy kernel::

    buf1 = torch.ops.fxwrap.cached_layout.default(arg0, [27, 1, 9, 3])
    buf2 = aten.convolution.default(buf0, buf1, arg1, ...)

It returns the copy it made before while the parameter's ``_version`` (bumped by every
in-place write: an optimizer step, ``load_state_dict``, ``p.mul_(2)`` under ``no_grad``)
and ``data_ptr()`` (``p.data = t``) are those it was made at, and makes a new one
otherwise.  A write through ``p.data`` (a detached alias with a version counter of its
own) is not seen, nor is a write through ``p.detach().numpy()`` (numpy bumps no version):
why the cache is an opt-in, as Inductor's ``freezing`` is.  No cheaper check is sound: the
storage has no version of its own, and comparing the parameter with the copy reads as many
bytes as making the copy again.  The copy is not the program's storage: the memory planner
never hands it on (an op outside ``aten``).

Measured (torchvision ResNet-18, one 224x224 image, fp32, one thread, thread CPU time on a
loaded 2-core machine): 88.8 ms a call with the per-call relayout (its kernels 21 ms, at the
copy bandwidth), 55.6 ms with the option.  Inductor without ``freezing`` relays every
convolution weight per call as well (``cpp_fused_..._convolution`` kernels writing
``(576, 1, 192, 64)``-strided copies), and passing oneDNN the NCHW weight instead costs the
same (it reorders the weight inside each call): without the option both compilers pay it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary


@dataclass
class CacheStats:
    """Copies made (``misses``) and reused (``hits``) since the process started."""

    hits: int = 0
    misses: int = 0


STATS = CacheStats()
_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> {stride: (version, data_ptr, copy)}


def cached_layout(weight: torch.Tensor, stride) -> torch.Tensor:
    """``weight``'s values in a tensor of ``stride``, made once per version of ``weight``."""
    key = tuple(int(s) for s in stride)
    entries = _CACHE.get(weight)
    if entries is None:
        entries = _CACHE[weight] = {}
    found = entries.get(key)
    version, pointer = weight._version, weight.data_ptr()
    if found is not None and found[0] == version and found[1] == pointer:
        STATS.hits += 1
        return found[2]
    with torch.no_grad():
        copy = torch.empty_strided(weight.shape, key, dtype=weight.dtype, device=weight.device)
        copy.copy_(weight)
    entries[key] = (version, pointer, copy)
    STATS.misses += 1
    return copy


def _fake(weight: torch.Tensor, stride) -> torch.Tensor:
    return torch.empty_strided(weight.shape, stride, dtype=weight.dtype, device=weight.device)


_LIBRARY = torch.library.Library("fxwrap", "FRAGMENT")
_LIBRARY.define("cached_layout(Tensor weight, int[] stride) -> Tensor")
_LIBRARY.impl("cached_layout", cached_layout, "CompositeExplicitAutograd")
torch.library.register_fake("fxwrap::cached_layout", _fake, lib=_LIBRARY)
CACHED_LAYOUT = torch.ops.fxwrap.cached_layout.default
