"""``udpo study``: each run of a plan is recorded, compressed, in a folder meant to be committed as it
finishes; an interrupted run resumes from its checkpoint; every table is rebuilt from the records alone
once the run folders are gone; several worker processes share the machine on purpose."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from study_helpers import finished_run, no_diagnosis_plots
from train_helpers import read_jsonl

from udpo.study.plan import CompareConfig
from udpo.study.record import EVALS, MACHINE, METRICS, RUN, RunRecord, write_record
from udpo.study.runner import format_progress, run_compare, write_results
from udpo.study.workers import Worker, plan_workers, run_workers
from udpo.training.callbacks import UDPOCallback
from udpo.training.trainer import Trainer, train

#: a single agent, no debate round, 2 iterations of 2 questions x 2 draws: the proof run's shape, tiny
RECIPE = {
    "task": "arithmetic",
    "task_options": {"difficulty": 1, "n_questions": 20},
    "n_agents": 1,
    "rounds": 0,
    "max_tokens": 4,
    "questions_per_iteration": 2,
    "debates_per_question": 2,
    "baseline": "group",
    "debate_batch_size": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_scheduler_type": "constant",
    "eval_questions": 2,
    "eval_question_seed": 5,
    "eval_steps": 0,
    "max_iterations": 2,
    "save_steps": 1,
    "warmup_fraction": 0.0,
    "alpha": [0.0],
    "beta": [0.0],
    "gamma": [0.0],
    "lambda_": [1.0],
    "eta": [0.01],
    "progress": False,
}


def write_plan(tmp_path: Path, model: str, **plan) -> Path:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({**RECIPE, "model": model}))
    path = tmp_path / "plan.yaml"
    values = {
        "recipe": "recipe.yaml",
        "methods": ["standard_mad", "task_only", "coin_control"],
        "seeds": [0, 1],
        "output_dir": str(tmp_path / "runs"),
        "results_dir": str(tmp_path / "results"),
        "bootstrap_resamples": 200,  # the machinery, not the numbers
        **plan,
    }
    path.write_text(yaml.safe_dump(values))
    return path


class Interrupted(Exception):
    pass


class StopAtCheckpoint(UDPOCallback):
    """Stop the run right after its checkpoint of iteration 1, as a machine that goes away would."""

    def on_save(self, trainer, iteration, path):
        if iteration == 1:
            raise Interrupted


@pytest.mark.slow
def test_a_study_records_each_run_as_it_finishes_resumes_and_rebuilds_its_tables_from_the_records(
    tiny_model, tmp_path, monkeypatch
):
    from udpo.cli import main

    no_diagnosis_plots(monkeypatch)
    plan = write_plan(tmp_path, tiny_model)
    config = CompareConfig.load(plan)
    runs = tmp_path / "results" / "runs"
    started = []

    def first_session(tc):
        started.append((tc.run_name, sorted(p.parent.name for p in runs.glob("*/run.json"))))
        if tc.run_name == "coin_control-seed1":  # the machine goes away during the last run
            with Trainer(tc, callbacks=[StopAtCheckpoint()]) as trainer:
                trainer.train()
        return train(tc)

    with pytest.raises(Interrupted):
        run_compare(config, train=first_session, progress=False)
    # each run was recorded as it finished, before the next started
    assert started == [
        ("task_only-seed0", []),
        ("coin_control-seed0", ["task_only_seed0"]),
        ("task_only-seed1", ["coin_control_seed0", "task_only_seed0"]),
        ("coin_control-seed1", ["coin_control_seed0", "task_only_seed0", "task_only_seed1"]),
    ]
    assert (
        format_progress(config)[-1]
        == "coin_control   seed 1: started, latest checkpoint iter_000001, iteration 1 of 2"
    )
    assert not (tmp_path / "results" / "table.md").exists()

    resumed = []

    def second_session(tc):
        resumed.append((tc.run_name, tc.resume))
        return train(tc)

    results = run_compare(config, train=second_session, progress=False)
    assert resumed == [("coin_control-seed1", "latest")]  # the finished runs are not trained again
    metrics = read_jsonl(config.run_dir("coin_control", 1) / "metrics.jsonl")
    assert [r["iteration"] for r in metrics if r.get("kind") == "train"] == [1, 2]  # resumed, not restarted
    assert results["seeds"] == [0, 1] and results["missing"] == []
    record = RunRecord.load(runs / "coin_control_seed1")
    assert (record.method, record.seed, record.evaluations) == ("coin_control", 1, [2])  # Standard MAD:
    assert RunRecord.load(runs / "task_only_seed1").evaluations == [0, 2]  # the first method's iteration 0
    assert record.budget["optimizer_steps"] == 2 and record.config["task_reward"] == "coin"
    for folder in runs.iterdir():
        assert {p.name for p in folder.iterdir()} == {EVALS, METRICS, RUN, MACHINE, "calibration.json"}
        assert sum(p.stat().st_size for p in folder.iterdir()) < 300_000

    table = (tmp_path / "results" / "table.md").read_text()
    numbers = json.loads((tmp_path / "results" / "results.json").read_text())
    assert "| coin_control | collapse_rate |" in table and "| task_only | 1 | 2 |" in table
    # each agent's answer forms, every turn of the records read again by the runs' task
    assert {(r["method"], r["seed"]) for r in numbers["forms"]} == {
        (m, s) for m in numbers["methods"] for s in (0, 1)
    }
    assert all(r["turns"] > 0 and r["unknown"] == 0 for r in numbers["forms"])
    assert "| task_only | 1 | agent_0 |" in table and (tmp_path / "results" / "forms.csv").is_file()
    shutil.rmtree(tmp_path / "runs")  # the machine is gone; the committed folder is left
    (tmp_path / "results" / "table.md").unlink()
    assert main(["study", str(plan), "--tables-only", "--grader", "recorded", "--no-progress"]) == 0
    assert (tmp_path / "results" / "table.md").read_text() == table
    assert json.loads((tmp_path / "results" / "results.json").read_text()) == numbers
    assert not (tmp_path / "runs").exists()  # the tables read no run folder
    # re-graded (the default): fresh records were graded by today's grader and vote, so nothing changes
    assert main(["study", str(plan), "--tables-only", "--no-progress"]) == 0
    regraded = json.loads((tmp_path / "results" / "regraded" / "results.json").read_text())
    assert {m: e["accuracy"] for m, e in regraded["methods"].items()} == {
        m: e["accuracy"] for m, e in numbers["methods"].items()
    }
    changed = regraded["grader_comparison"]["totals"]
    assert changed["turns"] > 0 and not any(v for k, v in changed.items() if k not in ("turns", "votes"))
    assert (tmp_path / "results" / "table.md").read_text() == table  # the tables as recorded stay


def test_a_record_is_compact_reproducible_and_reads_back_its_evaluations(tmp_path):
    run = tmp_path / "run"
    finished_run(run, "udpo", [True, False, True], [True, True, True])
    (run / "calibration.json").write_text('{"coefficients": {}}\n')
    first = write_record(run, tmp_path / "a", "udpo", 3)
    again = write_record(run, tmp_path / "b", "udpo", 3)
    for name in (EVALS, METRICS, "calibration.json"):
        assert (first.folder / name).read_bytes() == (again.folder / name).read_bytes(), name
    lines = gzip.decompress((first.folder / EVALS).read_bytes()).decode().splitlines()
    assert len(lines) == 6 and "logprobs" not in lines[0] and "prompt_ids" not in lines[0]
    assert (first.method, first.seed, first.evaluations, first.final_eval) == ("udpo", 3, [0, 1], 1)
    assert first.budget == {
        "iterations": 1,
        "debates": 2,
        "optimizer_steps": 1,
        "generated_tokens": 30,
        "warmup_debates": 0,
    }
    assert [t.correct for t in first.evaluation(0)] == [True, False, True]
    assert [t.answers for t in first.evaluation(1)] == [[["4", "4"], ["4", "4"]]] * 3
    assert first.metrics("train")[0]["update/kl"] == 0.5
    with pytest.raises(KeyError, match="no evaluation at iteration 7"):
        first.evaluation(7)
    (first.folder / RUN).unlink()
    with pytest.raises(FileNotFoundError, match="no finished run record"):
        RunRecord.load(first.folder)


def test_a_record_names_its_machine_and_numeric_path(tmp_path, monkeypatch):
    """machine.json: this CPU and its cores, no GPU here, the config's dtype as resolved on this machine."""
    import torch

    from udpo.env.backends.machine import cpu_model

    run = tmp_path / "run"
    finished_run(run, "udpo", [True], [True])
    for dtype, forced, resolved in (
        ("fp32", None, "fp32"),
        ("auto", "bf16", "bf16"),
        ("auto", "fp32", "fp32"),
    ):
        (run / "config.json").write_text(json.dumps({"dtype": dtype}))
        if forced:
            monkeypatch.setenv("UDPO_DTYPE", forced)
        facts = json.loads((write_record(run, tmp_path / dtype, "udpo", 0).folder / MACHINE).read_text())
        assert facts["cpu"] == cpu_model() and facts["cores"] == os.cpu_count() and facts["gpu"] is None
        assert facts["dtype"] == resolved and facts["torch"] == torch.__version__


