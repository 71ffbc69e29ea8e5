"""The code and the pages say what they refer to: no line of the packages, scripts, benchmarks, README or
docs/ (the lab, docs/lab/, included) cites a tracker's issue number or says which machine the project was
lent. The check is the ``git grep`` below, run on the checkout's tracked files; outside a git checkout it
is skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: what must not appear (git's extended regular expression, case-insensitive)
PATTERN = r"issue [0-9]+|lent (a|the|one) (GPU|machine)"
#: where (git pathspecs: ``docs/*.md`` matches docs/lab/ too)
WHERE = ("udpo", "env", "rewards", "scripts", "benchmarks", "docs/*.md", "README.md")


def git_grep(paths: tuple[str, ...], cwd: Path, *options: str) -> subprocess.CompletedProcess:
    """``git grep`` of :data:`PATTERN` in ``paths`` (line numbers; exit status 1 when nothing matched)."""
    return subprocess.run(
        ["git", "grep", *options, "-n", "-i", "-E", PATTERN, "--", *paths],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    inside = subprocess.run(
        ["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True, text=True
    )
    return inside.returncode == 0 and inside.stdout.strip() == "true"


@pytest.mark.skipif(not in_git_checkout(), reason="not a git checkout")
def test_no_line_cites_an_issue_number_or_a_lent_machine():
    found = git_grep(WHERE, ROOT)
    assert found.returncode in (0, 1), found.stderr  # 1: nothing matched; more: git failed
    assert not found.stdout, (
        "say what these refer to, not the issue that asked for it or the machine that was lent:\n"
        + found.stdout
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_check_finds_what_it_should(tmp_path):
    said = tmp_path / "said.md"
    said.write_text(
        "measured on the GPU lent in issue 42\nsee Issue 7\na GPU was lent: lent the machine\n"
        "fine: the issue's figures, issue-24's anchor, a lock lent to the tables\n"
    )
    found = git_grep((said.name,), tmp_path, "--no-index")
    assert found.returncode == 0, found.stderr
    assert [line.split(":")[1] for line in found.stdout.splitlines()] == ["1", "2", "3"]
