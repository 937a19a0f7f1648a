"""Two passes that record the order they ran in."""
from fxwrap import hookimpl

ran = []


def first(lines):
    ran.append("tag.first")
    return lines


def second(lines):
    ran.append("tag.second")
    return lines


@hookimpl
def fxwrap_wrapper_passes(target):
    return [first, second]
