"""``udpo report``: one self-contained HTML page to browse a run's debates (or two runs' side by side)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write one HTML page to browse a run's debates",
        description="Write one self-contained HTML page (no server, no network) for a debate run, an evaluation "
        "folder, a training run, an `udpo eval` attack run or a folder of runs: accuracy, U_intra, U_inter, U_sys "
        "and the unparsed rate; a training run's curves and calibration; every debate as a coloured agents x "
        "rounds grid with each turn's text on demand, filterable and sortable. With two runs, the debates of "
        "the same questions side by side, the changed outcomes first.",
    )
    p.add_argument("run", metavar="RUN_DIR", help="run folder (or a trajectories .jsonl file)")
    p.add_argument("run_b", nargs="?", metavar="RUN_DIR_B", help="a second run to compare with the first")
    p.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html)")
    p.add_argument("--lam", type=float, default=0.5, help="weight of the flip rate in U_intra (default: 0.5)")
    p.set_defaults(func=run, check=check_args, uses_torch=False)


def check_args(args: argparse.Namespace) -> list[Path]:
    """The run paths, checked before anything is read (errors name the path)."""
    paths = [Path(p) for p in (args.run, args.run_b) if p is not None]
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"no run folder or trajectory file at {path}")
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'report.html'}")
    if not 0.0 <= args.lam <= 1.0:
        raise ValueError(f"--lam must be within [0, 1], got {args.lam}")
    return paths


def run(args: argparse.Namespace) -> int:
    paths = check_args(args)
    from udpo.analysis.report import write_report

    out, runs = write_report(paths, args.out, lam=args.lam)
    for r in runs:
        n = sum(len(s.debates) for s in r.sets)
        print(f"{r.label}: {r.kind}, {len(r.sets)} debate set(s), {n} debates")
    print(f"wrote {out} (open {out.resolve().as_uri()})")
    return 0
