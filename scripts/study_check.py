"""The pre-run check of a study plan: the untrained team debates training-split questions exactly as the
plan's runs would (recipe, settings, task options, profiles, sampling, dtype), and the check reports what
the plan must show before its first run: the team's accuracy (with a 95% Wilson interval, per level where
the task has levels), the share of answers cut by ``max_tokens`` and the accuracy of finished and cut
answers (:mod:`udpo.study.cut`), the unparsed share, and the CPU time a debate took. One debate a question:
``udpo study PLAN --check`` debates each several times and measures the headroom a plan needs
(:mod:`udpo.study.headroom`).

    python scripts/study_check.py recipes/compare/debate_reward.yaml --questions 90 --seed 100 \\
        --accuracy 0.35 0.65 --max-cut 0.10 --out docs/lab/results/debate_reward/check

``--set KEY=VALUE`` overrides a training setting (YAML value) to try a variant; the plan's own check runs
without it. Only training-split questions are debated, never the held-out ones. Writes ``OUT/check.json``
and ``OUT/check.md`` and exits 1 when a stated bound is missed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

import yaml


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (centre - half, centre + half)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", help="the study plan (recipes/compare/*.yaml)")
    p.add_argument("--questions", type=int, default=90, help="training-split questions to debate")
    p.add_argument("--seed", type=int, default=100, help="draws the questions and seeds the sampling")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting to try")
    p.add_argument("--accuracy", type=float, nargs=2, metavar=("LOW", "HIGH"), help="team accuracy bounds")
    p.add_argument("--max-cut", type=float, help="the largest share of answers cut by max_tokens")
    p.add_argument("--out", type=Path, help="folder for check.json and check.md")
    p.add_argument("--show-cut", type=int, default=0, metavar="K", help="print K cut answers (to stderr)")
    args = p.parse_args(argv)

    from udpo.config.groups import mapping
    from udpo.env.backends.machine import describe_numeric_path
    from udpo.env.tasks import get_task
    from udpo.study import CompareConfig
    from udpo.study.cut import cut_summary
    from udpo.study.headroom import debate_untrained
    from udpo.threads import configure_threads

    threads = configure_threads()
    plan = CompareConfig.load(args.plan)
    config = plan.train_config(plan.trained()[0], args.seed)
    overrides = dict(item.split("=", 1) for item in args.set)
    for key, text in overrides.items():
        setattr(config, key, yaml.safe_load(text))
    config.__post_init__()  # the settings checked together again, as training checks them

    task = get_task(config.task, **mapping(config.task_options))
    questions = task.load(config.train_split, config.data_path, limit=args.questions, seed=args.seed)
    ran = debate_untrained(config, questions, 1)  # seeded with args.seed, as in training
    debates, backend, cpu, wall = ran.debates, ran.backend, ran.cpu_seconds, ran.wall_seconds

    cut_texts = [t.text for d in debates for row in d.turns for t in row if t.finish_reason == "length"]
    for text in cut_texts[: args.show_cut]:
        print(f"cut: {text!r}", file=sys.stderr)
    level = {q.id: q.meta.get("level", "all") for q in questions}
    by_level: dict[object, list[bool]] = defaultdict(list)
    for t in debates:
        by_level[level[t.question_id]].append(bool(t.correct))
    right = sum(bool(t.correct) for t in debates)
    low, high = wilson(right, len(debates))
    cut = cut_summary(debates)
    rounds = {r: cut_summary(debates, rounds=[r]) for r in range(config.rounds + 1)}
    unparsed = sum(a is None for t in debates for row in t.answers for a in row) / max(1, cut.answers)
    result = {
        "plan": args.plan,
        "overrides": overrides,
        "questions": len(questions),
        "distinct_problems": len({q.text for q in questions}),
        "seed": args.seed,
        "split": config.train_split,
        "team_accuracy": right / len(debates),
        "team_accuracy_95": [low, high],
        "team_accuracy_by_level": {str(k): sum(v) / len(v) for k, v in sorted(by_level.items(), key=str)},
        "answers": cut.to_dict(),
        "cut_share_by_round": {str(r): s.cut_share for r, s in rounds.items()},
        "unparsed_share": unparsed,
        "cpu_seconds": cpu,
        "cpu_seconds_per_debate": cpu / len(debates),
        "wall_seconds": wall,
        "machine": describe_numeric_path(),  # the CPU, its matrix units and what auto picks
        "dtype": str(backend.model.dtype).removeprefix("torch."),
        "torch_threads": threads.threads,
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
    }
    checks = []
    if args.accuracy:
        ok = args.accuracy[0] <= result["team_accuracy"] <= args.accuracy[1]
        checks.append(
            f"team accuracy {result['team_accuracy']:.3f} in [{args.accuracy[0]}, {args.accuracy[1]}]: "
            + ("yes" if ok else "NO")
        )
    if args.max_cut is not None:
        ok = cut.cut_share < args.max_cut
        checks.append(f"answers cut {cut.cut_share:.3f} < {args.max_cut}: " + ("yes" if ok else "NO"))
    result["checks"] = checks
    text = markdown(result)
    print(text)
    if args.out:
        from udpo.env.jsonl import write_json

        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "check.json", result)
        (args.out / "check.md").write_text(text + "\n")
    return 1 if any(c.endswith("NO") for c in checks) else 0


def markdown(r: dict) -> str:
    a = r["answers"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"Pre-run check of `{r['plan']}`{' with ' + str(r['overrides']) if r['overrides'] else ''}: "
        f"{r['questions']} {r['split']}-split questions ({r['distinct_problems']} distinct), seed {r['seed']}",
        "",
        "| what | value |",
        "|---|---|",
        f"| team accuracy (vote of the last round) | {pct(r['team_accuracy'])} "
        f"[{pct(r['team_accuracy_95'][0])}, {pct(r['team_accuracy_95'][1])}] |",
        "| by level | " + ", ".join(f"{k}: {pct(v)}" for k, v in r["team_accuracy_by_level"].items()) + " |",
        f"| answers (agents x rounds) | {a['answers']} |",
        f"| cut by max_tokens | {pct(a['cut_share'])} (by round: "
        + ", ".join(f"{k}: {pct(v)}" for k, v in r["cut_share_by_round"].items())
        + ") |",
        f"| accuracy of finished / cut answers | {pct(a['accuracy_finished'])} / {pct(a['accuracy_cut'])} |",
        f"| unparsed answers | {pct(r['unparsed_share'])} |",
        f"| words per answer | {a['words_per_answer']:.1f} |",
        f"| CPU time | {r['cpu_seconds']:.0f} s, {r['cpu_seconds_per_debate']:.2f} s a debate "
        f"({r['torch_threads']} torch threads, {r['dtype']}; wall {r['wall_seconds']:.0f} s) |",
        f"| machine | {r['machine']} |",
        "",
        f"`{r['command']}`",
    ]
    if r["checks"]:
        lines += ["", *(f"- {c}" for c in r["checks"])]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
