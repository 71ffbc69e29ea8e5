"""Read what a study's committed answers say, from its run records alone: the figures a results page quotes
beside a study's tables before it believes a gain.

Per arm (the untrained team is each seed's iteration-0 evaluation, once a seed; a trained arm is each
record's last evaluation), over every agent's answer in every round:

- credited turns (the parsed answer equals the gold, as the study tables count a right answer) and how many
  of them do not *state* the gold: the text neither opens with it nor has it right after ``=``, ``is``,
  ``equals`` or ``:`` (:func:`states_gold`). A grader hole shows up here first: a reply credited for what it
  does not say (a restated question, a number read from an explanation);
- the share of answers read in the ``stated`` form and the accuracy of those answers, so that a gain can be
  split into more answers stated and stated answers more often right;

and per trained arm, from its metrics: the mean share of each reward term in the within-question reward
differences (``reward_share/*``), the groups dynamic sampling dropped, and each run's minutes (first to
last logged time, the final evaluation included).

    python scripts/read_answers.py recipes/compare/udpo_control.yaml
    python scripts/read_answers.py docs/lab/results/positive_control --examples 5

The argument is a study plan (its ``results_dir``) or a results folder; records are read from its
``runs/``. ``--examples N`` prints N credited turns that do not state the gold, per arm (seeded).
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from udpo.env.trajectory import Trajectory
from udpo.study.plan import load_plan
from udpo.study.record import RunRecord

UNTRAINED = "untrained"
#: the reward terms whose shares a run logs
TERMS = ("r_task", "r_intra", "r_inter", "r_sys")


def states_gold(text: str, gold: object) -> bool:
    """Whether ``text`` opens with the gold answer or gives it right after ``=``, ``is``, ``equals`` or ``:``
    (a ``$`` allowed before it; the number must end there, so ``12`` does not state ``1``)."""
    g = re.escape(str(gold))
    end = r"(?!\d|\.\d)"
    return (
        re.match(rf"\s*{g}{end}", text) is not None
        or re.search(rf"(=|\bis\b|\bequals\b|:)\s*\$?{g}{end}", text) is not None
    )


@dataclass
class Answers:
    """Counts over the answers of one arm."""

    answers: int = 0
    credited: int = 0
    unstated: list[str] = field(default_factory=list)
    stated: int = 0
    stated_right: int = 0

    def add(self, debates: list[Trajectory]) -> None:
        for debate in debates:
            for turns in debate.turns:
                for turn in turns:
                    right = turn.answer is not None and turn.answer == debate.gold
                    self.answers += 1
                    self.credited += right
                    if right and not states_gold(turn.text, debate.gold):
                        self.unstated.append(turn.text)
                    if turn.form == "stated":
                        self.stated += 1
                        self.stated_right += right

    def line(self, arm: str) -> str:
        n = len(self.unstated)
        return (
            f"{arm}: {self.answers} answers; credited {self.credited}, not stating the gold {n} "
            f"({n / max(self.credited, 1):.1%}); stated form {self.stated / max(self.answers, 1):.1%}, "
            f"right when stated {self.stated_right / max(self.stated, 1):.1%}"
        )


def training_line(arm: str, records: list[RunRecord]) -> str:
    """Reward-term shares, dropped groups and minutes per run, over an arm's records."""
    shares: dict[str, list[float]] = defaultdict(list)
    dropped = debated = 0
    minutes = []
    for record in records:
        rows = record.metrics()
        times = [r["time"] for r in rows if "time" in r]
        minutes.append(round((max(times) - min(times)) / 60))
        for r in rows:
            for term in TERMS:
                if f"reward_share/{term}" in r:
                    shares[term].append(r[f"reward_share/{term}"])
            dropped += r.get("groups/dropped", 0)
            debated += r.get("groups/debated", 0)
    share = ", ".join(f"{t} {statistics.mean(shares[t]):.1%}" for t in TERMS if shares[t])
    return (
        f"{arm}: reward shares {share or '-'}; groups dropped {dropped} of {debated}; "
        f"minutes a run {minutes} (median {statistics.median(minutes)})"
    )


def results_folder(target: Path) -> Path:
    """A results folder, or the ``results_dir`` of the study plan ``target``."""
    return target if target.is_dir() else load_plan(target).results_path()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", type=Path, help="a study plan (YAML) or its results folder")
    p.add_argument("--examples", type=int, default=0, help="credited turns not stating the gold, per arm")
    args = p.parse_args(argv)
    runs = results_folder(args.target) / "runs"
    records = [RunRecord.load(f) for f in sorted(runs.iterdir()) if (f / "run.json").is_file()]
    if not records:
        print(f"no run records under {runs}", file=sys.stderr)
        return 1
    arms: dict[str, Answers] = defaultdict(Answers)
    by_arm: dict[str, list[RunRecord]] = defaultdict(list)
    untrained_seeds: set[int] = set()
    for record in records:
        if 0 in record.evaluations and record.seed not in untrained_seeds:
            untrained_seeds.add(record.seed)
            arms[UNTRAINED].add(record.evaluation(0))
        if record.final_eval != 0:
            arms[record.method].add(record.evaluation(record.final_eval))
            by_arm[record.method].append(record)
    rng = random.Random(0)
    for arm, answers in arms.items():
        print(answers.line(arm))
        for text in rng.sample(answers.unstated, min(args.examples, len(answers.unstated))):
            print(f"    {text[:160]!r}")
    for arm, arm_records in by_arm.items():
        print(training_line(arm, arm_records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
