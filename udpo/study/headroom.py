"""Headroom measured before a study trains: ``udpo study PLAN --check``.

Reinforcement learning on a small model mostly sharpens answers the model already gives some of the time:
a question the untrained team always gets right, or never does, leaves little to learn. The check debates
training-split questions of the plan with the untrained team (the base model, as every run starts; the
plan's recipe and settings: task, team, rounds, temperature, token cap), ``debates`` times each with fresh
draws, and reports (:func:`headroom_statistics`, on the success matrix: one row per question, one column
per debate, 1 where the team's vote was right):

- ``accuracy``: the team's accuracy over every debate;
- ``distribution``: how many questions were right in 0, 1, ..., K of their K debates;
- ``never_share``, ``always_share``, ``mixed_share``: the shares of questions right in none, all, or some
  but not all of their debates (sometimes right, sometimes wrong);
- ``majority_ceiling``: the accuracy if every question went to its majority outcome (right when it was
  right in more than half its debates; a tie counts one half), and ``majority_gain`` = that - accuracy;
- ``ceiling``: the accuracy if every sometimes-right question were always right (the share of questions
  right at least once), and ``ceiling_gain`` = that - accuracy;
- ``cut_share``: the share of answers (agents x rounds) stopped by ``max_tokens``, and ``unparsed_share``:
  the share of answers with no parsed value;
- the pace: wall and CPU seconds per debate and generated tokens per second (the debates alone, not the
  model's loading), with the CPU (GPU), torch threads and dtype.

The result is written to ``RESULTS_DIR/headroom.json``, to be committed with the plan before its first
run. A plan that states ``headroom:`` bounds (``min_mixed_share``, ``min_ceiling_gain``, ``max_cut``,
``max_unparsed``) refuses to train (:func:`require_headroom`) without that file, when the file was measured
on other settings than the plan's, or when a measured value lies outside a bound, naming the values.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from udpo.config import ConfigError
from udpo.env.jsonl import write_json

#: the check's file in the plan's results folder
HEADROOM_FILE = "headroom.json"
#: the bounds a plan's headroom: block may state
BOUNDS = ("min_mixed_share", "min_ceiling_gain", "max_cut", "max_unparsed")
#: the training settings that decide what the check measures: the file must have been measured on these
MEASURED_SETTINGS = (
    "model",
    "agent_models",
    "task",
    "task_options",
    "train_split",
    "data_path",
    "max_train_questions",
    "warmup_fraction",
    "n_agents",
    "rounds",
    "protocol",
    "protocol_options",
    "profiles",
    "max_tokens",
    "temperature",
    "top_p",
    "chat_template_kwargs",
    "dtype",
)


@dataclass
class HeadroomSpec:
    """A plan's ``headroom:`` block. questions: training questions debated (the first of the run's question
    stream of ``seed``, default the plan's first seed); debates: debates of each, with fresh draws. Bounds
    (None: not required): min_mixed_share (share of questions sometimes right and sometimes wrong),
    min_ceiling_gain (ceiling - accuracy), max_cut (share of answers cut by max_tokens, strictly below),
    max_unparsed (share of answers without a parsed value, strictly below)."""

    questions: int = 60
    debates: int = 8
    seed: int | None = None
    min_mixed_share: float | None = None
    min_ceiling_gain: float | None = None
    max_cut: float | None = None
    max_unparsed: float | None = None

    @classmethod
    def from_plan(cls, block: Any) -> HeadroomSpec:
        """The block as a plan writes it (a mapping); ConfigError naming what is wrong."""
        if not isinstance(block, dict):
            raise ConfigError(f"headroom: a mapping of {[f.name for f in fields(cls)]}, got {block!r:.80}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(block) - known)
        if unknown:
            raise ConfigError(f"headroom: unknown key(s) {unknown}; known: {', '.join(sorted(known))}")
        spec = cls(**block)
        for name in ("questions", "debates"):
            value = getattr(spec, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"headroom.{name} must be an integer >= 1, got {value!r}")
        if spec.debates < 2:
            raise ConfigError("headroom.debates must be >= 2: one debate a question cannot show a mixed one")
        for name in BOUNDS:
            value = getattr(spec, name)
            if value is not None and not (isinstance(value, int | float) and 0 <= value <= 1):
                raise ConfigError(f"headroom.{name} must be a share in [0, 1], got {value!r}")
        return spec

    @property
    def bounds(self) -> dict[str, float]:
        """The bounds the plan states (name -> value)."""
        return {n: float(getattr(self, n)) for n in BOUNDS if getattr(self, n) is not None}

    def sample(self) -> dict[str, Any]:
        """What the check debates (questions, debates, seed): a file measured on another sample is stale."""
        return {k: v for k, v in asdict(self).items() if k not in BOUNDS}


def headroom_statistics(success: np.ndarray) -> dict[str, Any]:
    """The headroom statistics of a success matrix [Q, K] (1: the team's vote was right in that debate); see
    the module docstring."""
    success = np.asarray(success, dtype=float)
    if success.ndim != 2 or 0 in success.shape:
        raise ValueError(f"a success matrix is questions x debates, got shape {success.shape}")
    n, k = success.shape
    right = success.sum(1)  # per question: debates right
    accuracy = float(success.mean())
    majority = np.where(right * 2 > k, 1.0, np.where(right * 2 == k, 0.5, 0.0))
    ceiling = float((right > 0).mean())
    counts = np.bincount(right.astype(int), minlength=k + 1)
    return {
        "questions": n,
        "debates_per_question": k,
        "accuracy": accuracy,
        "distribution": {str(j): int(c) for j, c in enumerate(counts)},
        "never_share": float(counts[0] / n),
        "always_share": float(counts[k] / n),
        "mixed_share": float(((right > 0) & (right < k)).mean()),
        "majority_ceiling": float(majority.mean()),
        "majority_gain": float(majority.mean()) - accuracy,
        "ceiling": ceiling,
        "ceiling_gain": ceiling - accuracy,
    }


def violations(measured: dict[str, Any], bounds: dict[str, float]) -> list[str]:
    """Each stated bound the measured values miss, as ``what measured vs bound`` (empty: all met)."""
    out = []
    checks = {
        "min_mixed_share": ("mixed_share", ">="),
        "min_ceiling_gain": ("ceiling_gain", ">="),
        "max_cut": ("cut_share", "<"),
        "max_unparsed": ("unparsed_share", "<"),
    }
    for bound, value in bounds.items():
        key, op = checks[bound]
        got = measured[key]
        ok = got >= value if op == ">=" else got < value
        if not ok:
            out.append(f"{key} {got:.3f} (needs {op} {value:g}, headroom.{bound})")
    return out


def measured_settings(config) -> dict[str, Any]:
    """The settings of a training config (:class:`udpo.config.TrainConfig`) the check's numbers depend on."""
    return {name: getattr(config, name) for name in MEASURED_SETTINGS}


def check_questions(config, count: int) -> list:
    """The first ``count`` training questions of the run's question stream (training split, warm-up share
    held out, per-epoch order of ``config.seed``): what the run would debate first; at most one pass."""
    from udpo.config.groups import DebateArgs, OptimizerArgs, RunArgs
    from udpo.training.data import load_training_data

    data = load_training_data(
        config.group(DebateArgs),
        config.group(OptimizerArgs),
        config.group(RunArgs),
        calibrates=not config.coefficients_explicit,
    )
    return data.schedule.take(0, min(count, len(data.train_set)))


@dataclass
class UntrainedDebates:
    """The untrained team's debates, the backend that ran them, and the wall and CPU seconds (user +
    system, this process) of the debates alone (the model's loading not counted)."""

    debates: list
    backend: Any
    wall_seconds: float
    cpu_seconds: float


def debate_untrained(config, questions: Sequence, debates: int) -> UntrainedDebates:
    """Every question ``debates`` times in a row with the untrained team: the base model on the hf backend
    as a run's rollouts build it (batch, chat template, decode path; :func:`hf_rollout_settings`), the
    config's team, protocol and sampling, seeded with ``config.seed``."""
    import resource

    from udpo.config.groups import DebateArgs, ModelArgs, mapping
    from udpo.env.backends.hf import HFBackend
    from udpo.env.debate import AgentSpec, DebateEnv
    from udpo.env.protocols import build_protocol
    from udpo.env.seeds import seed_everything
    from udpo.env.tasks import get_task
    from udpo.training.data import agent_profiles, debate_config
    from udpo.training.rollouts import hf_rollout_settings

    if config.agent_models:
        raise ConfigError("the headroom check debates one base model; this plan's team lists agent_models")
    task = get_task(config.task, **mapping(config.task_options))
    settings = hf_rollout_settings(config.group(ModelArgs), config.group(DebateArgs))
    backend = HFBackend(model=config.model, dtype=config.dtype, **settings)
    agents = [AgentSpec(profile=profile) for profile in agent_profiles(config)]
    protocol = build_protocol(config.protocol_config(), task, backend)
    env = DebateEnv(task, backend, debate_config(config, agents), protocol=protocol)
    seed_everything(config.seed)  # the hf backend samples from torch's generator, as training does

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu0, wall0 = cpu(), time.perf_counter()
    out = env.run([q for q in questions for _ in range(debates)])
    return UntrainedDebates(out, backend, time.perf_counter() - wall0, cpu() - cpu0)


def plan_spec(plan) -> tuple[HeadroomSpec, int]:
    """A plan's :class:`HeadroomSpec` (its ``headroom:`` block, or the defaults) and the check's seed."""
    spec = HeadroomSpec.from_plan(plan.headroom or {})
    return spec, plan.seeds[0] if spec.seed is None else spec.seed


def run_check(plan, plan_path: str | Path) -> dict[str, Any]:
    """Measure the headroom of ``plan`` (a :class:`~udpo.study.plan.CompareConfig`, read from
    ``plan_path``, with or without a ``headroom:`` block) and write ``RESULTS_DIR/headroom.json``; returns
    what was written."""
    from udpo.env.summary import summarize
    from udpo.study.cut import cut_summary
    from udpo.study.record import machine_facts
    from udpo.threads import configure_threads

    spec, seed = plan_spec(plan)
    config = plan.train_config(plan.trained()[0], seed)
    threads = configure_threads()
    questions = check_questions(config, spec.questions)
    ran = debate_untrained(config, questions, spec.debates)
    debates, wall = ran.debates, ran.wall_seconds
    success = np.array([bool(t.correct) for t in debates], dtype=float).reshape(len(questions), spec.debates)
    tokens = sum(len(turn.completion_ids) for t in debates for row in t.turns for turn in row)
    cut = cut_summary(debates)
    measured = {
        **headroom_statistics(success),
        "distinct_problems": len({q.text for q in questions}),
        "cut_share": cut.cut_share,
        "unparsed_share": summarize(debates)["unparsed_rate"],
        "answers": cut.answers,
    }
    result = {
        "plan": str(plan_path),
        "seed": seed,
        "split": config.train_split,
        "measured": measured,
        "bounds": spec.bounds,
        "violations": violations(measured, spec.bounds),
        "pace": {
            "debates": len(debates),
            "wall_seconds": round(wall, 3),
            "seconds_per_debate": wall / len(debates),
            "cpu_seconds_per_debate": ran.cpu_seconds / len(debates),
            "tokens": tokens,
            "tokens_per_s": tokens / max(wall, 1e-9),
            "torch_threads": threads.threads,
            **machine_facts(config.dtype),
        },
        "settings": measured_settings(config),
        "spec": asdict(spec),
        "question_ids": [q.id for q in questions],
        "backend_dtype": str(ran.backend.model.dtype).removeprefix("torch."),
    }
    path = plan.results_path() / HEADROOM_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, result)
    return result


