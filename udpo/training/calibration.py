"""UDPO's per-agent reward coefficients for a run: calibrated on warm-up debates (docs/metrics.md,
"Agent-tailored coefficients"), or read from another run's calibration (``calibration_file``: the runs of a
study share one), then explicit config values override, ``ablations`` zero their terms and
``correctness_floor`` raises each ``lambda_i`` above the weight at which a correct split wins. The baselines
(mappo, rmaac) train on the team reward and need no coefficients; they debate the warm-up questions only to
warm-start their critic (``critic_warmup_epochs``). Every algorithm holds the warm-up questions out of
training all the same, so every algorithm trains on the same questions."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.config import COEFFICIENTS, ConfigError
from udpo.config.groups import AlgorithmArgs, RewardArgs
from udpo.env.run_folder import RunFolder
from udpo.env.summary import summarize
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.rewards import calibrate as calibrate_coefficients
from udpo.rewards import correctness_floor, ordering_from_dict, reward_ordering


def warmup_debates(
    warmup_set: Sequence[Question], debate: Callable[..., list[Trajectory]], run_dir: Path, main: bool
) -> list[Trajectory]:
    """Debate the warm-up questions; the main process writes them to the run folder's warm-up file
    (:attr:`udpo.env.run_folder.RunFolder.warmup`)."""
    trajectories = debate(warmup_set, {"phase": "warmup"})
    if main:
        path = RunFolder(run_dir).warmup
        path.unlink(missing_ok=True)
        with TrajectoryWriter(path) as writer:
            writer.write(trajectories)
    return trajectories


def shared_calibration(path: str | Path) -> dict[str, Any]:
    """The calibration record another run wrote (RUN/calibration.json), checked: it holds five
    coefficients per agent, none given explicitly, none ablated and none floored (those would leak that
    run's settings into this one)."""
    path = Path(path).expanduser()
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"calibration_file {path}: cannot read a calibration record ({e})") from None
    coefficients = record.get("coefficients") if isinstance(record, dict) else None
    if not isinstance(coefficients, dict) or any(k not in coefficients for k in COEFFICIENTS):
        raise ConfigError(
            f"calibration_file {path}: no coefficients {', '.join(COEFFICIENTS)} (a UDPO run's)"
        )
    if record.get("explicit") or record.get("ablations"):
        raise ConfigError(
            f"calibration_file {path}: written by a run with explicit coefficients {record.get('explicit')} "
            f"or ablations {record.get('ablations')}; share the calibration of a plain UDPO run"
        )
    if "correctness_floor" in record:
        raise ConfigError(
            f"calibration_file {path}: its lambda_ was raised by correctness_floor; share a calibration "
            f"written without it (each run sets correctness_floor itself)"
        )
    return record


