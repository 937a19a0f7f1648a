"""``Program.run(*fn_args)``: a lowered program called with the function's own arguments,
though its graph takes them in dynamo's order, with parameters and sizes lifted."""
import pytest
import torch

import fxwrap


def _w_first(x, w):
    return w * 2 + x.sin()  # dynamo meets w first: the graph takes (w, x)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("kernels", [False, True], ids=["extern", "kernels"])
def test_run_maps_arguments_in_the_functions_order(dynamic, kernels):
    x, w = torch.randn(6), torch.randn(6)
    program = fxwrap.lower(_w_first, x, w, dynamic=dynamic, options={"kernels": kernels})
    assert [s[:2] for s in program.arguments.sources if s[0] == "arg"] == [("arg", 1), ("arg", 0)]
    x2, w2 = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(program.run(x2, w2), _w_first(x2, w2))
    # the graph itself takes (w, x): given the function's order it computes something else
    assert not torch.allclose(program.run(w2, x2), _w_first(x2, w2))
    if dynamic:
        x3, w3 = torch.randn(11), torch.randn(11)
        torch.testing.assert_close(program.run(x3, w3), _w_first(x3, w3))


def test_module_parameters_are_filled_in_and_training_forward_maps_too():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    program = fxwrap.lower(model, torch.randn(5, 8))
    kinds = [s[0] for s in program.arguments.sources]
    assert kinds.count("const") == 4 and kinds.count("arg") == 1
    x = torch.randn(5, 8)
    torch.testing.assert_close(program.run(x), model(x), rtol=1e-4, atol=1e-5)
    training = fxwrap.lower(model, torch.randn(5, 8, requires_grad=True), training=True)
    torch.testing.assert_close(training.forward.run(x), model(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="backward program has no argument map"):
        training.backward.run(x)


@pytest.mark.parametrize("kernels", [False, True], ids=["extern", "kernels"])
def test_none_for_a_tensor_argument_is_an_input_mismatch(kernels):
    program = fxwrap.lower(lambda x: x.sin() * 2, torch.randn(4), options={"kernels": kernels})
    with pytest.raises(fxwrap.InputMismatchError, match=r"argument 0\) is None.*pass a tensor"):
        program.run(None)
    x = torch.randn(4)
    torch.testing.assert_close(program.run(x), x.sin() * 2)


def _sgd(params, grads):
    for p, g in zip(params, grads):
        p.add_(g, alpha=-0.1)


@pytest.mark.parametrize("kernels", [False, True], ids=["extern", "kernels"])
def test_tensors_in_list_arguments_are_the_calls_not_the_examples(kernels):
    """An optimizer step lowered with lists of tensors: ``run`` reads and updates the lists it is
    given (the examples were graph constants: the step wrote into them instead)."""
    params, grads = [torch.randn(5), torch.randn(3)], [torch.randn(5), torch.randn(3)]
    program = fxwrap.lower(_sgd, params, grads, options={"kernels": kernels})
    assert {s[0] for s in program.arguments.sources} == {"item"}
    before = [p.clone() for p in params]
    mine = [torch.randn(5), torch.randn(3)]
    expected = [p - 0.1 * g for p, g in zip(mine, grads)]
    program.run(mine, grads)
    for got, want in zip(mine, expected):
        torch.testing.assert_close(got, want)
    for p, b in zip(params, before):  # the examples are left alone
        torch.testing.assert_close(p, b)
    with pytest.raises(fxwrap.InputMismatchError, match=r"params \(argument 0\) must be a list"):
        program.run([torch.randn(5)], grads)
