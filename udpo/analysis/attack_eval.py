"""Evaluate a team with and without attack: the UDPO paper's Table 3 / Table 7 numbers.

``evaluate_attacks`` debates the same questions once with no attack (the *natural* row, m = 0)
and once per set of compromised agents, and reports accuracy, U_intra, U_inter and U_sys per row
with the change from the natural row (``delta``; a negative accuracy delta is the drop).

Output folder (``udpo eval --output-dir OUT``)::

    OUT/natural/{trajectories.jsonl, summary.json}        # as ``udpo debate`` writes them
    OUT/m1-agents-2/{trajectories.jsonl, summary.json}    # one folder per attacked row
    OUT/summary.json, OUT/table.csv                       # the table, written last

Every attacked trajectory's ``meta`` names the attack settings and the compromised agents. A row
is debated in a hidden ``.NAME.partial`` folder and renamed into place when done; an attack or
backend failure removes that folder, so a row folder is always complete. An interrupted row
(Ctrl-C) keeps its finished debates and ``resume=True`` continues it; finished rows are reused.

``make_attack_eval_hook`` wraps the same evaluation for a training run's periodic evaluation.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.env.attacks import (
    AttackConfig,
    AttackedDebate,
    apply_attack,
    attacker_backend,
    check_compromised,
    default_compromised,
)
from udpo.env.backends.base import Backend
from udpo.env.debate import AgentSpec, DebateConfig
from udpo.env.jsonl import write_json
from udpo.env.progress import DebateProgress
from udpo.env.protocols import Protocol
from udpo.env.run_folder import SUMMARY, DebateFolder, RunFolder, iteration_name
from udpo.env.runs import previous_debates
from udpo.env.summary import run_debates
from udpo.env.tasks.base import Question, Task

#: the summary keys each attack row reports (table.csv's columns, with their change over the natural row)
ROW_METRICS = ("accuracy", "u_intra", "u_inter", "u_sys", "wrong_majority", "wrong_unanimous")
NATURAL = "natural"


def compromised_sets(
    n_agents: int, m_values: Sequence[int] | None = None, compromised: Sequence[Sequence[int]] | None = None
) -> list[list[int]]:
    """The attacked rows: each explicit index list in ``compromised``, else the last m agents for
    each m in ``m_values`` (default [1]); m = 0 is skipped (it is the natural row)."""
    if compromised and m_values:
        raise ValueError(
            "give either explicit compromised agent lists (--compromised-agents) or m values (--attack-eval-m), not both"
        )
    if compromised:
        sets = [check_compromised(c, n_agents) for c in compromised]
    else:
        sets = [default_compromised(m, n_agents) for m in (m_values or [1]) if m != 0]
    unique: list[list[int]] = []
    for s in sets:
        if s and s not in unique:
            unique.append(s)
    return unique


def row_name(compromised: Sequence[int]) -> str:
    """Folder / row name: ``natural`` or ``m<m>-agents-<i>-<j>``."""
    if not compromised:
        return NATURAL
    return f"m{len(compromised)}-agents-" + "-".join(map(str, compromised))


def evaluate_attacks(
    task: Task,
    backend: Backend,
    questions: Sequence[Question],
    debate_config: DebateConfig,
    attack: AttackConfig,
    sets: Sequence[Sequence[int]],
    base_model: str,
    out_dir: str | os.PathLike | None = None,
    meta: dict[str, Any] | None = None,
    natural: bool = True,
    resume: bool = False,
    progress: bool | DebateProgress = True,
    protocol: Protocol | None = None,
) -> dict[str, Any]:
    """Debate ``questions`` naturally (when ``natural``) and under ``attack`` for each compromised set.

    protocol: how agents read each other (default Standard MAD); each attack's stages are added to it.
    base_model: the team's base model name (the attacker's name when ``attack.attacker`` is "base").
    Returns the summary: ``{"attack", "run", "rows": [{"name", "m", "compromised", accuracy, u_intra,
    u_inter, u_sys, n_questions, "delta": {...}, "details": {...}}]}`` (delta only with a natural row).
    All attacks are prepared (AutoTransform profiles generated or read from the cache) before the
    first debate, so an attacker failure writes nothing. progress: True draws one progress line per row,
    labelled with the row's name; a DebateProgress gets every row's work (it is not closed).
    """
    sets = [check_compromised(s, debate_config.n_agents) for s in sets]
    if attack.name == "none":
        sets = []
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        check_out_dir(out, resume)
    meta = dict(meta or {})
    rows: list[dict[str, Any]] = []
    with attacker_backend(attack, backend) as attacker:
        name = base_model if attack.attacker == "base" else attack.attacker
        prepared = [apply_attack(attack, task, debate_config, s, attacker, name) for s in sets]
        plans: list[AttackedDebate] = []
        if natural:
            plans.append(apply_attack(AttackConfig(), task, debate_config, []))
        plans.extend(prepared)
        protocol = protocol or Protocol()
        for plan in plans:
            run = (debate_config, protocol.with_stages(*plan.stages))
            rows.append(_run_row(task, backend, questions, plan, run, out, meta, resume, progress))
    summary = {"attack": attack.describe(), "run": meta, "rows": _with_deltas(rows)}
    if out is not None:
        write_json(out / SUMMARY, summary)
        _write_csv(out / "table.csv", summary["rows"])
    return summary


def check_out_dir(out: Path, resume: bool) -> None:
    """Refuse an ``out`` folder that already holds an evaluation, unless resuming."""
    if resume or not out.exists():
        return
    taken = [p.name for p in out.iterdir() if p.name == SUMMARY or DebateFolder(p).trajectories.exists()]
    if taken:
        raise FileExistsError(
            f"{out} already holds an evaluation ({', '.join(sorted(taken))}); pass --resume to continue "
            f"it or choose another --output-dir"
        )


def _run_row(
    task: Task,
    backend: Backend,
    questions: Sequence[Question],
    plan: AttackedDebate,
    run: tuple[DebateConfig, Protocol],
    out: Path | None,
    meta: dict[str, Any],
    resume: bool,
    progress: bool | DebateProgress,
) -> dict[str, Any]:
    """One row: the team's config under the protocol with the attack's stages added."""
    config, protocol = run
    compromised = plan.meta["compromised"]
    name = row_name(compromised)
    if progress is True:
        with DebateProgress(desc=name) as line:
            return _run_row(task, backend, questions, plan, run, out, meta, resume, line)
    row_meta = {**meta, **plan.meta}
    base = {"name": name, "m": len(compromised), "compromised": compromised}
    if out is None:
        _, summary = run_debates(
            task, backend, questions, config, meta=row_meta, progress=progress, protocol=protocol
        )
        return {**base, **_metrics(summary), "details": plan.report()}
    final, partial = out / name, out / f".{name}.partial"
    if resume and DebateFolder(final).summary.exists():
        previous_debates(final, resume, plan.debate_config, row_meta)  # a finished row of the same settings
        summary = json.loads(DebateFolder(final).summary.read_text(encoding="utf-8"))
        return {**base, **_metrics(summary), "details": summary.get("attack_details", {})}
    if not resume:
        shutil.rmtree(partial, ignore_errors=True)
    try:
        _, summary = run_debates(
            task,
            backend,
            questions,
            config,
            out_dir=partial,
            meta=row_meta,
            progress=progress,
            protocol=protocol,
            resume=resume,
        )
    except Exception:
        shutil.rmtree(partial, ignore_errors=True)  # a failed row leaves nothing behind
        raise
    details = plan.report()
    if details:
        write_json(DebateFolder(partial).summary, {**summary, "attack_details": details})
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    return {**base, **_metrics(summary), "details": details}


def _metrics(summary: dict[str, Any]) -> dict[str, Any]:
    return {"n_questions": summary["n_questions"], **{k: summary.get(k) for k in ROW_METRICS}}


def _with_deltas(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    natural = next((r for r in rows if r["m"] == 0), None)
    if natural is None:
        return rows
    for r in rows:
        r["delta"] = {
            k: None if r[k] is None or natural[k] is None else r[k] - natural[k] for k in ROW_METRICS
        }
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["row", "m", "compromised", "n_questions", *ROW_METRICS, *(f"delta_{k}" for k in ROW_METRICS)]
        )
        for r in rows:
            delta = r.get("delta", {})
            w.writerow(
                [
                    r["name"],
                    r["m"],
                    " ".join(map(str, r["compromised"])),
                    r["n_questions"],
                    *(r[k] for k in ROW_METRICS),
                    *(delta.get(k) for k in ROW_METRICS),
                ]
            )
    os.replace(tmp, path)


def format_table(summary: dict[str, Any]) -> str:
    """The summary's rows as a plain-text table (accuracy in %, drop in percentage points)."""
    header = ["m", "compromised", "n", "acc %", "U_intra", "U_inter", "U_sys", "wrong maj %", "wrong unan %"]
    header.append("acc drop (pp)")
    lines = []
    for r in summary["rows"]:
        delta = r.get("delta", {}).get("accuracy")
        lines.append(
            [
                str(r["m"]),
                ",".join(map(str, r["compromised"])) or "-",
                str(r["n_questions"]),
                _fmt(r["accuracy"], 100, ".1f"),
                _fmt(r["u_intra"], 1, ".3f"),
                _fmt(r["u_inter"], 1, ".3f"),
                _fmt(r["u_sys"], 1, ".3f"),
                _fmt(r.get("wrong_majority"), 100, ".1f"),
                _fmt(r.get("wrong_unanimous"), 100, ".1f"),
                "-" if r["m"] == 0 or delta is None else f"{100 * delta:+.1f}",
            ]
        )
    widths = [max(len(h), *(len(line[k]) for line in lines)) for k, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*ln) for ln in lines)]
    )