def study_collect_script():
    """scripts/study_collect.py as a module."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "study_collect.py"
    spec = importlib.util.spec_from_file_location("study_collect", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_study_collect_copies_new_records_names_their_machine_and_refuses_a_different_one(
    tmp_path, monkeypatch, capsys
):
    """scripts/study_collect.py: a pinned study's finished records are copied (with machine.json naming the
    GPU they came from), an unfinished one is left, one already here is kept, and a record that differs
    from the one here is refused (exit 1)."""
    plan = write_plan(tmp_path, "tiny")
    source = tmp_path / "gpu_out"
    for seed in (0, 1):
        finished_run(tmp_path / f"run{seed}", "task_only", [True, seed == 0], [True, True], seed=seed)
        write_record(tmp_path / f"run{seed}", source / f"task_only_seed{seed}", "task_only", seed)
    (source / "task_only_seed0" / MACHINE).unlink()  # written by pinned code older than machine.json
    (source / "task_only_seed1" / RUN).unlink()  # stopped before its record was finished
    study_collect = study_collect_script()
    monkeypatch.chdir(tmp_path)

    def collect() -> tuple[int, str]:
        status = study_collect.main([str(plan), "--from", str(source), "--gpu", "NVIDIA H200"])
        return status, capsys.readouterr().out

    status, out = collect()
    assert status == 0
    assert "task_only_seed0: collected (NVIDIA H200, " in out
    assert "task_only_seed1: unfinished" in out
    here = tmp_path / "results" / "runs"
    assert sorted(p.name for p in here.iterdir()) == ["task_only_seed0"]
    assert json.loads((here / "task_only_seed0" / MACHINE).read_text())["gpu"] == "NVIDIA H200"
    assert (here / "task_only_seed0" / EVALS).read_bytes() == (
        source / "task_only_seed0" / EVALS
    ).read_bytes()
    assert collect()[0] == 0  # already here: kept
    (source / "task_only_seed0" / METRICS).write_bytes(b"")
    status, out = collect()
    assert status == 1 and "differs from the record already" in out


def test_study_collect_commits_each_collected_record_alone(tmp_path, monkeypatch, capsys):
    """``--commit``: the script (not the library) commits each record it collected, in the checkout that
    holds it, one commit a record, naming the study, the run and its machine."""
    plan = write_plan(tmp_path, "tiny")
    source = tmp_path / "elsewhere"
    for seed in (0, 1):
        finished_run(tmp_path / f"run{seed}", "task_only", [True, True], [True, True], seed=seed)
        write_record(tmp_path / f"run{seed}", source / f"task_only_seed{seed}", "task_only", seed)
        (source / f"task_only_seed{seed}" / MACHINE).unlink()  # written here, naming --gpu
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", plan.name], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "plan"], check=True)
    monkeypatch.chdir(tmp_path)
    for key, value in {"NAME": "t", "EMAIL": "t@t"}.items():
        monkeypatch.setenv(f"GIT_AUTHOR_{key}", value)
        monkeypatch.setenv(f"GIT_COMMITTER_{key}", value)
    assert study_collect_script().main([str(plan), "--from", str(source), "--gpu", "G1", "--commit"]) == 0
    here = tmp_path / "results" / "runs"
    dtypes = {s: json.loads((here / f"task_only_seed{s}" / MACHINE).read_text())["dtype"] for s in (0, 1)}
    pin = subprocess.run([*git, "rev-parse", "--short=7", "HEAD~2"], capture_output=True, text=True).stdout
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True, check=True).stdout
    assert log.splitlines() == [  # the source folder is inside this checkout: its commit is the pin
        *(f"results: record of task_only_seed{s} (at {pin.strip()}, G1, {dtypes[s]})" for s in (1, 0)),
        "plan",
    ]
    for seed in (0, 1):
        changed = subprocess.run(
            [*git, "show", "--name-only", "--format=", f"HEAD~{1 - seed}"], capture_output=True, text=True
        ).stdout.split()
        assert changed and all(p.startswith(f"results/runs/task_only_seed{seed}/") for p in changed)
    assert "task_only_seed0: committed: results: record of task_only_seed0" in capsys.readouterr().out


def test_the_tables_cover_the_seeds_with_every_run_recorded_and_name_the_missing(tmp_path, monkeypatch):
    """A missing run leaves its seed out of every table, by name; the first table gives no interval for
    the change where the seeds share their problems (that interval treated seeds x questions as independent
    cells): the pre-registered ones are in the seed table."""
    no_diagnosis_plots(monkeypatch)
    config = CompareConfig.load(write_plan(tmp_path, "smollm2-135m-instruct"))
    start = [True, False, False, False]
    finished_run(config.run_dir("task_only", 0), "task_only", start, [True, True, True, False])
    finished_run(config.run_dir("coin_control", 0), "coin_control", start, [True, False, False, True])
    finished_run(config.run_dir("task_only", 1), "task_only", start, [True, True, False, False], seed=1)
    results = write_results(config)
    assert results["seeds"] == [0] and results["missing"] == ["coin_control seed 1"]
    assert sorted(p.name for p in (tmp_path / "results" / "runs").iterdir()) == [
        "coin_control_seed0",
        "task_only_seed0",
        "task_only_seed1",
    ]
    table = (tmp_path / "results" / "table.md").read_text()
    assert "Missing (no record, left out of every table): coin_control seed 1." in table
    assert "| task_only | 0.750 [" in table and "| +0.500 (intervals: next table) | 0.750 |" in table
    assert "| task_only | accuracy | +0.500 |" in table
    assert results["methods"]["task_only"]["accuracy"]["change_low"] is None


@pytest.mark.slow
def test_workers_get_their_threads_and_cores_on_purpose(tmp_path):
    # each worker also gets its share of one GPU's memory: 1/K (tests/test_gpu_share.py)
    assert plan_workers(2, cores=[0, 1], environ={}) == [Worker(0, 1, (0,), 0.5), Worker(1, 1, (1,), 0.5)]
    assert plan_workers(3, cores=[0, 1], environ={}) == [Worker(k, 1, (), 1 / 3) for k in range(3)]
    assert plan_workers(2, threads=4, cores=range(16), environ={}) == [
        Worker(0, 4, (0, 1, 2, 3), 0.5),
        Worker(1, 4, (4, 5, 6, 7), 0.5),
    ]
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        plan_workers(0)
    core = min(os.sched_getaffinity(0))
    report = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['UDPO_NUM_THREADS'])"
    workers = [Worker(0, 1, (core,)), Worker(1, 2)]
    assert run_workers([sys.executable, "-c", report], workers, tmp_path / "logs") == 0
    logs = [(tmp_path / "logs" / f"worker_{k}.log").read_text().split("] ") for k in (0, 1)]
    assert logs[0] == [f"[{core}", "1\n"]
    assert logs[1] == [str(sorted(os.sched_getaffinity(0)))[:-1], "2\n"]
    assert run_workers([sys.executable, "-c", "raise SystemExit(3)"], workers, tmp_path / "logs") == 3


def test_a_blind_plan_records_its_runs_and_writes_no_table_until_asked(tmp_path, monkeypatch):
    """tables_when_done: false (a pilot blind to its arms until its sample-size rule is recorded): the last
    run is recorded and nothing is tabulated; --tables-only writes the tables."""
    no_diagnosis_plots(monkeypatch)
    config = CompareConfig.load(
        write_plan(tmp_path, "smollm2-135m-instruct", tables_when_done=False, seeds=[0])
    )
    for method in ("task_only", "coin_control"):
        finished_run(config.run_dir(method, 0), method, [True, False], [True, True])

    def must_not_train(tc):
        raise AssertionError(f"{tc.run_name} was done")

    assert run_compare(config, train=must_not_train, progress=False) is None
    assert config.recorded("task_only", 0) and config.recorded("coin_control", 0)
    assert not (tmp_path / "results" / "table.md").exists()
    assert write_results(config)["seeds"] == [0] and (tmp_path / "results" / "table.md").exists()


def test_every_plans_records_are_committable():
    """A plan's records are meant to be committed: git must not ignore ``<results_dir>/runs/``."""
    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs a git checkout")
    plans = [yaml.safe_load(p.read_text()) for p in sorted((root / "recipes" / "compare").glob("*.yaml"))]
    records = [
        Path(plan["results_dir"]) / "runs" / "m_seed0" / RUN for plan in plans if plan.get("results_dir")
    ]
    assert records, "no plan names a results_dir"
    for record in records:
        ignored = subprocess.run(["git", "check-ignore", "-q", str(record)], cwd=root)
        assert ignored.returncode == 1, f"git ignores {record}: a study's records would never be committed"


