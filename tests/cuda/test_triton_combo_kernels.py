"""Combo kernels on the Triton target (``targets/cuda_triton/combo.py``): independent 1-D
pointwise kernels of different sizes in one launch, each program dispatched to its member
by id.  On a GPU (``cuda``), or under Triton's CPU interpreter (``triton-interpret``)."""
from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo

import fxwrap
from combo_cases import few_kernels_a_step, foreach_lists, no_combo_kernels, one_kernel_a_parameter
from fxwrap.targets.cuda_triton.emitter import TritonEmitter
from shared_helpers import kernels

CUDA = torch.cuda.is_available()
TARGET = "cuda" if CUDA else "triton-interpret"
DEVICE = "cuda" if CUDA else "cpu"
LIMITS = TritonEmitter.combo_kernels


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
def test_optimizer_step_as_eager_in_few_kernels(optimizer, foreach):
    launched = few_kernels_a_step(TARGET, DEVICE, TritonEmitter, optimizer, foreach)
    combos = [k for k in launched if k.launch.plan == "combo"]
    assert combos and all("tl.program_id(0)" in k.source and "elif pid <" in k.source for k in combos)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
def test_foreach_step_one_loop_nest_a_parameter(optimizer):
    """Each tensor's update is one member (nothing but the step counts allocated), and the
    whole step fits one combo kernel and the step counts' copy."""
    launched, _ = one_kernel_a_parameter(TARGET, DEVICE, optimizer)
    assert len(launched) <= 2, [k.name for k in launched]


