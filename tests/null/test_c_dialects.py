"""The C-family dialects (fxwrap.targets.cstyle): each built-in dialect's prelude defines every
helper the shared engine calls (``HELPERS``) and every helper its op table calls, under its
prefix; a dialect's spellings are attributes, not code.  Pure text: no compiler."""
from __future__ import annotations

import re

import pytest
import torch

from fxwrap.ir.loops import Op, Reduction
from fxwrap.targets.c_helpers import Helper, HelperPrelude, render_helpers
from fxwrap.targets.cpu_cpp.emitter import CppEmitter
from fxwrap.targets.cpu_cpp.prelude import CPP
from fxwrap.targets.cstyle import HELPERS, CStyleEmitter, ReductionAccumulator, ScanState
from fxwrap.targets.mps_metal.emitter import MetalEmitter
from fxwrap.targets.mps_metal.prelude import METAL

DIALECTS = [CppEmitter, MetalEmitter]


def defined(prelude: str, fn: str) -> bool:
    """``fn`` is defined in ``prelude``: its name, a parameter list, then a body."""
    return re.search(rf"\b{re.escape(fn)}\s*\([^;{{]*\)\s*(const\s*)?\{{", prelude) is not None


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__)
def test_prelude_defines_every_engine_helper(dialect):
    missing = [dialect.prefix + name for names in HELPERS.values() for name in names
               if not defined(dialect.prelude, dialect.prefix + name)]
    assert not missing, f"{dialect.__name__}'s prelude lacks {missing}"


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.__name__)
def test_prelude_defines_every_op_table_helper(dialect):
    called = set()
    for name, fn in dialect.code_for_op.items():
        for dtype in (torch.float32, torch.int64, torch.bool):
            try:
                text = fn("a", "b", "c", dtype=dtype)
            except TypeError:
                try:
                    text = fn("a", "b", dtype=dtype)
                except TypeError:
                    text = fn("a", dtype=dtype)
            called |= set(re.findall(rf"\b({re.escape(dialect.prefix)}\w+)\(", text))
    assert called and not [fn for fn in sorted(called) if not defined(dialect.prelude, fn)]


def test_a_dialect_spells_accumulators_and_casts():
    """The same reduction and scan, spelled by the engine's C default, C++ and Metal."""
    x = Op.load("x", 0, torch.float32)

    def spell(em):
        red = ReductionAccumulator(em, 0, Reduction("m", "argmax", x, torch.int64))
        scan = ScanState(em, 0, Reduction("c", "cummax", x, torch.float32))
        return red.states, red.upd(red.names("a"), "v", "i"), scan.upd("v", "r0"), em.render_cast("v", torch.float32,
                                                                                                    torch.int32)

    assert spell(CStyleEmitter()) == (
        [("float", "((float)0)"), ("int64_t", "-1")], "fx_argmax_upd_float(&rd0_a0, &rd0_a1, v, i);",
        "fx_cummax_upd_float(&sc0_s0, &sc0_s1, v, r0);", "((int32_t)(((int64_t)(v))))")
    assert spell(CppEmitter()) == (
        [("float", "float(0)"), ("int64_t", "-1")], "fx_argmax_upd<float>(rd0_a0, rd0_a1, v, i);",
        "fx_cummax_upd<float>(sc0_s0, sc0_s1, v, r0);", "static_cast<int32_t>(static_cast<int64_t>(v))")
    assert spell(MetalEmitter())[0] == [("float", "float(0)"), ("long", "-1")]
    assert spell(MetalEmitter())[3] == "static_cast<int>(static_cast<long>(v))"


def test_dialects_share_no_cpp_ancestry():
    """C++ and Metal are dialects of the engine side by side: neither subclasses the other."""
    assert not issubclass(MetalEmitter, CppEmitter) and not issubclass(CppEmitter, MetalEmitter)
    assert CStyleEmitter.cast == "(({t})({x}))" and "std::" not in "".join(
        fn("a", dtype=torch.float32) for name, fn in CStyleEmitter.code_for_op.items() if name in ("exp", "sin"))


