"""A target whose emitter is not a KernelEmitter subclass."""
from fxwrap import hookimpl
from fxwrap_plugin_fixtures import target


class NotAnEmitter:
    pass


@hookimpl
def fxwrap_targets():
    return [target("no_emitter", emitter=NotAnEmitter)]
