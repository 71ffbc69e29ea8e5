"""Collect a pinned study's finished run records into this checkout, naming the machine each ran on, and
commit each one as it is collected.

A pre-registered study runs from a worktree pinned to its commit (docs/lab/plan_debate_reward.md, section 9),
whose records land in that worktree's results folder; they are committed here, in main. The pinned code
may predate ``machine.json`` (:func:`udpo.study.record.machine_facts`): this script writes it beside a
record that lacks one, from the machine it runs on, or from ``--gpu`` / ``--cpu`` for records that were
trained elsewhere (a GPU machine's records copied back as files). A record already here is left as it is;
with ``--backfill`` one without ``machine.json`` gets it (for records collected before the file existed,
when this machine is the one they ran on).

    python scripts/study_collect.py recipes/compare/debate_reward.yaml --from ../study_dr --commit
    python scripts/study_collect.py PLAN --from /path/to/gpu/out --gpu "NVIDIA H200" --cpu "..." --commit

``--from`` is a checkout (the plan's results folder is read below it) or a folder holding record folders
(``<method>_seed<s>/``) directly. Prints one line per record; leaves an unfinished one (no ``run.json``);
exits 1 when a record differs from the one already here. The collecting itself is
:func:`udpo.study.collect.collect_records`; this script commits what it collected, one commit a record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from udpo.study.collect import Collected

ROOT = Path(__file__).resolve().parents[1]


def pinned_commit(source: Path) -> str | None:
    """The commit a checkout ``source`` is at (None for a plain folder)."""
    done = subprocess.run(
        ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() if done.returncode == 0 else None


def commit_record(record: Collected, *, study: str, pin: str | None) -> None:
    """One commit, in the checkout holding the record, of that record alone: "<study>: record of <run> (at
    <pin>, <machine>, <dtype>)"."""
    assert record.folder is not None
    at = f"at {pin[:7]}, " if pin else ""
    message = f"{study}: record of {record.name} ({at}{record.where}, {record.dtype})"
    git = ["git", "-C", str(record.folder)]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message, "--", "."], check=True)
    print(f"{record.name}: committed: {message}")


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
    from udpo.study.collect import collect_records
    from udpo.study.plan import load_plan

    config = load_plan(args.plan)
    target = config.results_path() / "runs"
    source = Path(args.source).resolve()
    if source == target.resolve():
        raise SystemExit(
            f"--from {args.source} is where the records go; name the pinned checkout or another folder"
        )
    pin = pinned_commit(source)
    runs = source / config.results_dir / "runs"
    outcomes = collect_records(
        runs if not Path(config.results_dir).is_absolute() and runs.is_dir() else source,
        target,
        collected_from=f"{pin} (pinned checkout)" if pin else str(source),
        gpu=args.gpu,
        cpu=args.cpu,
        backfill=args.backfill,
    )
    if args.commit:
        for record in outcomes:
            if record.outcome == "collected":
                commit_record(record, study=config.results_path().name, pin=pin)
    return 1 if any(o.outcome == "differs" for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
