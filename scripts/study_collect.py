"""Collect a pinned study's finished run records into this checkout, naming the machine each ran on, and
commit each one as it is collected.

A pre-registered study runs from a worktree pinned to its commit (docs/lab/plan_debate_reward.md, section 9),
whose records land in that worktree's results folder; they are committed here, in main. The pinned code
may predate ``machine.json`` (:func:`udpo.study.record.machine_facts`): this script writes it beside a
record that lacks one, from the machine it runs on, or from ``--gpu`` / ``--cpu`` for records that were
trained elsewhere (a lent GPU's records come back as files). A record already here is left as it is;
with ``--backfill`` one without ``machine.json`` gets it (for records collected before the file existed,
when this machine is the one they ran on).

    python scripts/study_collect.py recipes/compare/debate_reward.yaml --from ../study_dr --commit
    python scripts/study_collect.py PLAN --from /path/to/gpu/out --gpu "NVIDIA H200" --cpu "..." --commit

``--from`` is a checkout (the plan's results folder is read below it) or a folder holding record folders
(``<method>_seed<s>/``) directly. Prints one line per record; exits 1 when a record is unfinished
(no ``run.json``) or differs from the one already here.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def record_folders(source: Path, results_dir: str) -> list[Path]:
    """The record folders under ``source``: ``<results_dir>/runs/*`` of a checkout (a relative
    ``results_dir``), else ``source/*``."""
    runs = source / results_dir / "runs"
    base = runs if not Path(results_dir).is_absolute() and runs.is_dir() else source
    return sorted(p for p in base.iterdir() if p.is_dir() and "_seed" in p.name)


def pinned_commit(source: Path) -> str | None:
    """The commit a checkout ``source`` is at (None for a plain folder)."""
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def same_record(a: Path, b: Path) -> bool:
    """Whether two record folders hold the same files with the same bytes (``machine.json`` aside)."""
    names = {p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}
    names.discard("machine.json")
    return all(
        (a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False) for n in names
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", help="the study plan (its results_dir names where records go)")
    p.add_argument(
        "--from", dest="source", required=True, help="pinned checkout, or a folder of record folders"
    )
    p.add_argument("--gpu", default=None, help="the GPU the records were trained on (default: none)")
    p.add_argument("--cpu", default=None, help="the CPU they were trained on (default: this machine's)")
    p.add_argument(
        "--backfill", action="store_true", help="write machine.json into records here that lack it"
    )
    p.add_argument("--commit", action="store_true", help="git commit each collected record")
    args = p.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from udpo.study.plan import load_plan
    from udpo.study.record import MACHINE, RUN, machine_facts

    config = load_plan(args.plan)
    target = config.results_path() / "runs"
    source = Path(args.source).resolve()
    if source == target.resolve():
        raise SystemExit(
            f"--from {args.source} is where the records go; name the pinned checkout or another folder"
        )
    pin = pinned_commit(source)
    status = 0
    for folder in record_folders(source, config.results_dir):
        here = target / folder.name
        if not (folder / RUN).is_file():
            print(f"{folder.name}: unfinished (no {RUN}); left")
            continue
        if here.is_dir():
            if not same_record(folder, here):
                print(f"{folder.name}: differs from the record already in {here}; left as it is")
                status = 1
                continue
            if (here / MACHINE).exists() or not args.backfill:
                continue
        else:
            shutil.copytree(folder, here)
        if not (here / MACHINE).exists():
            dtype = (json.loads((here / RUN).read_text()).get("config") or {}).get("dtype", "auto")
            facts = machine_facts(dtype, gpu=args.gpu)
            if args.cpu:
                facts["cpu"] = args.cpu
            facts["collected_from"] = f"{pin} (pinned checkout)" if pin else str(source)
            (here / MACHINE).write_text(json.dumps(facts, indent=1) + "\n")
        facts = json.loads((here / MACHINE).read_text())
        where = facts["gpu"] or f"{facts['cores']}-core {facts['cpu']}"
        print(f"{folder.name}: collected ({where}, {facts['dtype']})")
        if args.commit:
            subprocess.run(["git", "-C", str(ROOT), "add", str(here)], check=True)
            message = f"{config.results_path().name}: record of {folder.name}" + (
                f" (at {pin}" if pin else " ("
            )
            message += f", {where}, {facts['dtype']})"
            subprocess.run(
                ["git", "-C", str(ROOT), "commit", "-q", "-m", message, "--", str(here)], check=True
            )
    return status


if __name__ == "__main__":
    raise SystemExit(main())
