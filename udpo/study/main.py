"""The study layer's one entry point, :func:`study`: what ``udpo study PLAN`` (and ``udpo compare --config
PLAN``) does with a checked plan (:func:`udpo.study.plan.load_plan`), printing what the command prints."""

from __future__ import annotations

from collections.abc import Sequence

from udpo.study.executor import Executor
from udpo.study.plan import CompareConfig
from udpo.study.runner import format_progress, run_compare, write_results
from udpo.study.tables import markdown_table, tables_path


def study(
    config: CompareConfig,
    *,
    status: bool = False,
    tables_only: bool = False,
    grader: str = "current",
    sample_size: float | None = None,
    second_stage: bool = False,
    workers: int = 1,
    worker_command: Sequence[str] = (),
    threads: int | None = None,
    gpu_memory_share: float | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool = True,
    ray: str | None = None,
) -> int:
    """Run one of the study's modes on ``config``; returns the exit status.

    ``status``: one line per run (done, started, waiting). ``sample_size``: the blind sample-size rule
    (:func:`udpo.study.sample_size.blind_sample_size`) for a difference of that size. ``second_stage``: the
    plan's second-stage rule (:func:`udpo.study.sample_size.second_stage`), one line. ``grader``
    (:data:`udpo.study.regrade.GRADERS`): how those two rules and ``tables_only`` grade the records:
    ``current`` re-grades every debate and writes its tables to ``results_dir/regraded/`` with the
    comparison of both graders; ``recorded`` reads them as recorded and writes to ``results_dir`` (the
    tables a study committed, reproducible). Tables written when training ends read the records as
    recorded: they were just graded. ``workers`` > 1:
    that many processes run ``worker_command`` (the study's own command line) and share the runs
    (:mod:`udpo.study.workers`; ``threads`` and ``gpu_memory_share`` per worker), then the progress and,
    when every run is recorded, the table. ``ray``: the runs are Ray tasks on the cluster at that address
    (``auto``, ``local`` or ``HOST:PORT``; :mod:`udpo.study.ray_executor`), each with the plan's
    ``resources``, then the same. ``tables_only``: the tables from the records alone. Otherwise
    this process trains the runs not yet done (only ``seeds`` when given) and prints the table once the
    last is recorded. Training refuses a plan whose headroom bounds its committed check does not meet
    (:func:`udpo.study.headroom.require_headroom`)."""
    if status:
        print("\n".join(format_progress(config)))
        return 0
    if second_stage:
        from udpo.study.sample_size import second_stage as stage_rule

        print(stage_rule(config, grader)[1])
        return 0
    if sample_size:
        from udpo.study.sample_size import blind_sample_size

        rule = blind_sample_size(config, sample_size, grader=grader)
        print(
            f"per-seed {rule.metric} change over Standard MAD, arms {', '.join(rule.arms)}, seeds "
            f"{', '.join(map(str, rule.seeds))}: pooled within-arm sd {rule.pooled_sd:.4f}; a difference of "
            f"{rule.effect:g} at a two-sided {rule.level:.0%} t-test with {rule.power:.0%} power needs "
            f"{rule.seeds_per_arm} seeds per arm"
        )
        return 0
    if not tables_only:  # training: a plan with headroom bounds needs its committed check within them
        from udpo.study.headroom import require_headroom

        require_headroom(config)
    executor: Executor | None = None
    if ray is not None:
        from udpo.study.ray_executor import RayCluster

        if workers > 1:
            raise ValueError("--ray and --workers are two executors: choose one")
        executor = RayCluster(ray)
    elif workers > 1:
        from udpo.study.workers import LocalWorkers, plan_workers

        if not worker_command:
            raise ValueError("workers > 1 needs the command line each worker runs")
        executor = LocalWorkers(worker_command, plan_workers(workers, threads, share=gpu_memory_share))
    if executor is not None:
        code = executor.run(config, seeds)
        print("\n".join(format_progress(config)))
        if code == 0 and config.all_recorded() and config.tables_when_done:
            print((config.results_path() / "table.md").read_text())
        return code
    results = (
        write_results(config, grader) if tables_only else run_compare(config, progress=progress, seeds=seeds)
    )
    if results is None:
        print(
            "every run is recorded; tables_when_done is false: no table written (--tables-only writes them)"
            if config.all_recorded()
            else "\n".join(
                [
                    "some runs are not done yet (other seeds, or trained by another process); the tables "
                    "follow when the last of them is recorded:",
                    *format_progress(config),
                ]
            )
        )
        return 0
    print(markdown_table(results))
    regraded = results.get("grader") == "current"
    print(
        f"wrote {tables_path(config, results.get('grader', 'recorded'))}: table.md, table.csv, runs.csv, "
        "budget.csv, forms.csv, results.json, diagnosis/" + (", comparison.md" if regraded else "")
    )
    return 0
