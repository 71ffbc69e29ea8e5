"""Training curves of one method's seeds in an `udpo compare` folder: reward, training accuracy and the
unparsed rate of the training debates, as means of 10 iterations (`metrics.jsonl`, kind "train").

    python scripts/prereg_curves.py COMPARE_DIR OUT.png [--method udpo]

Used for the pre-registered study's figures (docs/lab/results.md); the test-set numbers are compare's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

from udpo.env.run_folder import RunFolder

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVES = (
    ("reward/mean", "reward (mean over agents)"),
    ("train/accuracy", "training accuracy"),
    ("train/unparsed_rate", "unparsed answers"),
)
WINDOW = 10


def train_rows(run: Path) -> list[dict]:
    lines = RunFolder(run).metrics.read_text().splitlines()
    return [r for r in map(json.loads, filter(str.strip, lines)) if r.get("kind") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("compare_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--method", default="udpo")
    args = parser.parse_args()
    runs = sorted((args.compare_dir / args.method).glob("seed_*"), key=lambda p: int(p.name.split("_")[1]))
    if not runs:
        raise SystemExit(f"no {args.method}/seed_* runs in {args.compare_dir}")
    fig, axes = plt.subplots(1, len(CURVES), figsize=(13, 3.6))
    for run in runs:
        rows = train_rows(run)
        n = len(rows) // WINDOW
        for ax, (key, title) in zip(axes, CURVES, strict=True):
            means = [sum(r[key] for r in rows[WINDOW * i : WINDOW * (i + 1)]) / WINDOW for i in range(n)]
            ax.plot([WINDOW * (i + 1) for i in range(n)], means, marker="o", label=run.name.replace("_", " "))
            ax.set_title(title)
            ax.set_xlabel(f"iteration (mean of the {WINDOW} up to it)")
    axes[0].legend()
    fig.suptitle(f"{args.method}: training debates of each seed (not the test set)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
