"""A wrapper pass that drops every Comment line, for every target."""
from fxwrap import hookimpl
from fxwrap.wrapper_ir.lines import Comment

calls = []  # targets the pass ran for


def drop_comments(lines):
    return [line for line in lines if not isinstance(line, Comment)]


@hookimpl
def fxwrap_wrapper_passes(target):
    calls.append(target.name)
    return [drop_comments]