def calibrate(
    reward: RewardArgs,
    algorithm: AlgorithmArgs,
    warmup_set: Sequence[Question],
    debate: Callable[..., list[Trajectory]],
    run_dir: Path,
    main: bool,
    *,
    n_agents: int,
    rounds: int,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """The calibration record (what RUN_DIR/calibration.json holds) and the warm-up debates run for it
    ([] when none ran). The record: ``coefficients`` per agent (empty for the baselines), ``explicit``
    (those given in the config), ``ablations``, for a calibrated run the warm-up statistics, with
    ``calibration_file`` that file's record and its path, with ``correctness_floor`` on the floor's block
    ``correctness_floor`` (``margin``, ``lambda_star``, ``lambda_before``, ``lambda_after``:
    :func:`~udpo.rewards.correctness_floor`; ``coefficients`` holds ``lambda_after``), and ``ordering``: the
    rewards the final coefficients pay for the reference debates (:mod:`udpo.rewards.ordering`). The
    baselines debate the warm-up questions only when ``critic_warmup_epochs`` asks for a warm start. ``n_agents`` and ``rounds``: the team's size (one
    explicit coefficient stands for every agent) and its debates' rounds."""
    if algorithm.algorithm != "udpo":
        trajectories = (
            warmup_debates(warmup_set, debate, run_dir, main)
            if algorithm.critic_warmup_epochs and warmup_set
            else []
        )
        record: dict[str, Any] = {
            "coefficients": {},
            "explicit": [],
            "ablations": [],
            "algorithm": algorithm.algorithm,
        }
        if trajectories:
            record["warmup"] = {"summary": summarize(trajectories)}
        return record, trajectories
    trajectories = []
    if reward.calibration_file is not None:
        record = shared_calibration(reward.calibration_file)
        record["calibration_file"] = str(reward.calibration_file)
        coefficients = dict(record["coefficients"])
    elif warmup_set:
        trajectories = warmup_debates(warmup_set, debate, run_dir, main)
        result = calibrate_coefficients(
            [t.answers for t in trajectories],
            [t.gold for t in trajectories],
            kappa=reward.kappa,
            lam=reward.lam,
            base_weights=reward.base_weights,
            lambda_base=reward.lambda_base,
            eta_base=reward.eta_base,
            keys=[t.question_id for t in trajectories],
        )
        record = result.to_dict()
        coefficients = dict(record["coefficients"])
        record["warmup"]["summary"] = summarize(trajectories)
    else:
        record, coefficients = {"coefficients": {}}, {}
    overrides = {}
    for name in COEFFICIENTS:
        value = getattr(reward, name)
        if value is not None:
            overrides[name] = [float(v) for v in (value * n_agents if len(value) == 1 else value)]
    coefficients.update(overrides)
    if reward.ablations:
        from udpo.algorithms.udpo import Coefficients

        coefficients = Coefficients.from_dict(coefficients).without(*reward.ablations).to_dict()
    record["explicit"] = sorted(overrides)
    record["ablations"] = list(reward.ablations)
    if reward.correctness_floor and set(COEFFICIENTS) <= coefficients.keys():
        floor = correctness_floor(coefficients, rounds, reward.reward_scope, reward.correctness_floor_margin)
        coefficients["lambda_"] = floor["lambda_after"]
        record["correctness_floor"] = floor
    record["coefficients"] = coefficients
    if set(COEFFICIENTS) <= coefficients.keys():
        record["ordering"] = reward_ordering(coefficients, rounds, reward.reward_scope).to_dict()
    return record, trajectories


def describe(record: dict[str, Any]) -> str:
    """The coefficients per agent as printed at the start of a run (and by ``udpo calibrate``), with
    ``lambda_`` before and after the correctness floor and the rewards the coefficients pay for the reference
    debates when the record has them."""
    coefs = record["coefficients"]
    if not coefs:
        return f"{record.get('algorithm', 'this algorithm')}: team reward, no per-agent coefficients"
    lines = [f"  {name:8s}" + " ".join(f"{v:7.4f}" for v in coefs[name]) for name in COEFFICIENTS]
    head = (
        "reward coefficients per agent ("
        + (", ".join(record["explicit"]) or "none")
        + " explicit"
        + "".join(f", w/o {a}" for a in record.get("ablations", []))
        + "):"
    )
    floor = record.get("correctness_floor")
    if floor:
        lines.append(
            f"correctness floor, margin {floor['margin']:g}: lambda_ raised to (1 + margin) lambda* where lower"
        )
        for name, key in (("lambda*", "lambda_star"), ("before", "lambda_before"), ("after", "lambda_after")):
            lines.append(f"  {name:8s}" + " ".join(f"{v:7.4f}" for v in floor[key]))
    ordering = record.get("ordering")
    if ordering:
        lines.append(ordering_from_dict(ordering).table())
    return "\n".join([head, *lines])


def flat_coefficients(record: dict[str, Any]) -> dict[str, float]:
    """``{"alpha/agent_0": ..., ...}`` for the metrics log, with the correctness floor's ``lambda_star`` and
    ``lambda_before`` when the record has them."""
    values = {name: record["coefficients"][name] for name in COEFFICIENTS if name in record["coefficients"]}
    floor = record.get("correctness_floor") or {}
    values.update({key: floor[key] for key in ("lambda_star", "lambda_before") if key in floor})
    return {f"{name}/agent_{i}": v for name, per_agent in values.items() for i, v in enumerate(per_agent)}
