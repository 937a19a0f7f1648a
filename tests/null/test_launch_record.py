"""``KernelSource.launch`` / ``Kernel.launch`` is a typed record (``fxwrap.runtime.launch.
KernelLaunch``): every field declared, a misspelled one an error, a target's own data in
``extra``; a dict is converted with the same check (old saved programs, old emitters)."""
import dataclasses
import pickle

import pytest
import torch

import fxwrap
from fxwrap.runtime.kernel import Kernel, KernelArg
from fxwrap.runtime.launch import KernelLaunch
from fxwrap.targets.base import KernelSource


def test_a_dict_is_converted_and_checked():
    source = KernelSource("k", "text", "c++", launch={"symbol": "fx_k", "pointers": 2, "size_symbols": ("s0",)})
    assert isinstance(source.launch, KernelLaunch)
    assert (source.launch.symbol, source.launch.pointers, source.launch.size_symbols) == ("fx_k", 2, ("s0",))
    with pytest.raises(TypeError, match=r"unknown launch metadata \['symbl'\]; valid: \[.*'symbol'.*extra="):
        KernelSource("k", "text", "c++", launch={"symbl": "fx_k"})
    assert KernelSource("k", "text", "c++").launch == KernelLaunch()


def test_fields_are_declared():
    launch = KernelLaunch(symbol="fx_k", extra={"tiles": 4})
    with pytest.raises(AttributeError):
        launch.symbl = "x"  # slots: no undeclared attribute
    with pytest.raises(KeyError, match="unknown launch metadata 'symbl'"):
        launch["symbl"]
    assert launch["symbol"] == "fx_k" and launch.get("config", ()) == () and launch.extra == {"tiles": 4}
    launch["config"] = (("XBLOCK", 64),)  # the dict form writes declared fields only
    assert launch.config == (("XBLOCK", 64),) and dict(launch.items())["config"] == (("XBLOCK", 64),)
    assert "symbol" in launch and "plan" not in launch
    as_dict = {**KernelLaunch(symbol="fx_k", pointers=1)}  # the dict form keeps empty tuples: a value
    assert as_dict["size_symbols"] == () and "plan" not in as_dict and "extra" not in as_dict
    with pytest.raises(KeyError, match="unknown launch metadata 'tiles'"):
        "tiles" in launch  # a target's own data is in launch.extra
    names = [f.name for f in dataclasses.fields(KernelLaunch)]
    assert len(names) == len(set(names)) and "extra" in names


def test_kernels_carry_the_record_and_pickle_it():
    old = Kernel("k", "src", "cpu", (KernelArg("x", "input"),), {"symbol": "fx_k", "pointers": 1})  # a saved dict
    assert isinstance(old.launch, KernelLaunch) and old.launch.symbol == "fx_k"
    again = pickle.loads(pickle.dumps(old.launch))
    assert again == old.launch and isinstance(again, KernelLaunch)
    with pytest.raises(TypeError, match="unknown launch metadata"):
        Kernel("k", "src", "cpu", (), {"threads": 4})


def test_every_built_in_kernel_has_a_typed_launch():
    x = torch.randn(9, 7)
    program = fxwrap.lower(lambda t: (t.sin() * 2).softmax(-1), x, target="cpu")
    torch.testing.assert_close(program.run(x), (x.sin() * 2).softmax(-1))
    kernels = [n.target for n in program.graph_module.graph.nodes if isinstance(n.target, fxwrap.Kernel)]
    assert kernels
    for kernel in kernels:
        assert isinstance(kernel.launch, KernelLaunch)
        assert kernel.launch.language == "c++" and kernel.launch.symbol and kernel.launch.pointers >= 2
        assert kernel.launch.parallel == "openmp"
