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
from udpo.study.grader_comparison import write_regraded
from udpo.study.plan import CompareConfig, check_budgets
from udpo.study.record import write_record
from udpo.study.regrade import check_grader
from udpo.study.tables import write_tables

#: written in a run folder when its run finished
DONE = "done.json"
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

    from udpo.training import checkpoint_store as ckpt
    from udpo.training import run_lock
    from udpo.training.run_lock import RunBusyError

    chosen = config.seeds if seeds is None else list(seeds)
    unknown = [s for s in chosen if s not in config.seeds]
    if unknown:
        raise ConfigError(f"seed(s) {unknown} are not among the config's seeds {config.seeds}")
    jobs = [(m, s) for s in chosen for m in config.trained()]
    jobs.sort(key=lambda job: not ckpt.list_checkpoints(config.run_dir(*job)))  # stable: started first
    for seed in config.seeds:
        check_budgets({m: config.train_config(m, seed) for m in config.trained()})
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
                resumable = bool(ckpt.list_checkpoints(run))
                if resumable:
                    tc.resume = "latest"
                bar.write(
                    f"[{i}/{len(jobs)}] {method}, seed {seed}"
                    f"{' (resuming its latest checkpoint)' if resumable else ''}: {run}"
                )
                train(tc)
                last = max(eval_iterations(run), default=0)
                write_json(run / DONE, {"method": method, "seed": seed, "final_eval": last})
                record_finished(config, method, seed)
        except RunBusyError as e:
            bar.write(f"[{i}/{len(jobs)}] left to the process that trains it: {e}")
            continue
        bar.write(f"[{i}/{len(jobs)}] recorded: {config.record_dir(method, seed)}")
    bar.close()
    if not config.tables_when_done or not config.all_recorded():
        return None
    return write_results(config)


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
    the last one, in its final evaluation) or waiting, and which process trains it now."""
    from udpo.training import checkpoint_store as ckpt
    from udpo.training import run_lock

    lines = []
    for seed in config.seeds:
        for method in config.trained():
            run = config.run_dir(method, seed)
            if config.recorded(method, seed):
                state = "done"
            elif (run / DONE).exists():
                state = "done, its record not written yet"
            elif ckpt.list_checkpoints(run):
                state = f"started, latest checkpoint {ckpt.resolve(run, 'latest').name}"
                k, total = last_iteration(run), config.train_config(method, seed).max_iterations
                if k is not None:
                    state += f", iteration {k}" + (f" of {total}" if total else "")
                    state += ", final evaluation" if k == total else ""
            else:
                state = "waiting"
            if state != "done" and run_lock.locked(run):
                state += f" (training now: {run_lock.holder(run)})"
            lines.append(f"{method:14s} seed {seed}: {state}")
    return lines


def last_iteration(run: Path) -> int | None:
    """The last training iteration a run's metrics.jsonl records, read while it trains (a line being
    written is skipped); None before the first."""
    from udpo.training.tracking import METRICS_FILE

    try:
        lines = (run / METRICS_FILE).read_text(encoding="utf-8").splitlines()
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