def test_the_command_checks_its_plan_and_hands_its_workers_their_command_line(tmp_path, monkeypatch):
    """``udpo study`` parses; ``udpo.study`` checks the plan and runs it: the workers get the command line
    the CLI built (with its --output-dir and --seed), and the study layer refuses workers without one."""
    from udpo.cli import main
    from udpo.study import load_plan, study
    from udpo.study import workers as study_workers

    plan, elsewhere = write_plan(tmp_path, "smollm2-135m-instruct"), tmp_path / "elsewhere"
    config = load_plan(plan, output_dir=str(elsewhere))
    assert config.output_dir == str(elsewhere) and config.trained() == ["task_only", "coin_control"]
    with pytest.raises(ValueError, match="workers > 1 needs the command line"):
        study(config, workers=2)
    started = []
    monkeypatch.setattr(
        study_workers,
        "run_workers",
        lambda command, workers, log_dir: started.append((command, workers, log_dir)) or 0,
    )
    assert main(["study", str(plan), "--workers", "2", "--seed", "1", "--output-dir", str(elsewhere)]) == 0
    [(command, workers, log_dir)] = started
    assert command == [
        sys.executable,
        "-m",
        "udpo.cli",
        "study",
        str(plan),
        "--no-progress",
        "--output-dir",
        str(elsewhere),
        "--seed=1",
    ]
    assert len(workers) == 2 and log_dir == elsewhere / "logs"
    (tmp_path / "blind").mkdir()
    no_eval = write_plan(tmp_path / "blind", "smollm2-135m-instruct", settings={"eval_questions": 0})
    with pytest.raises(ValueError, match="a study needs eval_questions > 0"):
        load_plan(no_eval)


