"""``fxwrap_templates`` returning something that is not a Template: a PluginError naming it."""
import fxwrap


@fxwrap.hookimpl
def fxwrap_templates(target):
    return ["my_gemm"]
