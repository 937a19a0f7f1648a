"""The host C compiler (``CCompiler``): C sources cached as ``.c``, errors name the C compiler."""
import ctypes

import pytest

from fxwrap.targets.host.compiler import CCompiler, CompileError

# valid C, not C++: a variable named ``class`` and an implicit void* conversion
C_ONLY = """#include <stdlib.h>
double fx_scaled_sum(const double *restrict x, long n) {
  double *class = malloc(sizeof(double));
  *class = 0.0;
  for (long i = 0; i < n; ++i) *class += 2.5 * x[i];
  double r = *class;
  free(class);
  return r;
}
"""


def test_c_compiler_builds_c_and_caches_it_as_c(tmp_path):
    comp = CCompiler(cache_dir=tmp_path)
    so = comp.compile(C_ONLY)
    assert so.with_suffix(".c").read_text() == C_ONLY
    assert not so.with_suffix(".cpp").exists()
    fn = ctypes.CDLL(str(so)).fx_scaled_sum
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_long], ctypes.c_double
    xs = (ctypes.c_double * 4)(0.5, -1.25, 3.0, 7.75)
    assert fn(xs, 4) == pytest.approx(2.5 * (0.5 - 1.25 + 3.0 + 7.75))


def test_c_compiler_errors_say_c_and_keep_the_c_source(tmp_path):
    with pytest.raises(CompileError, match=r"the C compiler failed on the kernel saved at \S+\.failed\.c ") as err:
        CCompiler(cache_dir=tmp_path).compile("int broken(void) { return undefined_name; }\n")
    assert "undefined_name" in str(err.value)
