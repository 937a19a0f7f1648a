"""Removes the memory plan from target ``cpu``'s Wrapper-IR passes: a broken pass list."""
from fxwrap import hookimpl


@hookimpl
def fxwrap_pipeline(pipeline, target):
    if target.name == "cpu":
        pipeline.wrapper.remove_named("memory plan")
