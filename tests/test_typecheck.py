"""The type checker sees every layer: mypy, run with the project's config on a probe module,
reports each wrongly-typed value that crosses a layer boundary and reveals the real types."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "typing" / "probe_layers.py"


def _expected(marker: str) -> dict[int, str]:
    lines = PROBE.read_text().splitlines()
    return {
        n: m.group(1)
        for n, line in enumerate(lines, 1)
        if (m := re.search(rf"# {marker}: (\S+)$", line))
    }


def test_mypy_reports_every_wrong_type_across_the_layers() -> None:
    # The package's own cache (``make typecheck`` runs first in ``make test``) keeps this quick;
    # one process: mypy's build workers can fail to start beside a busy lane
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", "--num-workers", "0",
         str(PROBE)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    errors = {
        int(n): code
        for n, code in re.findall(r"probe_layers\.py:(\d+): error: .*\[(\S+)\]", out.stdout)
    }
    reveals = re.findall(r'probe_layers\.py:(\d+): note: Revealed type is "(.*)"', out.stdout)
    revealed = {int(n): t for n, t in reveals}
    assert errors == _expected("E"), out.stdout
    for line, name in _expected("R").items():
        assert name in revealed.get(line, ""), f"line {line}: {revealed.get(line)} (not {name})"
        assert revealed[line] != "Any"
