"""The helpers with PyTorch's semantics that every C-family prelude defines, written once.

Each helper of ``cstyle.HELPERS`` (and the few they call) is one ``Helper``: a signature and
a body in a dialect-neutral C, with a body per kind of type where floats and integers
differ.  ``render_helpers(dialect, names)`` spells them in a dialect's syntax, read from
the dialect's attributes (``prefix``, ``overload``, ``out_arg``, ``out_param``,
``helper_inline``, ``math``, ``helper_cast``, ``index_type``, ``type_names``, the literal
suffixes); ``HelperPrelude`` is a dialect's ``prelude`` made of them.  The neutral text:

* ``T`` is the value type, ``int64_t`` the index type (the dialect's ``index_type``);
* ``@name(...)`` calls helper ``name`` at ``T`` (``overload``: ``fx_max(a, b)`` in C++,
  ``c99_max_##T(a, b)`` in C), ``$name(...)`` the math library (``math + name``);
* a parameter ``T &a`` is updated in place: ``T *a`` and ``*a`` in C (``out_arg`` is
  ``&{x}``), ``T& a`` in C++, ``thread T& a`` in Metal (``out_param``);
* ``(T)x`` is a cast, spelled by ``helper_cast`` (Metal: ``T(x)``).

A dialect with overloading (``overload`` is ``{f}``: C++, Metal) gets templates::

    template <typename T> static inline void fx_sum_upd(T& a, T v) { a = a + v; }

a dialect without (C99, OpenCL C) gets one function per type, through three macros
(``<PREFIX>FLOAT(T)``, ``<PREFIX>INT(T)``, ``<PREFIX>ANY(T, LOWEST, HIGHEST)``)::

    #define C99_ANY(T, LOWEST, HIGHEST) \\
    static inline void c99_sum_upd_##T(T *a, T v) { *a = *a + v; } \\
    ...
    C99_FLOAT(float) C99_ANY(float, -INFINITY, INFINITY)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

__all__ = ["HELPER_DEFS", "Helper", "HelperPrelude", "render_helpers"]


@dataclass(frozen=True)
class Helper:
    """``name``'s signature (``"T (T a, T b)"``: the return type, then the parameters) and
    body (one string, or ``{"float": ..., "int": ...}``); ``kind``: ``"plain"`` (fixed
    types, no ``T``), ``"any"`` (every type), ``"float"`` or ``"int"`` (those types only),
    or ``"split"`` (a float body and an integer body)."""

    name: str
    sig: str
    body: str | dict[str, str]
    kind: str = "any"


def _h(name, sig, body, kind="any"):
    return Helper(name, sig, body if isinstance(body, dict) else body.lstrip("\n"), kind)


def _split(name, sig, float_body, int_body):
    return _h(name, sig, {"float": float_body.strip("\n"), "int": int_body.strip("\n")}, "split")


_IDX2 = "int64_t (int64_t a, int64_t b)"
_ARG_UPD = "void (T &va, int64_t &ia, T v, int64_t i)"
_SIGNED = "((T)-1 < 0)"

#: every helper, in an order where each is defined before it is called
HELPER_DEFS: tuple[Helper, ...] = (
    # index helpers: Python's semantics for negative operands
    _h("ifloordiv", _IDX2, """
const int64_t q = a / b;
return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;""", "plain"),
    _h("imod", _IDX2, """
const int64_t r = a % b;
return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;""", "plain"),
    _h("imax", _IDX2, "return a < b ? b : a;", "plain"),
    _h("imin", _IDX2, "return b < a ? b : a;", "plain"),
    _h("ipow_index", "int64_t (int64_t b, int64_t e)", """
int64_t r = 1;
for (; e > 0; e >>= 1, b *= b) if (e & 1) r *= b;
return r;""", "plain"),
    # erfinv: Winitzki's closed form, then Halley steps on erf(x) = y in double (erfc near |y| = 1)
    _h("erfinv_d", "double (double y)", """