def _fmt(x: float | None, scale: float, spec: str) -> str:
    return "-" if x is None else format(scale * x, spec)


# ---------------------------------------------------------------------------------------------
AttackEvalHook = Callable[..., dict[str, float]]


def make_attack_eval_hook(
    task: Task,
    questions: Sequence[Question],
    attack: AttackConfig,
    debate_config: DebateConfig,
    base_model: str,
    m_values: Sequence[int] = (1,),
    out_dir: str | os.PathLike | None = None,
    prefix: str = "attack",
    progress: bool = False,
    protocol: Protocol | None = None,
) -> AttackEvalHook:
    """A training-time attack evaluation, to run beside the natural evaluation.

    Returns ``hook(iteration, backend, team_agent_specs, natural=None) -> dict[str, float]``:
    it debates ``questions`` with the current team (``team_agent_specs``: one AgentSpec per agent,
    adapters as registered with ``backend``) with the last m agents compromised, for each m in
    ``m_values``, and returns metrics named ``{prefix}/m{m}/{accuracy,u_intra,u_inter,u_sys}``
    (``m{m}/...`` with an empty prefix).
    Pass the natural evaluation's summary as ``natural`` to also get ``{prefix}/m{m}/accuracy_drop``
    (natural accuracy minus attacked accuracy). With ``out_dir`` each call writes its debates to
    ``out_dir/iter_<iteration>/<row>/``. The natural debates are not repeated here. protocol: how
    agents read each other (default Standard MAD), the attack's stages added to it.
    """
    if attack.name == "none":
        raise ValueError("an attack eval hook needs an attack (autotransform or autoinject), not 'none'")
    sets = compromised_sets(debate_config.n_agents, m_values=list(m_values))

    def hook(
        iteration: int, backend: Backend, team_agent_specs: Sequence[AgentSpec], natural: dict | None = None
    ) -> dict[str, float]:
        config = dataclasses.replace(
            debate_config, n_agents=len(team_agent_specs), agents=list(team_agent_specs)
        )
        out = Path(out_dir) / iteration_name(iteration) if out_dir is not None else None
        summary = evaluate_attacks(
            task,
            backend,
            questions,
            config,
            attack,
            sets,
            base_model,
            out_dir=out,
            meta={"iteration": iteration},
            natural=False,
            resume=True,
            progress=progress,
            protocol=protocol,
        )
        metrics: dict[str, float] = {}
        for r in summary["rows"]:
            key = f"{prefix}/m{r['m']}/" if prefix else f"m{r['m']}/"
            for k in ROW_METRICS:
                metrics[key + k] = r[k]
            if natural and natural.get("accuracy") is not None:
                metrics[key + "accuracy_drop"] = natural["accuracy"] - r["accuracy"]
        return metrics

    return hook


