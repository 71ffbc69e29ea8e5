"""The study runner: train every (method, seed) of a plan not yet done, record each run as it finishes
(:mod:`udpo.study.record`), and write the tables from the records (:mod:`udpo.study.tables`) once the last
is recorded; several processes may share the runs (:mod:`udpo.study.workers`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from udpo.analysis.results import eval_iterations
from udpo.config import ConfigError, TrainConfig
from udpo.env.jsonl import write_json
from udpo.env.run_folder import RunFolder
from udpo.study.grader_comparison import write_regraded
from udpo.study.plan import CompareConfig, check_budgets
from udpo.study.record import record_name, write_record
from udpo.study.regrade import check_grader
from udpo.study.tables import write_tables

#: written in a run folder when its run finished
DONE = "done.json"
#: a Ray study driver's note of its runs in flight and where (:mod:`udpo.study.ray_executor`), in
#: ``output_dir/logs``
IN_FLIGHT = "ray.json"
#: seconds a process waits for another one writing the tables before giving up
TABLES_PATIENCE = 600.0


def run_compare(
    config: CompareConfig,
    train: Callable[[TrainConfig], Any] | None = None,
    progress: bool = True,
    seeds: Sequence[int] | None = None,
) -> dict[str, Any] | None:
    """Train every (method, seed) not yet done (resuming an interrupted one from its latest checkpoint),
    write each run's record as it finishes, then write the tables, the budget and the diagnosis from the
    records. ``train``: how one run trains (default :func:`udpo.training.trainer.train`). ``seeds``: train
    only these (e.g. one process per seed, side by side). A run with a record is done, even where its run
    folder is gone (trained on another machine). Started runs go first. Several compare processes may
    share the work (one per core): a run another process holds (its folder is locked,
    :mod:`udpo.training.run_lock`, from a worker's look at it to its record) is left to it. Returns the
    results, or None while some runs are not done (other seeds, other processes) and when
    ``tables_when_done`` is false."""
    from tqdm.auto import tqdm

    from udpo.training import run_lock
    from udpo.training.run_lock import RunBusyError

    jobs = plan_jobs(config, seeds)
    if train is None:
        from udpo.training.trainer import train
    bar = tqdm(jobs, desc="compare", unit="run", disable=not progress)
    for i, (method, seed) in enumerate(bar, 1):
        run = config.run_dir(method, seed)
        bar.set_postfix_str(f"{method} seed {seed}")
        if config.recorded(method, seed):  # (perhaps trained on another machine: no folder to lock)
            continue
        try:
            # the look at the run (done? started?), its training and its record: one hold of its lock, lent
            # to the trainer, so that no other worker finishes or starts the run in between
            with run_lock.held(run, lend=True, resume="the same command (it resumes the run)"):
                if record_finished(config, method, seed):
                    continue
                tc = config.train_config(method, seed)
                resumable = resume_if_started(tc)
                bar.write(
                    f"[{i}/{len(jobs)}] {method}, seed {seed}"
                    f"{' (resuming its latest checkpoint)' if resumable else ''}: {run}"
                )
                train(tc)
                mark_done(run, method, seed)
                record_finished(config, method, seed)
        except RunBusyError as e:
            bar.write(f"[{i}/{len(jobs)}] left to the process that trains it: {e}")
            continue
        bar.write(f"[{i}/{len(jobs)}] recorded: {config.record_dir(method, seed)}")
    bar.close()
    if not config.tables_when_done or not config.all_recorded():
        return None
    return write_results(config)


def plan_jobs(config: CompareConfig, seeds: Sequence[int] | None = None) -> list[tuple[str, int]]:
    """The (method, seed) runs of ``config`` to go through (only ``seeds`` when given), started ones first
    (those whose folder here holds a checkpoint), once every seed's budgets are checked."""
    from udpo.training import checkpoint_store as ckpt

    chosen = config.seeds if seeds is None else list(seeds)
    unknown = [s for s in chosen if s not in config.seeds]
    if unknown:
        raise ConfigError(f"seed(s) {unknown} are not among the config's seeds {config.seeds}")
    for seed in config.seeds:
        check_budgets({m: config.train_config(m, seed) for m in config.trained()})
    jobs = [(m, s) for s in chosen for m in config.trained()]
    return sorted(jobs, key=lambda job: not ckpt.list_checkpoints(config.run_dir(*job)))  # stable


def resume_if_started(tc: TrainConfig) -> bool:
    """Set ``tc`` to resume its latest checkpoint when its run folder holds one; returns whether it does."""
    from udpo.training import checkpoint_store as ckpt

    started = bool(ckpt.list_checkpoints(Path(tc.output_dir)))
    if started:
        tc.resume = ckpt.LATEST
    return started


def mark_done(run: Path, method: str, seed: int) -> None:
    """Mark the run folder finished (:data:`DONE`, naming its last evaluated iteration)."""
    last = max(eval_iterations(run), default=0)
    write_json(run / DONE, {"method": method, "seed": seed, "final_eval": last})


def record_finished(config: CompareConfig, method: str, seed: int) -> bool:
    """Whether the run is done: its record exists, or its run folder finished (done.json) and its record
    is written now (a run that finished before records existed, or was stopped between the two)."""
    if config.recorded(method, seed):
        return True
    run = config.run_dir(method, seed)
    if not (run / DONE).exists():
        return False
    write_record(run, config.record_dir(method, seed), method, seed)
    return True


def write_results(config: CompareConfig, grader: str = "recorded") -> dict[str, Any]:
    """Tables, budget, results.json and the diagnosis, from the runs' records, graded by ``grader``
    (:func:`udpo.study.tables.write_tables`). Where the run folders are (``output_dir``), one
    process writes at a time (two compare processes can finish their last runs together): the output
    folder's lock, waited for up to :data:`TABLES_PATIENCE` seconds, and finished runs without a record get
    theirs first; from a committed results folder alone nothing else writes."""
    from udpo.training import run_lock

    if not Path(config.output_dir).is_dir():
        return tables_of(config, grader)
    with run_lock.held(config.output_dir, resume="udpo study --tables-only", patience=TABLES_PATIENCE):
        for seed in config.seeds:
            for method in config.trained():
                record_finished(config, method, seed)
        return tables_of(config, grader)


def tables_of(config: CompareConfig, grader: str) -> dict[str, Any]:
    """The tables of ``grader`` (:data:`udpo.study.regrade.GRADERS`): as recorded, into ``results_dir``
    (:func:`udpo.study.tables.write_tables`); re-graded, into ``results_dir/regraded/`` with the comparison
    (:func:`udpo.study.grader_comparison.write_regraded`)."""
    if check_grader(grader) == "recorded":
        return write_tables(config)
    return write_regraded(config)


def format_progress(config: CompareConfig) -> Sequence[str]:
    """One line per (method, seed): done, started (with its latest checkpoint and last iteration; at
    the last one, in its final evaluation) or waiting, and which process trains it now (a Ray study's:
    which attempt, on which node, :func:`in_flight`)."""
    from udpo.training import checkpoint_store as ckpt
    from udpo.training import run_lock

    on_ray = in_flight(config)
    lines = []
    for seed in config.seeds:
        for method in config.trained():
            run = config.run_dir(method, seed)
            if config.recorded(method, seed):
                state = "done"
            elif (run / DONE).exists():
                state = "done, its record not written yet"
            elif ckpt.list_checkpoints(run):
                state = f"started, latest checkpoint {ckpt.resolve(run, ckpt.LATEST).name}"
                k, total = last_iteration(run), config.train_config(method, seed).max_iterations
                if k is not None:
                    state += f", iteration {k}" + (f" of {total}" if total else "")
                    state += ", final evaluation" if k == total else ""
            else:
                state = "waiting"
            if state != "done" and run_lock.locked(run):
                state += f" (training now: {run_lock.holder(run)})"
            elif state != "done" and record_name(method, seed) in on_ray:
                state += f" (on Ray: {on_ray[record_name(method, seed)]})"
            lines.append(f"{method:14s} seed {seed}: {state}")
    return lines


def in_flight(config: CompareConfig) -> dict[str, str]:
    """The runs a live Ray driver of ``config`` has in flight, by record name, and where each is ("attempt
    2 on node-3"): its :data:`IN_FLIGHT` note; empty when no driver holds ``output_dir``."""
    from udpo.training import run_lock

    path = Path(config.output_dir) / "logs" / IN_FLIGHT
    if not path.is_file() or not run_lock.locked(config.output_dir):
        return {}
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):  # (being replaced just now)
        return {}
    return {k: v for k, v in note.items() if k != "driver"}


def last_iteration(run: Path) -> int | None:
    """The last training iteration a run's metrics.jsonl records, read while it trains (a line being
    written is skipped); None before the first."""
    try:
        lines = RunFolder(run).metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(record, dict)
            and record.get("kind") == "train"
            and isinstance(record.get("iteration"), int)
        ):
            return record["iteration"]
    return None