const double a = $fabs(y);
if (!(a < 1.0)) return a == 1.0 ? $copysign(INFINITY, y) : NAN;
if (a == 0.0) return y;
const double k = 0.147;
const double pi = 3.14159265358979323846;
const double l = $log((1.0 - a) * (1.0 + a));
const double t = 2.0 / (pi * k) + 0.5 * l;
double x = $sqrt($sqrt(t * t - l / k) - t);
const double two_over_sqrt_pi = 1.12837916709551257390;
for (int i = 0; i < 3; ++i) {
  const double f = a < 0.5 ? $erf(x) - a : (1.0 - a) - $erfc(x);
  const double step = f / (two_over_sqrt_pi * $exp(-x * x));
  x -= step / (1.0 + x * step);
}
return $copysign(x, y);""", "plain"),
    # classification and rounding: the identity on integers
    _split("isnan", "bool (T x)", "return $isnan(x);", "(void)x; return false;"),
    _split("isinf", "bool (T x)", "return $isinf(x);", "(void)x; return false;"),
    _split("signbit", "bool (T x)", "return $signbit(x);", f"return {_SIGNED} && x < 0;"),
    _split("abs", "T (T x)", "return $fabs(x);", f"return {_SIGNED} && x < 0 ? (T)-x : x;"),
    _split("floor", "T (T x)", "return $floor(x);", "return x;"),
    _split("ceil", "T (T x)", "return $ceil(x);", "return x;"),
    _split("trunc", "T (T x)", "return $trunc(x);", "return x;"),
    _split("round", "T (T x)", "return $rint(x);", "return x;"),  # half to even
    _h("sigmoid", "T (T x)", "return (T)1 / ((T)1 + $exp(-x));", "float"),
    _h("rsqrt", "T (T x)", "return (T)1 / $sqrt(x);", "float"),
    _h("reciprocal", "T (T x)", "return (T)1 / x;", "float"),
    _h("erfinv", "T (T y)", "return (T)@erfinv_d((double)y);", "float"),
    # the division family; integer division by 0 gives 0 (eager raises), x / -1 never traps
    _h("by_m1", "bool (T b)", f"return {_SIGNED} && b == (T)-1;", "int"),
    _split("truncdiv", "T (T a, T b)", "return $trunc(a / b);",
           "return b == 0 ? 0 : @by_m1(b) ? (T)(0 - a) : (T)(a / b);"),
    _split("fmod", "T (T a, T b)", "return $fmod(a, b);", "return b == 0 || @by_m1(b) ? 0 : (T)(a % b);"),
    _split("floordiv", "T (T a, T b)", """
if (b == 0) return a / b;
const T m = $fmod(a, b);
T d = (a - m) / b;
if (m != 0 && ((b < 0) != (m < 0))) d -= (T)1;
if (d == 0) return $copysign((T)0, a / b);
T f = $floor(d);
return d - f > (T)0.5 ? f + (T)1 : f;""", """
if (b == 0) return 0;
if (@by_m1(b)) return (T)(0 - a);
const T q = (T)(a / b);
return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;"""),
    # torch.remainder: the result takes the sign of the divisor
    _split("mod", "T (T a, T b)", """
T m = $fmod(a, b);
if (m != 0 && ((b < 0) != (m < 0))) m += b;
return m;""", """
if (b == 0 || @by_m1(b)) return 0;
const T r = (T)(a % b);
return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;"""),
    _split("pow", "T (T b, T e)", "return $pow(b, e);", f"""
if ({_SIGNED} && e < 0) return b == 1 ? 1 : @by_m1(b) ? ((e & 1) ? b : 1) : 0;
T r = 1;
for (; e != 0; e = (T)(e >> 1), b = (T)(b * b)) if (e & 1) r = (T)(r * b);
return r;"""),
    # shifts: an amount outside [0, bits) shifts everything out (sign fill for >>)
    _h("lshift", "T (T a, T b)", """
if ((int64_t)b < 0 || (int64_t)b >= (int64_t)(8 * sizeof(T))) return 0;
return (T)((uint64_t)a << b);""", "int"),
    _h("rshift", "T (T a, T b)", f"""
if ((int64_t)b < 0 || (int64_t)b >= (int64_t)(8 * sizeof(T))) return (T)({_SIGNED} && a < 0 ? -1 : 0);
return (T)(a >> b);""", "int"),
    # maximum/minimum and the max/min reductions: NaN wins
    _h("max", "T (T a, T b)", "return (a < b || @isnan(b)) ? b : a;"),
    _h("min", "T (T a, T b)", "return (b < a || @isnan(b)) ? b : a;"),
    _h("sign", "T (T x)", "return (T)((0 < x) - (x < 0));"),
    _h("lowest", "T (void)", "return LOWEST;"),
    _h("highest", "T (void)", "return HIGHEST;"),
    # reductions: update a state with one value
    _h("sum_upd", "void (T &a, T v)", "a = a + v;"),
    _h("prod_upd", "void (T &a, T v)", "a = a * v;"),
    _h("max_upd", "void (T &a, T v)", "a = @max(a, v);"),
    _h("min_upd", "void (T &a, T v)", "a = @min(a, v);"),
    _h("any_upd", "void (bool &a, T v)", "a = a || (v != 0);"),
    _h("all_upd", "void (bool &a, T v)", "a = a && (v != 0);"),
    # argmax/argmin: does (vb, ib) beat (va, ia)?  The extreme wins, NaN is the most extreme,
    # ties go to the lower index, an empty state (index < 0) always loses
    _h("arg_better", "bool (bool is_max, T va, int64_t ia, T vb, int64_t ib)", """
