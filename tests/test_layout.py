"""The package layout: the top level holds the public entry points only."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_top_level_holds_the_entry_points_and_packages():
    modules = sorted(p.stem for p in (ROOT / "udpo").glob("*.py"))
    entries = [p for p in (ROOT / "udpo").iterdir() if (p / "__init__.py").is_file()]
    packages = sorted(p.name for p in entries if not p.is_symlink())
    links = sorted(p.name for p in entries if p.is_symlink())
    # threads and gpu_share: a process's share of the machine, read by the CLI before torch is imported
    assert modules == ["__init__", "api", "gpu_share", "pretrained", "threads"]
    assert packages == ["algorithms", "analysis", "cli", "config", "study", "training"]
    # env/ and rewards/ stay top-level folders of the repository; udpo/ reaches them through links
    assert links == ["env", "rewards"]
    assert all((ROOT / "udpo" / name).resolve() == ROOT / name for name in links)