def test_integer_literal_suffixes_are_dialect_attributes():
    """A dialect whose 64-bit type is ``long`` (OpenCL C) sets two attributes instead of
    copying ``int_literal``; constants and index expressions both use them."""
    import sympy

    class OpenCLSpelling(CStyleEmitter):
        long_suffix, unsigned_long_suffix = "L", "UL"

    em = OpenCLSpelling()
    assert [em.int_literal(v) for v in (7, -(2 ** 40), 2 ** 63 + 5, -(2 ** 63))] == [
        "7", "-1099511627776L", "9223372036854775813UL", "(-9223372036854775807L - 1)"]
    assert em.render_const(2 ** 35, torch.int64).endswith("34359738368L")
    assert em.render_index(sympy.Symbol("x0", integer=True) * 2 ** 33) == "8589934592L*x0"
    assert CStyleEmitter().int_literal(2 ** 40) == CppEmitter().int_literal(2 ** 40) == "1099511627776LL"


@pytest.mark.parametrize("dialect, spelling", [(CppEmitter, CPP), (MetalEmitter, METAL)], ids=["cpp", "metal"])
def test_a_prelude_renders_the_shared_helpers_in_its_emitters_spelling(dialect, spelling):
    """cpu_cpp/prelude.py and mps_metal/prelude.py render c_helpers' definitions at import
    (their PRELUDE is a plain string other modules read) with a spelling that must be the
    emitter's own."""
    names = [n for n in vars(spelling) if not n.startswith("__")]
    assert names and {n: getattr(dialect, n) for n in names} == {n: getattr(spelling, n) for n in names}


def test_the_shared_helpers_in_three_spellings():
    """One definition (c_helpers.HELPER_DEFS), spelled by the C default (one function per
    type through macros, pointers for in-out arguments), C++ (templates, references) and
    Metal (thread references, functional casts)."""
    c = render_helpers(CStyleEmitter, ["welford_upd", "cummax_upd"])
    assert "static inline void fx_welford_upd_##T(T *mean, T *m2, int64_t *n, T v) { \\\n  *n += 1;" in c
    assert "mean += d / (T)*n;" in c and "C99_" not in c and "#define FX_FLOAT(T)" in c
    assert "FX_FLOAT(float) FX_ANY(float, -INFINITY, INFINITY)" in c
    assert "FX_INT(int64_t) FX_ANY(int64_t, (-9223372036854775807LL - 1), 9223372036854775807LL)" in c
    assert "if (fx_isnan_##T(v) || (!fx_isnan_##T(*va) && v >= *va)) { *va = v; *ia = i; }" in c
    assert render_helpers(CppEmitter, ["sum_upd"]) == (
        "template <typename T> static inline void fx_sum_upd(T& a, T v) { a = a + v; }\n")
    assert "mean += d / T(n);" in render_helpers(MetalEmitter, ["welford_upd"])
    assert "inline long fx_imin(long a, long b) { return b < a ? b : a; }" in render_helpers(MetalEmitter, ["imin"])


def test_a_dialect_overrides_a_single_helper():
    class Mine(CStyleEmitter):
        prefix = "my_"
        prelude = HelperPrelude("", {"round": Helper("round", "T (T x)", {"float": "return $round(x);",
                                                                           "int": "return x;"}, "split")})

    assert "static inline T my_round_##T(T x) { return round(x); }" in Mine.prelude
    assert "my_round_##T(T x) { return rint(x); }" in CStyleEmitter.prelude.replace("fx_", "my_")
    assert Mine.code_for_op["floordiv"]("a", "b", dtype=torch.float32) == "my_floordiv_float(a, b)"


def test_the_engine_default_prelude_defines_every_engine_helper():
    """A dialect that sets nothing gets C99 with every helper: the index helpers once, the
    others once per type (``fx_<name>_##T`` in the macros, ``FX_ANY(float, ...)`` lines)."""
    prelude = CStyleEmitter.prelude
    missing = [name for names in HELPERS.values() for name in names
               if not re.search(rf"\bfx_{name}(_##T)?\(", prelude)]
    assert not missing and "FX_FLOAT(double) FX_ANY(double, -INFINITY, INFINITY)" in prelude