def describe(result: dict[str, Any]) -> str:
    """The check's result as the command prints it."""
    m, pace = result["measured"], result["pace"]

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    lines = [
        f"headroom of {result['plan']}: {m['questions']} {result['split']}-split questions "
        f"({m['distinct_problems']} distinct) x {m['debates_per_question']} debates, seed {result['seed']}, "
        f"untrained team",
        f"  team accuracy          {pct(m['accuracy'])}",
        "  right in j of K debates " + ", ".join(f"{j}: {c}" for j, c in m["distribution"].items()),
        f"  never / mixed / always {pct(m['never_share'])} / {pct(m['mixed_share'])} / {pct(m['always_share'])}",
        f"  majority ceiling       {pct(m['majority_ceiling'])} ({100 * m['majority_gain']:+.1f} points)",
        f"  ceiling (mixed -> right) {pct(m['ceiling'])} ({100 * m['ceiling_gain']:+.1f} points)",
        f"  answers cut / unparsed {pct(m['cut_share'])} / {pct(m['unparsed_share'])} of {m['answers']}",
        f"  pace                   {pace['seconds_per_debate']:.2f} s a debate ({pace['cpu_seconds_per_debate']:.2f} "
        f"CPU s), {pace['tokens_per_s']:.0f} "
        f"tokens/s ({pace['cpu']}, {pace['torch_threads']} torch threads, {pace['dtype']}"
        + (f", {pace['gpu']}" if pace["gpu"] else "")
        + ")",
    ]
    if result["bounds"]:
        verdict = "; ".join(result["violations"]) or "every bound met"
        lines.append(f"  bounds {result['bounds']}: {verdict}")
    return "\n".join(lines)


