"""Before/after comparison of training runs on their held-out evaluation: paired bootstrap intervals
and learning curves.

    python scripts/learning_study.py runs/study/seed0 runs/study/seed1 --out docs/lab/results

Each run folder holds ``eval/iter_000000`` (the untrained team) and later ``eval/iter_<k>`` folders on
the same questions, sampled with the same ``eval_seed``, and ``metrics.jsonl``. The "after" evaluation
is the last one every run has. Per question the script takes correctness, U_intra, U_inter, U_sys and
the share of unparsed answers, and reports the mean change with a 95% bootstrap interval that resamples
questions (``udpo.study.intervals.paired_bootstrap``), per run and over all runs (runs drawn with
different seeds evaluate different questions; each is then resampled on its own). Writes
``OUT/results.json``, ``OUT/learning_curves.png`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from udpo.analysis.results import PER_QUESTION_METRICS, eval_iterations, per_question
from udpo.study.intervals import paired_bootstrap
from udpo.training.tracking import read_metrics

CURVES = {
    "reward terms (mean over agents)": [
        "reward/mean",
        "reward/r_task",
        "reward/r_intra",
        "reward/r_inter",
        "reward/r_sys",
    ],
    "KL to the reference (update/kl)": ["update/kl"],
    "share of samples outside the trust region (update/clip_frac)": ["update/clip_frac"],
}


def compare(runs: list[Path]) -> dict:
    """The paired changes of every metric between iteration 0 and the last evaluation all runs have.

    Each run pairs its own questions; when every run evaluated the same questions the bootstrap draws
    them together, otherwise it resamples each run's questions on their own."""
    last = min(max(eval_iterations(r)) for r in runs)
    pairs = [(per_question(r, 0), per_question(r, last)) for r in runs]
    ids = [sorted(set(b) & set(a)) for b, a in pairs]
    if not all(ids):
        raise SystemExit("a run's evaluations before and after share no question")
    shared = all(i == ids[0] for i in ids)
    out = {"after_iteration": last, "runs": [str(r) for r in runs], "shared_questions": shared, "metrics": {}}
    for m in PER_QUESTION_METRICS:
        b = [[before[q][m] for q in qs] for (before, _), qs in zip(pairs, ids, strict=True)]
        a = [[after[q][m] for q in qs] for (_, after), qs in zip(pairs, ids, strict=True)]
        change = paired_bootstrap(b, a, shared_questions=shared).to_dict()
        change["per_seed"] = [
            {"before": float(np.mean(x)), "after": float(np.mean(y)), **paired_bootstrap(x, y).to_dict()}
            for x, y in zip(b, a, strict=True)
        ]
        out["metrics"][m] = change
    return out


def plot(runs: list[Path], path: Path) -> None:
    """Training curves (a colour per metric, a line style per run) and held-out accuracy per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    styles = ["-", "--", ":", "-."]
    for k, run in enumerate(runs):
        style = styles[k % len(styles)]
        train = read_metrics(run, kind="train")
        evals = read_metrics(run, kind="eval")
        x = [r["iteration"] for r in train]
        for ax, (title, keys) in zip(axes.flat, CURVES.items(), strict=False):
            for c, key in enumerate(keys):
                y = np.array([r.get(key, np.nan) for r in train], dtype=float)
                smooth = np.convolve(y, np.ones(5) / 5, mode="valid") if len(y) >= 5 else y
                label = f"{key.split('/')[-1]} ({run.name})" if len(keys) > 1 else run.name
                ax.plot(x[len(x) - len(smooth) :], smooth, style, color=f"C{c}", label=label)
            ax.set_title(title + ", 5-iteration mean", fontsize=10)
        ax = axes.flat[3]
        ax.plot([r["iteration"] for r in evals], [r["accuracy"] for r in evals], "o" + style, label=run.name)
        ax.set_title("held-out accuracy (same questions before and after)", fontsize=10)
    for ax in axes.flat:
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result: dict) -> str:
    lines = [
        f"| metric (after iteration {result['after_iteration']}) | before | after | change [95% CI] | per run: before -> after (change [95% CI]) |",
        "|---|---|---|---|---|",
    ]
    for m, c in result["metrics"].items():
        seeds = "; ".join(
            f"{s['before']:.3f} -> {s['after']:.3f} ({s['delta']:+.3f} [{s['low']:+.3f}, {s['high']:+.3f}])"
            for s in c["per_seed"]
        )
        lines.append(
            f"| {m} | {c['before']:.3f} | {c['after']:.3f} | {c['delta']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] "
            f"| {seeds} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders of train_udpo.py (one per training seed)")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json and learning_curves.png")
    args = p.parse_args(argv)
    result = compare(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(args.runs, args.out / "learning_curves.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
