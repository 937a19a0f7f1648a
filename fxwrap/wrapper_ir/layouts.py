"""Layout questions the lowerer asks of a buffer or of a call's arguments::

    is_dense(Buffer('buf0', (4, 3), (1, 4), ...), hints)   -> True   (a transposed dense tensor)
    non_overlapping((4, 3), (6, 1))                        -> True   (gaps, no overlap)
    buffers_in_values((buf0, [buf1, 2]), (("out", buf2),)) -> [buf0, buf1, buf2]
"""
from __future__ import annotations

from fxwrap.ir.lines import Buffer
from fxwrap.ir.symbolic import evaluate, is_non_overlapping_and_dense


def is_dense(buf: Buffer, hints) -> bool:
    """Whether ``buf``'s elements fill its storage without gaps or overlaps (at the size hints)."""
    size = [evaluate(n, hints) for n in buf.size]
    stride = [evaluate(s, hints) for s in buf.stride]
    return is_non_overlapping_and_dense(size, stride)


def non_overlapping(size, stride) -> bool:
    """No two in-bounds indices share an element (gaps allowed): concrete sizes."""
    dims = sorted((abs(st), n) for n, st in zip(size, stride) if n != 1)
    if any(n == 0 for n in size):
        return True
    reach = 1
    for st, n in dims:
        if st < reach:
            return False
        reach = st * n
    return True


def buffers_in_values(args, kwargs) -> list[Buffer]:
    """Every ``Buffer`` in a call's arguments and keyword values, in order."""
    return [b for b in flatten((args, tuple(v for _, v in kwargs))) if isinstance(b, Buffer)]


def flatten(value):
    """The leaves of nested lists and tuples, in order."""
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from flatten(v)
    else:
        yield value
