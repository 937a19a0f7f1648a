"""A module with no fxwrap hook at all."""


def targets():
    return []