def test_per_arm_rows_are_the_mean_and_range_of_the_arms_runs_and_skip_what_was_never_logged():
    """The per-arm table of table.md: each per-run column's mean over an arm's seeds [lowest, highest],
    '-' where no run of the arm logged it (a method that never clips: no clip fraction)."""
    from udpo.study.tables import RUN_COLUMNS, arm_summaries, markdown_table

    def row(method: str, seed: int, kl: float | None, cut: float) -> dict:
        values = dict.fromkeys(RUN_COLUMNS, 1.0)
        return {"method": method, "seed": seed, **values, "kl": kl, "cut_share": cut}

    runs = [row("udpo", 0, 2.0, 0.1), row("udpo", 1, 6.0, 0.3), row("task_only", 0, None, 0.2)]
    arms = arm_summaries(runs)
    assert list(arms) == ["udpo", "task_only"] and arms["udpo"]["seeds"] == 2
    assert arms["udpo"]["kl"] == {"mean": 4.0, "low": 2.0, "high": 6.0}
    assert arms["udpo"]["cut_share"] == pytest.approx({"mean": 0.2, "low": 0.1, "high": 0.3})
    assert arms["task_only"]["kl"] is None
    table = markdown_table({"methods": {}, "runs": runs})
    kl = list(RUN_COLUMNS).index("kl")
    udpo_row = next(line for line in table.splitlines() if line.startswith("| udpo | 2 |"))
    assert udpo_row.split(" | ")[2 + kl] == "4 [2, 6]"
    task_row = next(line for line in table.splitlines() if line.startswith("| task_only | 1 |"))
    assert task_row.split(" | ")[2 + kl] == "-"
