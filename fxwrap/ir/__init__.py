"""The data at the bottom of the compiler: frozen, interned, hashable.

``loops``: the loop IR (``Loops`` nodes a lowering builds); ``lines``: the Wrapper IR's line
types (the program contract); ``control_flow``, ``user_kernels``, ``collectives``: lines of
nested programs, user Triton kernels and communication; ``symbolic``: sizes, strides and
index math as sympy expressions.  Imports only ``fxwrap.runtime`` beneath it.
"""
