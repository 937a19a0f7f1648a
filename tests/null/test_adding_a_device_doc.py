"""docs/adding-a-device.md shows real output: its ``python -m fxwrap targets`` listing."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-device.md"


def test_the_targets_listing_in_the_doc_is_what_the_command_prints():
    pytest.importorskip("fxwrap_arena", reason="the listing shows examples/fxwrap-arena installed")
    block = re.search(r"```\n\$ python -m fxwrap targets\n(.*?)```", DOC.read_text(), re.S)
    shown = [line.split() for line in block.group(1).splitlines() if line.strip()]
    out = subprocess.run([sys.executable, "-m", "fxwrap", "targets"], capture_output=True, text=True,
                         check=True).stdout
    printed = [line.split() for line in out.splitlines() if line.strip()]
    assert shown and all(row in printed for row in shown), (shown, printed)
