"""One source tree per process: ``udpo``, ``udpo.env`` and ``udpo.rewards`` from the same checkout.

An editable install (``pip install -e``) maps ``udpo.env`` and ``udpo.rewards`` to its own checkout's
``env/`` and ``rewards/`` whatever ``PYTHONPATH`` says. A second checkout (a study pinned to an older
commit, run with ``PYTHONPATH`` pointing at it) then runs its own ``udpo`` with the installed checkout's
``env`` and ``rewards``: newer or older backends and rewards than the commit it names, silently. The
commands refuse that mix before anything runs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(name: str) -> Path | None:
    """The folder ``name`` would be imported from (its parent package is imported, it is not)."""
    spec = importlib.util.find_spec(name)
    return None if spec is None or spec.origin is None else Path(spec.origin).parent


def check_one_source_tree() -> None:
    """Raise a RuntimeError when ``udpo.env`` or ``udpo.rewards`` come from another checkout than ``udpo``:
    each must sit inside ``udpo/`` (an installed wheel, or links) or beside it (this repository's layout)."""
    home = package_dir("udpo")
    if home is None:
        return
    for name in ("udpo.env", "udpo.rewards"):
        where = package_dir(name)
        if where is not None and where.parent not in (home, home.parent):
            raise RuntimeError(
                f"{name} is imported from {where} but udpo from {home}: two checkouts mixed (an editable "
                f"install maps {name} to its own checkout whatever PYTHONPATH says). Run from the installed "
                f"checkout, or link env/ and rewards/ into {home} (docs/study.md)"
            )
