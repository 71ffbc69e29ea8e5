"""Collecting finished run records into the checkout that commits them.

A pre-registered study runs from a worktree pinned to its commit (docs/study.md, "A study pinned to a
commit"), or elsewhere, and its records are committed in the main checkout. :func:`collect_records` copies
a finished record (``run.json`` present) that is new here and writes its ``machine.json`` when it has
none; one already here is kept as it is, and reported when its bytes differ (the same run trained twice:
the first record stands). It returns what became of each record; committing them is the caller's
(``scripts/study_collect.py --commit``).
"""

from __future__ import annotations

import filecmp
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from udpo.study.record import MACHINE, RUN, machine_facts

#: what became of one record: copied here, here already (same bytes), here already with other bytes,
#: unfinished (no run.json)
OUTCOMES = ("collected", "present", "differs", "unfinished")


@dataclass(frozen=True)
class Collected:
    """One record's outcome (one of :data:`OUTCOMES`) and, when collected, its folder here, the line naming
    its machine and its resolved dtype (from its ``machine.json``)."""

    name: str
    outcome: str
    where: str = ""
    folder: Path | None = None
    dtype: str | None = None


def record_folders(source: Path) -> list[Path]:
    """The record folders (``<method>_seed<s>``) directly inside ``source``."""
    return sorted(p for p in source.iterdir() if p.is_dir() and "_seed" in p.name)


def same_record(a: Path, b: Path) -> bool:
    """Whether two record folders hold the same files with the same bytes (``machine.json`` aside)."""
    names = {p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}
    names.discard(MACHINE)
    return all(
        (a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False) for n in names
    )


def machine_line(facts: dict) -> str:
    """The machine of a ``machine.json``: the GPU's name, else ``<cores>-core <CPU>``."""
    return facts.get("gpu") or f"{facts.get('cores')}-core {facts.get('cpu')}"


def collect_records(
    source: Path,
    target: Path,
    *,
    collected_from: str = "",
    gpu: str | None = None,
    cpu: str | None = None,
    backfill: bool = False,
) -> list[Collected]:
    """Collect each record folder of ``source`` into ``target`` (a results folder's ``runs/``) and print a
    line for each.

    A record without ``machine.json`` gets one from this machine (``gpu`` and ``cpu`` name another one,
    for records trained elsewhere; ``collected_from`` says where it came from); with ``backfill`` a record
    already here without one gets it too."""
    outcomes = []
    for folder in record_folders(source):
        name, here = folder.name, target / folder.name
        if not (folder / RUN).is_file():
            print(f"{name}: unfinished (no {RUN}); left")
            outcomes.append(Collected(name, "unfinished"))
            continue
        if here.is_dir() and not same_record(folder, here):
            print(f"{name}: differs from the record already in {here}; the first one stays")
            outcomes.append(Collected(name, "differs"))
        elif here.is_dir() and ((here / MACHINE).exists() or not backfill):
            outcomes.append(Collected(name, "present"))
        else:
            if not here.is_dir():
                shutil.copytree(folder, here)
            if not (here / MACHINE).exists():
                dtype = (json.loads((here / RUN).read_text()).get("config") or {}).get("dtype", "auto")
                facts = machine_facts(dtype, gpu=gpu)
                if cpu:
                    facts["cpu"] = cpu
                facts["collected_from"] = collected_from or str(source)
                (here / MACHINE).write_text(json.dumps(facts, indent=1) + "\n")
            facts = json.loads((here / MACHINE).read_text())
            where = machine_line(facts)
            print(f"{name}: collected ({where}, {facts.get('dtype')})")
            outcomes.append(Collected(name, "collected", where, here, facts.get("dtype")))
    return outcomes
