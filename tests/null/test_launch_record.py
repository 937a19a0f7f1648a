"""``KernelSource.launch`` / ``Kernel.launch`` is a typed record (``fxwrap.runtime.launch``):
``KernelLaunch`` holds what every target has, each built-in target's record type adds its own
fields, every field is declared (a misspelled one is an error), a target's own data goes in
``extra``; a dict is converted with the same check; code reads the records by attribute."""
import dataclasses
import pickle
import re
from pathlib import Path

import pytest
import torch

import fxwrap
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.launch import (LAUNCH_RECORDS, CppLaunch, KernelLaunch, MetalLaunch, ReferenceLaunch,
                                   TritonLaunch, UserTritonLaunch, launch_record)
from fxwrap.targets.base import KernelSource

ROOT = Path(__file__).resolve().parents[2]


def test_a_dict_is_converted_and_checked():
    source = KernelSource("k", "text", "c++", launch={"symbol": "fx_k", "pointers": 2, "size_symbols": ("s0",)})
    assert type(source.launch) is KernelLaunch
    assert (source.launch.symbol, source.launch.pointers, source.launch.size_symbols) == ("fx_k", 2, ("s0",))
    with pytest.raises(TypeError, match=r"unknown launch metadata \['symbl'\]; valid: \[.*'symbol'.*extra="):
        KernelSource("k", "text", "c++", launch={"symbl": "fx_k"})
    assert KernelSource("k", "text", "c++").launch == KernelLaunch()
    # a dict becomes the first record type that declares all its keys
    assert type(launch_record({"symbol": "k", "parallel": "openmp"})) is CppLaunch
    assert type(launch_record({"symbol": "k", "plan": "pointwise1d", "config": ()})) is TritonLaunch
    assert type(launch_record({"symbol": "k", "jit_key": "abc", "configs": None})) is UserTritonLaunch
    with pytest.raises(TypeError, match="one record type must declare every key"):
        launch_record({"plan": "pointwise1d", "threadgroup_size": 64})  # Triton's and Metal's


def test_fields_are_declared_and_read_by_attribute():
    launch = TritonLaunch(symbol="fx_k", extra={"tiles": 4})
    with pytest.raises(AttributeError):
        launch.symbl = "x"  # slots: no undeclared attribute
    with pytest.raises(AttributeError):
        CppLaunch().plan  # a C++ launch has no Triton field
    with pytest.raises(TypeError, match=r"read by attribute: launch\.config"):
        launch["config"]
    with pytest.raises(TypeError, match=r"read by attribute: hasattr\(launch, 'plan'\)"):
        "plan" in launch
    launch.config = (("XBLOCK", 64),)
    assert launch.config == (("XBLOCK", 64),) and launch.as_dict()["config"] == (("XBLOCK", 64),)
    assert launch.as_dict()["size_symbols"] == () and "template" not in launch.as_dict()
    for record in LAUNCH_RECORDS:
        names = record.names()
        assert len(names) == len(set(names)) and names[:7] == KernelLaunch.names()  # the common base first
        assert issubclass(record, KernelLaunch) and not hasattr(record(), "__dict__")


def test_kernels_carry_the_record_and_pickle_it():
    old = Kernel("k", "src", "cpu", (KernelArg("x", "input"),), {"symbol": "fx_k", "pointers": 1})  # a dict
    assert isinstance(old.launch, KernelLaunch) and old.launch.symbol == "fx_k"
    for launch in (old.launch, TritonLaunch(symbol="k", parts=(TritonLaunch(symbol="k_totals"),)),
                   MetalLaunch(symbol="k", threadgroup_size=64), UserTritonLaunch(symbol="k", grids=1)):
        again = pickle.loads(pickle.dumps(launch))
        assert again == launch and type(again) is type(launch)
    with pytest.raises(TypeError, match="unknown launch metadata"):
        Kernel("k", "src", "cpu", (), {"threads": 4})


class _OldRecord:
    """Unpickles as the one-record-for-every-target ``KernelLaunch`` of older fxwrap versions
    did: a ``KernelLaunch`` made without ``__init__``, then every slot's value set (BUILD)."""

    def __reduce_ex__(self, protocol):
        return (KernelLaunch.__new__, (KernelLaunch,), (None, {"symbol": "fx_k", "plan": "pointwise1d",
                                                               "parallel": None, "threadgroup_size": None}))


def test_a_record_pickled_by_an_older_fxwrap_fails_clearly():
    with pytest.raises(TypeError, match=r"saved by an older fxwrap.*lower the function again"):
        pickle.loads(pickle.dumps(_OldRecord()))


def _kernels(program):
    return [n.target for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]


@pytest.mark.parametrize("target, record", [("cpu", CppLaunch), ("reference", ReferenceLaunch),
                                            ("mps_shim", MetalLaunch)])
def test_every_built_in_kernel_has_its_target_record(target, record):
    x = torch.randn(9, 7)
    program = fxwrap.lower(lambda t: (t.sin() * 2).softmax(-1), x, target=target)
    torch.testing.assert_close(program.run(x), (x.sin() * 2).softmax(-1))
    kernels = _kernels(program)
    assert kernels
    for kernel in kernels:
        assert type(kernel.launch) is record
        assert kernel.launch.symbol or record is ReferenceLaunch
    if record is CppLaunch:
        assert all(k.launch.parallel == "openmp" and k.launch.pointers >= 2 for k in kernels)
    if record is MetalLaunch:
        assert {k.launch.kind for k in kernels} == {"reduction"} and all(k.launch.threadgroup_size for k in kernels)


# what reading launch metadata by name looks like: launch["plan"], source.launch.get("config"),
# part["symbol"] / partial["pointers"] (a split launch's parts), meta["threadgroup_size"]
_LAUNCH_FIELDS = sorted({name for record in LAUNCH_RECORDS for name in record.names()} - {"kernel", "module"}
                        | {"user_kernel"})  # the type says it now: isinstance(launch, UserTritonLaunch)
_BY_NAME = re.compile(r"""(\w*launch\w*|\bpart|\bpartial|\bcombine)(\[|\.get\()\s*["'](\w+)["']""")


def test_no_launch_metadata_is_read_by_name():
    """0 string-key reads of a launch record outside ``runtime/launch.py``: in the package, the
    examples, the tests, the benchmarks and the docs (a record has no ``get``, and ``[...]``
    raises)."""
    found = []
    for folder, pattern in (("fxwrap", "*.py"), ("examples", "*.py"), ("tests", "*.py"), ("benchmarks", "*.py"),
                            ("docs", "*.md"), ("examples", "*.md")):
        for path in sorted((ROOT / folder).rglob(pattern)):
            if path.name == "launch.py" and path.parent.name == "runtime" or path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for match in _BY_NAME.finditer(line):
                    if match.group(3) in _LAUNCH_FIELDS:
                        found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "launch metadata read by name (read the record's attribute):\n" + "\n".join(found)