if (ib < 0) return false;
if (ia < 0) return true;
const bool na = @isnan(va), nb = @isnan(vb);
if (na || nb) return (na && nb) ? ib < ia : nb;
if (is_max ? (va < vb) : (vb < va)) return true;
return va == vb && ib < ia;"""),
    _h("argmax_upd", _ARG_UPD, "if (@arg_better(true, va, ia, v, i)) { va = v; ia = i; }\n"),
    _h("argmin_upd", _ARG_UPD, "if (@arg_better(false, va, ia, v, i)) { va = v; ia = i; }\n"),
    # scans (eager's CPU kernels' rules): logcumsumexp propagates NaN and keeps -inf/-inf,
    # inf/inf; cummax/cummin: a NaN always takes over, ties go to the later index
    _h("logcumsumexp_upd", "void (T &a, T v)", """
const T mn = @isnan(v) ? v : (a < v ? a : v);
const T mx = @isnan(v) ? v : (a < v ? v : a);
if (mn != mx || $isfinite(mn)) a = $log1p($exp(mn - mx)) + mx;""", "float"),
    _h("cummax_upd", _ARG_UPD, "if (@isnan(v) || (!@isnan(va) && v >= va)) { va = v; ia = i; }\n"),
    _h("cummin_upd", _ARG_UPD, "if (@isnan(v) || (!@isnan(va) && v <= va)) { va = v; ia = i; }\n"),
    # Welford's mean and M2, and the parallel (Chan et al.) combination of two states
    _h("welford_upd", "void (T &mean, T &m2, int64_t &n, T v)", """
n += 1;
const T d = v - mean;
mean += d / (T)n;
m2 += d * (v - mean);""", "float"),
    _h("welford_cmb", "void (T &mean, T &m2, int64_t &n, T mean_b, T m2_b, int64_t n_b)", """
if (n_b == 0) return;
if (n == 0) { mean = mean_b; m2 = m2_b; n = n_b; return; }
const int64_t nn = n + n_b;
const T d = mean_b - mean;
const T wb = (T)n_b / (T)nn;
mean = mean + d * wb;
m2 = m2 + m2_b + d * d * (T)n * wb;
n = nn;""", "float"),
)

_BY_NAME = {h.name: h for h in HELPER_DEFS}
_CALL = re.compile(r"@(\w+)\(")
_MATH = re.compile(r"\$(\w+)\(")
_CAST = re.compile(r"\(T\)(\w+)")
_PARAM = re.compile(r"^(.*?)\s*&(\w+)$")


def _spell(dialect, h: Helper, body: str, t: str) -> tuple[str, str]:
    """``(head, body)`` of ``h`` in ``dialect``'s syntax at type ``t`` (``T``, or ``##T``)."""
    ret, params = re.match(r"^(\w+) \((.*)\)$", h.sig).groups()
    outs, spelled = [], []
    for p in ([] if params == "void" else params.split(", ")):
        m = _PARAM.match(p)
        if m:
            outs.append(m.group(2))
            p = dialect.out_param.format(t=m.group(1), x=m.group(2))
        spelled.append(p)
    if dialect.out_arg == "&{x}":  # pointers: every use of an in-out parameter dereferences it
        for x in outs:
            body = re.sub(rf"(?<![\w.>]){x}\b", f"*{x}", body)
    body = _CALL.sub(lambda m: (dialect.prefix + m.group(1) if _BY_NAME[m.group(1)].kind == "plain" else
                                dialect.overload.format(f=dialect.prefix + m.group(1), t=t)) + "(", body)
    body = _MATH.sub(lambda m: f"{dialect.math}{m.group(1)}(", body)
    if dialect.helper_cast != "({t}){x}":
        body = _CAST.sub(lambda m: dialect.helper_cast.format(t="T", x=m.group(1)), body)
    name = dialect.prefix + h.name if h.kind == "plain" or t == "T" else dialect.generic.format(
        f=dialect.prefix + h.name, t=t)
    head = f"{dialect.helper_inline} {ret} {name}({', '.join(spelled) or 'void'})"
    u64 = getattr(dialect, "type_names", {}).get(torch.uint64, "uint64_t")
    return tuple(re.sub(r"\buint64_t\b", u64, re.sub(r"\bint64_t\b", dialect.index_type, text)) for text in (head, body))


