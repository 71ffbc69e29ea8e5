"""The project's modules as they install: ``udpo/`` walked with its links ``udpo/env -> ../env`` and
``udpo/rewards -> ../rewards`` followed, so each file of ``env/`` and ``rewards/`` is read once, under the
name it is imported by. Pure file reads."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path) -> str:
    """``udpo/env/tasks/__init__.py`` -> ``udpo.env.tasks``, ``udpo/rewards/vote.py`` -> ``udpo.rewards.vote``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def python_files() -> dict[str, Path]:
    """Dotted module name -> its file (under ``udpo/``, through the links), for every module of the package."""
    files = {}
    for folder, dirs, names in os.walk(ROOT / "udpo", followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            path = Path(folder) / name
            files[module_name(path)] = path
    return files