def attack_eval_callback(
    attack: AttackConfig, m_values: Sequence[int] = (1,), prefix: str = "attack"
) -> Callable[[Any, int], dict[str, float]]:
    """A trainer eval callback ``(trainer, iteration) -> dict`` running ``make_attack_eval_hook``.

    It uses the trainer's ``task``, ``eval_set``, ``backend`` (current adapters), ``debate_config()``,
    ``debate_protocol()`` (when it has one; else Standard MAD), ``config.model`` and ``run_dir``; runs on the main process only (others return ``{}``); reads the
    natural evaluation's summary for the accuracy drop and writes its debates to the run folder's attack
    evaluations, one folder per row (:attr:`udpo.env.run_folder.RunFolder.attack_evaluations`). The trainer logs its metrics under the
    callback's name, ``{prefix}_{attack.name}``: e.g. ``eval/attack_autotransform/m1/accuracy``.
    Pass it as ``Trainer(config, eval_callbacks=[...])``.
    """

    def callback(trainer: Any, iteration: int) -> dict[str, float]:
        if not trainer.main or not trainer.eval_set:
            return {}
        config, run = trainer.debate_config(), RunFolder(Path(trainer.run_dir))
        hook = make_attack_eval_hook(
            trainer.task,
            trainer.eval_set,
            attack,
            config,
            trainer.config.model,
            m_values=m_values,
            out_dir=run.attack_evaluations,
            prefix="",
            protocol=trainer.debate_protocol() if hasattr(trainer, "debate_protocol") else None,
        )
        natural_path = run.evaluation(iteration).summary
        natural = json.loads(natural_path.read_text(encoding="utf-8")) if natural_path.exists() else None
        return hook(iteration, trainer.backend, config.agents, natural=natural)

    callback.__name__ = callback.__qualname__ = f"{prefix}_{attack.name}"
    return callback