def _function(head: str, body: str, template: bool) -> list[str]:
    """One definition: a one-line body stays on the head's line; a template head longer
    than 100 characters goes on a line of its own."""
    pre = "template <typename T>" if template else ""
    if pre and len(pre) + len(head) > 100:
        lines, pre = [pre], ""
    else:
        lines = []
    pre = pre + " " if pre else ""
    if "\n" not in body.rstrip("\n") and not body.endswith("\n"):
        return lines + [f"{pre}{head} {{ {body} }}"]
    return lines + [f"{pre}{head} {{", *("  " + line for line in body.rstrip("\n").split("\n")), "}"]


def _helpers(names, overrides) -> list[Helper]:
    chosen = [overrides.get(h.name, h) for h in HELPER_DEFS if names is None or h.name in names]
    missing = set(names or ()) - {h.name for h in chosen}
    if missing:
        raise KeyError(f"no helper definition named {sorted(missing)}; the helpers are {sorted(_BY_NAME)}")
    return chosen


def render_helpers(dialect, names=None, overrides: dict[str, Helper] | None = None) -> str:
    """The definitions of the helpers ``names`` (default: all of ``HELPER_DEFS``, in its
    order) in ``dialect``'s spelling; ``overrides`` replaces single helpers by name."""
    helpers = _helpers(names, overrides or {})
    if dialect.overload == "{f}":  # overloading: templates (a split helper: integer template, float overload)
        out: list[str] = []
        for h in helpers:
            if h.kind == "plain":
                out += _function(*_spell(dialect, h, h.body, "T"), template=False)
            elif h.kind == "split":
                out += _function(*_spell(dialect, h, h.body["int"], "T"), template=True)
                head, body = _spell(dialect, h, h.body["float"], "T")
                out += _function(re.sub(r"\bT\b", "float", head), re.sub(r"\bT\b", "float", body), template=False)
            else:
                out += _function(*_spell(dialect, h, h.body, "T"), template=True)
        return "\n".join(out) + "\n"
    return _per_type(dialect, helpers)


def _per_type(dialect, helpers: list[Helper]) -> str:
    """One function per type through three macros, then one line per type."""
    macro = dialect.prefix.upper()
    groups = {"FLOAT(T)": [], "INT(T)": [], "ANY(T, LOWEST, HIGHEST)": []}
    out: list[str] = []
    for h in helpers:
        if h.kind == "plain":
            out += _function(*_spell(dialect, h, h.body, "T"), template=False)
            continue
        for kind, group in (("float", "FLOAT(T)"), ("int", "INT(T)")):
            if h.kind in (kind, "split"):
                body = h.body[kind] if h.kind == "split" else h.body
                groups[group] += _function(*_spell(dialect, h, body, "##T"), template=False)
        if h.kind == "any":
            groups["ANY(T, LOWEST, HIGHEST)"] += _function(*_spell(dialect, h, h.body, "##T"), template=False)
    for group, lines in groups.items():
        if lines:
            out += [f"#define {macro}{group} \\", *(line + " \\" for line in lines[:-1]), lines[-1]]
    for dtype, t in dialect.type_names.items():
        if dtype in dialect.half_types or dtype not in _LIMITS:
            continue
        lo, hi = _limits(dialect, dtype)
        kind = "FLOAT" if dtype.is_floating_point else "INT"
        out.append(f"{macro}{kind}({t}) {macro}ANY({t}, {lo}, {hi})")
    return "\n".join(out) + "\n"


_LIMITS = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
           torch.uint16, torch.uint32, torch.uint64, torch.bool)


def _limits(dialect, dtype: torch.dtype) -> tuple[str, str]:
    if dtype.is_floating_point:
        return f"-{dialect.infinity}", dialect.infinity
    if dtype == torch.bool:
        return "0", "1"
    info = torch.iinfo(dtype)
    hi = 2 ** 64 - 1 if dtype == torch.uint64 else info.max
    return dialect.int_literal(dialect, info.min, dtype), dialect.int_literal(dialect, hi, dtype)


class HelperPrelude:
    """A dialect's ``prelude`` attribute: ``head`` (its includes) and every helper of
    ``HELPER_DEFS`` rendered in the spelling of the class it is set on (``overrides``: a
    dialect's own definitions of single helpers)::

        class C99Emitter(fxwrap.CStyleEmitter):
            prefix = "c99_"
            prelude = HelperPrelude("#include <stdbool.h>\\n#include <stdint.h>\\n#include <tgmath.h>")
    """

    def __init__(self, head: str = "", overrides: dict[str, Helper] | None = None):
        self.head, self.overrides, self._text = head, dict(overrides or {}), {}

    def __get__(self, obj, owner) -> str:
        if owner not in self._text:
            self._text[owner] = self.head.strip("\n") + "\n" + render_helpers(owner, overrides=self.overrides)
        return self._text[owner]
