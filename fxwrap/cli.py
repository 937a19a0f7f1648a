"""``python -m fxwrap demo``, ``fxwrap targets`` and ``fxwrap fuzz``: the command line."""
from __future__ import annotations

import argparse
import os
import sys
import time

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


def fuzz(args) -> int:
    """Check random programs against eager on a target; exit status 1 where any failed."""
    if args.target == "triton-interpret":
        # some Triton releases (3.6) interpret kernels only when this is set before triton is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from fxwrap.testing.fuzz import fuzz as run_fuzz

    stop_at = time.time() + args.time_limit if args.time_limit is not None else None
    summary = run_fuzz(args.target, programs=args.programs, seed=args.seed, out=args.out,
                       bad_inputs_every=args.bad_inputs_every, log=None if args.quiet else print,
                       jobs=args.jobs, stop_at=stop_at, warnings_shown=not args.quiet)
    print(summary.report())
    return 0 if summary.ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fxwrap", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="lower an MLP (forward + backward), print IR and FX, check vs eager")
    p.add_argument("--target", default=None, help="target name (default: from the device)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(fn=demo)
    p = sub.add_parser("fuzz", help="check seeded random programs against eager on a target; "
                       "failures become standalone reproducer files")
    p.add_argument("--target", default="cpu", help="target name, a plugin's included (default: cpu)")
    p.add_argument("--programs", type=int, default=100, help="how many programs (default: 100)")
    p.add_argument("--seed", type=int, default=0, help="the first program's seed; program i is seed + i")
    p.add_argument("--out", default="fuzz-out", help="directory for reproducers (default: fuzz-out)")
    p.add_argument("--bad-inputs-every", type=int, default=10, metavar="N",
                   help="feed every N-th program wrong inputs too, lowered and loaded (0: never; default 10)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default: 1)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="start no program after this many seconds; the summary says how many ran")
    p.add_argument("--quiet", action="store_true", help="print the summary only (no progress lines, no warnings of the programs)")
    p.set_defaults(fn=fuzz)
    p = sub.add_parser("targets", help="list registered targets")
    p.set_defaults(fn=show)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
