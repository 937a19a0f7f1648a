"""``python -m fxwrap demo`` and ``fxwrap targets``: the command line."""
from __future__ import annotations

import argparse
import sys

import torch


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))


def demo(args) -> int:
    """Lower a small MLP and its backward, print the IR and FX code, check vs eager."""
    import fxwrap

    model = _mlp().to(args.device)
    x = torch.randn(16, 32, device=args.device)
    programs = fxwrap.lower(lambda inp: model(inp), x, training=True, target=args.target)
    ok = True
    for kind, program in (("forward", programs.forward), ("backward", programs.backward)):
        print(f"===== {kind}: Wrapper IR (target {program.target.name}) =====")
        print(program.code())
        print(f"===== {kind}: FX GraphModule =====")
        print(program.graph_module.code)
        print(f"planned peak: {program.peak_bytes} bytes "
              f"(without reuse {program.memory.peak_bytes_frees_only}, "
              f"without planning {program.memory.peak_bytes_unplanned})\n")

    model.zero_grad(set_to_none=True)  # lower() ran one backward already
    compiled = fxwrap.compile(model, target=args.target)
    ref_model = _mlp().to(args.device)
    xs = torch.randn(16, 32, device=args.device)
    out, ref = compiled(xs), ref_model(xs)
    out.sum().backward()
    ref.sum().backward()
    checks = [("forward", out, ref)]
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        checks.append((f"grad {name}", p.grad, q.grad))
    for name, got, want in checks:
        err = (got - want).abs().max().item()
        good = torch.allclose(got, want, rtol=1e-4, atol=1e-5)
        ok &= good
        print(f"check {name:>14}: max abs error {err:.2e}  {'OK' if good else 'MISMATCH'}")
    print("demo: fxwrap matches eager" if ok else "demo: MISMATCH against eager")
    return 0 if ok else 1


def show(args) -> int:
    """Print the registered targets."""
    import fxwrap

    manager = fxwrap.get_plugin_manager()
    width = max((len(name) for name in manager.targets), default=0) + 1
    for name, target in sorted(manager.targets.items()):
        print(f"{name:{width}} device={target.device_type:8} emitter={target.emitter.__name__:20} "
              f"wrapper={target.wrapper.__name__:20} from {manager.owner[name]}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fxwrap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="lower an MLP (forward + backward), print IR and FX, check vs eager")
    p.add_argument("--target", default=None, help="target name (default: from the device)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(fn=demo)
    p = sub.add_parser("targets", help="list registered targets")
    p.set_defaults(fn=show)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
