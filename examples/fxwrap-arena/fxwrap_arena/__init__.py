"""fxwrap-arena: an out-of-tree fxwrap target, ``options={"target": "arena"}``."""