def test_foreach_lists_in_ceil_n_over_limit_launches():
    got, expected, launched = foreach_lists(TARGET, DEVICE, count=40)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    per_kernel = min(LIMITS.max_members, LIMITS.max_arguments // 4)  # 4 arguments a size
    assert len(launched) <= math.ceil(40 / per_kernel), [k.name for k in launched]
    with no_combo_kernels(TritonEmitter):
        _, _, separate = foreach_lists(TARGET, DEVICE, count=40)
    assert len(separate) == 40


def test_symbolic_sizes_launch_each_kernel():
    """A member's element count must be known to share out the programs: with symbolic sizes
    the kernels run one by one, with eager's numbers."""
    got, expected, launched = foreach_lists(TARGET, DEVICE, count=4, dynamic=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)
    assert launched and not any(k.launch.plan == "combo" for k in launched)


def test_write_after_read_stays_apart():
    """Programs of one launch run at once: a kernel writing ``x`` must not share a launch with
    one reading it elsewhere."""
    torch._dynamo.reset()
    x, y = torch.randn(64, 33, device=DEVICE), torch.randn(50, device=DEVICE)

    def fn(x, y):
        u = x.reshape(-1)[7:57] * y
        x.mul_(3)
        return u

    x_ref = x.clone()
    programs: list = []
    u = torch.compile(fn, backend=fxwrap.Backend(TARGET, {"on_program": programs.append, "cache": False}))(x, y)
    torch.testing.assert_close(u, x_ref.reshape(-1)[7:57] * y)
    torch.testing.assert_close(x, x_ref * 3)
    assert not any(k.launch.plan == "combo" for k in kernels(programs))


def test_a_member_checking_its_indices_compiles_the_combo_with_the_asserts(monkeypatch):
    """Gathers whose indices are checked in the kernel (``_fx_index_check``: ``tl.device_assert``)
    need ``debug`` on: a combo with such a member carries ``INDEX_CHECK_OPTIONS``."""
    import dataclasses

    from fxwrap.plugins.session import CompileSession
    from fxwrap.targets.cuda_triton import ops as O
    if not CUDA:  # what a CUDA device declares
        original = CompileSession.capabilities
        monkeypatch.setattr(CompileSession, "capabilities", property(
            lambda self: dataclasses.replace(original.fget(self), index_checks="in_kernel")))
    gen = torch.Generator().manual_seed(4)
    x, y = torch.randn(108, generator=gen).to(DEVICE), torch.randn(40, generator=gen).to(DEVICE)
    rows, picks = (torch.randint(0, 108, (6,), generator=gen).to(DEVICE),
                   torch.randint(0, 40, (17,), generator=gen).to(DEVICE))

    def fn(x, y, rows, picks):
        return x[rows] * 2, y[picks] + 1

    torch._dynamo.reset()
    program = fxwrap.lower(fn, x, y, rows, picks, target=TARGET)
    for got, want in zip(program.run(x, y, rows, picks), fn(x, y, rows, picks)):
        torch.testing.assert_close(got, want)
    combos = [k for k in kernels([program]) if k.launch.plan == "combo"]
    assert len(combos) == 1 and "_fx_index_check(" in combos[0].source
    assert all(option in combos[0].launch.config for option in O.INDEX_CHECK_OPTIONS)


@pytest.mark.parametrize("xblock", [8, 64, 1024])
def test_one_source_serves_every_block_size(xblock):
    """The members' block counts are ``XBLOCK`` arithmetic in the kernel and in the grid: the
    combo's source runs with any config (the one autotuning picks), every element once."""
    gen = torch.Generator().manual_seed(5)
    x, y, z, s = (torch.randn(s, generator=gen).to(DEVICE) for s in [(7, 3), (1100,), (300,), ()])
    ws = [torch.randn(40, generator=gen).to(DEVICE) for _ in range(6)]  # one member of 12 buffers

    def fn(x, y, z, s, *ws):
        return (x.sin() * 2, y.exp() + 1, z.abs() - 3, s * 5, *(w - 1 for w in ws))

    torch._dynamo.reset()
    program = fxwrap.lower(fn, x, y, z, s, *ws, target=TARGET)
    (combo,) = [k for k in kernels([program]) if k.launch.plan == "combo"]
    emitter = TritonEmitter()
    launch = combo.launch.replace(config=(("XBLOCK", xblock), ("num_warps", 1 if xblock < 128 else 4)))
    device = torch.device("cuda", torch.cuda.current_device()) if CUDA else None
    combo.bind(emitter._bind(combo.source, launch, device))
    for got, want in zip(program.run(x, y, z, s, *ws), fn(x, y, z, s, *ws)):
        torch.testing.assert_close(got, want)


def test_wide_and_tiny_members_run_narrower_blocks():
    """One kernel holds the registers of its widest member: six tensors of one size fused side
    by side (12 buffers) run half-width blocks, a 0-d value one element, a plain member the
    combo's ``XBLOCK`` (``member_blocks``; cuda-offline, no GPU needed)."""
    from fxwrap.testing.offline_cuda import offline_programs

    def fn(x, s, *ys):
        return (x * 2, s + 1, *(y * 3 for y in ys))

    (program,) = offline_programs(fn, torch.randn(1024, 768), torch.randn(()), *(torch.randn(768) for _ in range(6)))
    (combo,) = [k for k in kernels([program]) if k.launch.plan == "combo"]
    calls = [line.strip() for line in combo.source.splitlines() if line.strip().startswith(f"{combo.name}_m")]
    widths = sorted(call.rsplit(", ", 1)[1] for call in calls)
    assert widths == ["((XBLOCK + 1) // 2))", "((XBLOCK + 1023) // 1024))", "XBLOCK)"], calls


def test_gpu_plans_offer_the_tuning_configs():
    """As the ``cuda`` target renders them (no GPU needed): a combo of many elements carries
    ``COMBO_TUNE_CONFIGS`` (its first config among them), a small one its first config only."""
    from fxwrap.targets.cuda_triton.combo import COMBO_TUNE_CONFIGS
    from fxwrap.testing.offline_cuda import offline_programs

    def fn(x, y):
        return x * 2, y + 1

    for rows, expected in ((1024, len(COMBO_TUNE_CONFIGS)), (4, 1)):
        (program,) = offline_programs(fn, torch.randn(rows, 768), torch.randn(3 * 768))
        (combo,) = [k for k in kernels([program]) if k.launch.plan == "combo"]
        assert len(combo.launch.configs) == expected and combo.launch.config == combo.launch.configs[0]
        assert (("XBLOCK", 1024), ("num_warps", 4)) == combo.launch.config


@pytest.mark.skipif(not CUDA, reason="configs are timed on a GPU only (the interpreter runs the first)")
def test_large_combo_is_autotuned():
    """A combo of many elements times ``combo_configs``' candidates and keeps the fastest."""
    from fxwrap.targets.cuda_triton.combo import COMBO_TUNE_CONFIGS
    gen = torch.Generator().manual_seed(6)
    x, y = torch.randn(1024, 768, generator=gen).to(DEVICE), torch.randn(3 * 768, generator=gen).to(DEVICE)

    def fn(x, y):
        return x * 2, y + 1

    torch._dynamo.reset()
    program = fxwrap.lower(fn, x, y, target=TARGET)
    for got, want in zip(program.run(x, y), fn(x, y)):
        torch.testing.assert_close(got, want)
    (combo,) = [k for k in kernels([program]) if k.launch.plan == "combo"]
    assert len(combo.launch.configs) == len(COMBO_TUNE_CONFIGS)  # the first is one of them
    assert combo.launch.autotuned and len(combo.launch.timings_ms) == len(COMBO_TUNE_CONFIGS)
