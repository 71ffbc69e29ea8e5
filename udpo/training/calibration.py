"""UDPO's per-agent reward coefficients for a run: calibrated on warm-up debates (SPEC section 4), then
explicit config values override and ``ablations`` zero their terms. The baselines (mappo, rmaac) train
on the team reward and skip the warm-up debates; their warm-up questions stay out of training all the
same, so every algorithm trains on the same questions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.config import COEFFICIENTS, TrainConfig
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, TrajectoryWriter
from udpo.evaluate import summarize

WARMUP_FILE = "trajectories/warmup.jsonl"


def calibrate(
    config: TrainConfig,
    warmup_set: Sequence[Question],
    debate: Callable[..., list[Trajectory]],
    run_dir: Path,
    main: bool,
) -> dict[str, Any]:
    """The calibration record (what RUN_DIR/calibration.json holds): ``coefficients`` per agent (empty
    for the baselines), ``explicit`` (those given in the config), ``ablations``, and for a calibrated
    run the warm-up statistics. ``debate(questions, meta)`` runs the warm-up debates; the main
    process writes them to RUN_DIR/trajectories/warmup.jsonl."""
    from udpo.rewards import calibrate as calibrate_coefficients

    cfg = config
    if cfg.algorithm != "udpo":
        return {"coefficients": {}, "explicit": [], "ablations": [], "algorithm": cfg.algorithm}
    if warmup_set:
        trajectories = debate(warmup_set, {"phase": "warmup"})
        if main:
            (run_dir / WARMUP_FILE).unlink(missing_ok=True)
            with TrajectoryWriter(run_dir / WARMUP_FILE) as writer:
                writer.write(trajectories)
        result = calibrate_coefficients(
            [t.answers for t in trajectories],
            [t.gold for t in trajectories],
            kappa=cfg.kappa,
            lam=cfg.lam,
            base_weights=cfg.base_weights,
            lambda_base=cfg.lambda_base,
            eta_base=cfg.eta_base,
        )
        record = result.to_dict()
        coefficients = dict(record["coefficients"])
        record["warmup"]["summary"] = summarize(trajectories)
    else:
        record, coefficients = {"coefficients": {}}, {}
    overrides = {}
    for name in COEFFICIENTS:
        value = getattr(cfg, name)
        if value is not None:
            overrides[name] = [float(v) for v in (value * cfg.n_agents if len(value) == 1 else value)]
    coefficients.update(overrides)
    if cfg.ablations:
        from udpo.algorithms.udpo import Coefficients

        coefficients = Coefficients.from_dict(coefficients).without(*cfg.ablations).to_dict()
    record["coefficients"] = coefficients
    record["explicit"] = sorted(overrides)
    record["ablations"] = list(cfg.ablations)
    return record


def describe(record: dict[str, Any]) -> str:
    """The coefficients per agent as printed at the start of a run."""
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
    return "\n".join([head, *lines])


def flat_coefficients(record: dict[str, Any]) -> dict[str, float]:
    """``{"alpha/agent_0": ..., ...}`` for the metrics log."""
    coefs = record["coefficients"]
    return {
        f"{name}/agent_{i}": v for name in COEFFICIENTS if name in coefs for i, v in enumerate(coefs[name])
    }
