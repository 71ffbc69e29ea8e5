"""Every script under benchmarks/ still imports against the current package and parses its options.

The benchmarks are run by hand (docs record their output), so nothing else notices when a rename leaves
one behind: each is started with ``--help``, FutureWarnings turned into errors (slow: a process each).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_there_are_benchmarks():
    assert len(SCRIPTS) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_benchmark_starts(script):
    done = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