def require_headroom(plan) -> None:
    """Refuse (ConfigError) to train a plan whose ``headroom:`` bounds its committed check does not meet:
    no ``RESULTS_DIR/headroom.json``, one measured on other settings (the first trained method's config at
    the check's seed) or on another sample (questions, debates, seed), or a measured value outside a bound.
    A plan without bounds passes."""
    spec, seed = plan_spec(plan)
    if not spec.bounds:
        return
    path = plan.results_path() / HEADROOM_FILE
    command = "udpo study PLAN --check"
    if not path.is_file():
        raise ConfigError(
            f"the plan states headroom bounds {spec.bounds} and {path} is missing: run `{command}` and "
            f"commit its file before the first run"
        )
    result = json.loads(path.read_text())
    now = measured_settings(plan.train_config(plan.trained()[0], seed))
    measured_on = result.get("settings", {})
    changed = sorted(k for k, v in now.items() if measured_on.get(k, math.nan) != v)
    if {k: v for k, v in result.get("spec", {}).items() if k not in BOUNDS} != spec.sample():
        changed.append("headroom's questions, debates or seed")
    if changed:
        raise ConfigError(
            f"{path} was measured on other settings than the plan's ({', '.join(changed)}): run `{command}` "
            f"again and commit it"
        )
    missed = violations(result["measured"], spec.bounds)
    if missed:
        raise ConfigError(f"the plan's task has too little headroom to start ({path}): " + "; ".join(missed))
