"""The arena's kernel flavour: fxwrap's C++ emitter with its own prologue and ``tanh``."""
import fxwrap

# arena flavour: tanh through one vendor hook (a real team would call its own math library)
ARENA_PRELUDE = "\ntemplate <typename T> static inline T arena_tanh(T x) { return std::tanh(x); }\n"


class ArenaEmitter(fxwrap.CppEmitter):
    """Renders like ``CppEmitter``, plus ``// arena kernel (alignment 64)`` and ``arena_tanh``."""

    prelude = fxwrap.CppEmitter.prelude + ARENA_PRELUDE
    code_for_op = {**fxwrap.CppEmitter.code_for_op, "tanh": lambda x, dtype: f"arena_tanh({x})"}

    def header_comment(self, kernel):
        align = self.target_options.get("alignment", 64)
        return [*super().header_comment(kernel), f"// arena kernel (alignment {align})"]
