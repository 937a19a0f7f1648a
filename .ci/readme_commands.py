"""The README's two commands (install + demo, install + tests), read from its first screen.

    python .ci/readme_commands.py                      # print them, one per line
    python .ci/readme_commands.py --check DEMO TESTS   # exit 1 unless they are exactly these

The commands are the first two fenced ``bash`` blocks of README.md, each a single line.
``.ci/run`` keeps its own copy of both and checks them here before it runs them, so a
README whose commands changed without CI (or the other way round) fails CI.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
FIRST_SCREEN_LINES = 40


def readme_commands(text: str) -> list[str]:
    """The first two ```bash blocks of the README's first screen, each one command line."""
    head = "\n".join(text.splitlines()[:FIRST_SCREEN_LINES])
    blocks = re.findall(r"^```bash\n(.*?)^```", head, flags=re.S | re.M)
    if len(blocks) < 2:
        raise SystemExit(f"{README}: expected two ```bash blocks in the first {FIRST_SCREEN_LINES} "
                         f"lines (install + demo, install + tests), found {len(blocks)}")
    commands = []
    for block in blocks[:2]:
        lines = [line for line in block.splitlines() if line.strip()]
        if len(lines) != 1:
            raise SystemExit(f"{README}: each command block must hold one command line, got {lines!r}")
        commands.append(lines[0])
    return commands


def main(argv: list[str]) -> int:
    commands = readme_commands(README.read_text())
    if not argv:
        print("\n".join(commands))
        return 0
    if argv[0] != "--check" or len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    ok = True
    for what, expected, actual in zip(("demo", "test"), argv[1:], commands):
        if expected != actual:
            ok = False
            print(f"CI's {what} command is not the README's:\n  CI:     {expected}\n  README: {actual}\n"
                  "Change both .ci/run and README.md together.", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
