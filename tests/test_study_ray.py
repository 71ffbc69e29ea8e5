"""``udpo study PLAN --ray``: a study's runs as Ray tasks on a local cluster of two nodes (127.0.0.1 only),
placed by the plan's resources; the same records as the local executor; a worker killed mid-run is
retried and its run recorded once, a killed driver's study picks up where its records stop, and a run out
of attempts is reported failed with its log.

Marked slow: each test starts Ray processes (one cluster for the module) and trains in them."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from study_helpers import no_diagnosis_plots
from test_study import write_plan

from udpo.study import load_plan
from udpo.study.ray_executor import LOOPBACK_ONLY, RayCluster, hold_to_loopback
from udpo.study.record import EVALS, MACHINE, METRICS, RUN
from udpo.study.runner import format_progress

pytestmark = pytest.mark.slow

#: what a metrics line measures of the machine (times, throughput, this process's memory): the records of
#: one run trained twice agree on everything else
MACHINE_KEYS = ("time", "memory/", "tokens_per_s", "seconds")  # time: when; time/...: how long


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on 127.0.0.1: a head with 1 CPU, and a node with 2 CPUs and one (pretended) GPU."""
    pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in LOOPBACK_ONLY}, ray_constants.ENABLE_RAY_CLUSTER
    hold_to_loopback()  # before Ray starts its first process: every address on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        gpu_node = cluster.add_node(num_cpus=2, num_gpus=1)
        cluster.wait_for_nodes()
        assert {node["NodeManagerAddress"] for node in ray_nodes(cluster)} == {"127.0.0.1"}
        cluster.gpu_node_id = gpu_node.node_id
        yield cluster
    finally:
        cluster.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        for name, value in saved[0].items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def ray_nodes(cluster) -> list[dict]:
    import ray

    ray.init(address=cluster.address, log_to_driver=False)
    try:
        return ray.nodes()
    finally:
        ray.shutdown()


def untimed(record: Path) -> list[dict]:
    lines = gzip.decompress((record / METRICS).read_bytes()).decode().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(MACHINE_KEYS)} for x in lines]


def driver(plan: Path, address: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "udpo.cli", "study", str(plan), "--ray", address, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(check, what: str, limit: float = 120.0):
    deadline = time.monotonic() + limit
    while not (found := check()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return found


def trainer_pid(run: Path) -> int | None:
    """The pid of the process that holds the run folder's lock (the trainer, inside a Ray worker)."""
    from udpo.training import run_lock

    holder = run_lock.holder(run) if run_lock.locked(run) else None
    return int(holder.split()[1]) if holder else None


def test_runs_are_placed_by_the_plans_resources_and_record_what_the_local_workers_record(
    cluster, tiny_model, tmp_path, monkeypatch
):
    from udpo.study import study

    no_diagnosis_plots(monkeypatch)
    common = {"seeds": [0], "output_dir": str(tmp_path / "runs")}
    local = write_plan(
        tmp_path, tiny_model, **common, results_dir=str(tmp_path / "local"), tables_when_done=False
    )
    done = subprocess.run(
        [sys.executable, "-m", "udpo.cli", "study", str(local), "--workers", "2", "--no-progress"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    shutil.rmtree(tmp_path / "runs")  # the Ray study trains afresh, in the same run folders
    logs = tmp_path / "runs" / "logs"

    (tmp_path / "ray").mkdir()
    plan = write_plan(
        tmp_path / "ray", tiny_model, **common, results_dir=str(tmp_path / "on_ray"),
        resources={"num_cpus": 1, "num_gpus": 0.5},
    )  # fmt: skip
    assert study(load_plan(plan), ray=cluster.address) == 0

    for name in ("task_only_seed0", "coin_control_seed0"):
        ours, theirs = tmp_path / "on_ray" / "runs" / name, tmp_path / "local" / "runs" / name
        assert {p.name for p in ours.iterdir()} == {p.name for p in theirs.iterdir()}
        for file in (EVALS, RUN, "calibration.json"):
            assert (ours / file).read_bytes() == (theirs / file).read_bytes(), (name, file)
        ours_m, theirs_m = untimed(ours), untimed(theirs)
        assert len(ours_m) == len(theirs_m) > 0
        for a, b in zip(ours_m, theirs_m, strict=True):
            assert a == b, {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
        assert (
            json.loads((ours / MACHINE).read_text()).keys()
            == json.loads((theirs / MACHINE).read_text()).keys()
        )
        # both half-GPU runs went to the one node with a GPU, each with its share of the card's memory
        log = (logs / f"{name}.log").read_text()
        assert f"(Ray node {cluster.gpu_node_id[:8]})" in log and "0.5 of a GPU" in log
        assert log.count("== ") == 2 and log.rstrip().endswith("finished"), log
    assert (tmp_path / "on_ray" / "table.md").is_file()  # the driver wrote the tables


def test_a_killed_worker_is_retried_and_recorded_once_and_a_killed_drivers_study_picks_up(
    cluster, tiny_model, tmp_path, capsys
):
    plan = write_plan(
        tmp_path, tiny_model, methods=["standard_mad", "task_only"], resources={"num_cpus": 2},
        settings={"max_iterations": 3}, tables_when_done=False,
    )  # fmt: skip
    runs, records = tmp_path / "runs" / "task_only", tmp_path / "results" / "runs"
    logs = tmp_path / "runs" / "logs"

    def checkpointed(seed: int) -> bool:
        return (runs / f"seed_{seed}" / "checkpoints" / "iter_000001").is_dir()

    def status() -> str:
        from udpo.cli import main

        assert main(["study", str(plan), "--status"]) == 0
        return capsys.readouterr().out

    first = driver(plan, cluster.address)  # 2 CPUs a run: one at a time, on the 2-CPU node
    # the first run Ray starts is killed after its first checkpoint; its next attempt resumes it
    killed = wait_for(lambda: [s for s in (0, 1) if checkpointed(s)], "a first checkpoint")[0]
    os.kill(wait_for(lambda: trainer_pid(runs / f"seed_{killed}"), "its trainer"), signal.SIGKILL)
    # once one run is recorded (either), the driver is killed while the other one trains
    done = wait_for(
        lambda: [s for s in (0, 1) if (records / f"task_only_seed{s}" / RUN).is_file()], "a record"
    )
    left = 1 - done[0]
    wait_for(lambda: trainer_pid(runs / f"seed_{left}"), "the other run's trainer")
    live = format_progress(load_plan(plan))  # what --status prints
    first.kill()  # Ray ends its job's tasks with it
    assert live[1 - left] == f"task_only      seed {1 - left}: done", live
    assert "(training now: pid" in live[left] or "(on Ray: attempt" in live[left], live
    said = first.communicate()[0]
    wait_for(lambda: trainer_pid(runs / f"seed_{left}") is None, "the trainer to stop with its driver", 60)
    assert f"task_only_seed{killed}: attempt 1 lost (WorkerCrashedError" in said, said
    assert "attempt 2 of 3 submitted" in said and said.count("recorded (") == 1, said
    assert f"task_only      seed {left}: done" not in status()

    second = driver(plan, cluster.address)
    said = second.communicate(timeout=300)[0]
    assert second.returncode == 0, said
    assert "ray: 1 run(s) to train" in said and said.count("recorded (") == 1, said  # the one left alone
    for seed in (0, 1):
        metrics = untimed(records / f"task_only_seed{seed}")
        assert [r["iteration"] for r in metrics if r.get("kind") == "train"] == [1, 2, 3]  # none twice
        assert (logs / f"task_only_seed{seed}.log").read_text().rstrip().endswith("finished")
    log = (logs / f"task_only_seed{killed}.log").read_text()
    # its second attempt resumed the first one's checkpoint (the run folders are shared here)
    assert "== attempt 1 lost (WorkerCrashedError" in log and "attempt 2 on" in log, log
    assert "resuming its latest checkpoint" in log.split("attempt 2 on")[1], log
    assert f"task_only      seed {left}: done" in status()


def test_a_run_out_of_attempts_or_that_raises_is_reported_failed_with_its_log(
    cluster, tiny_model, tmp_path, capsys
):
    import threading

    plan = write_plan(tmp_path, tiny_model, methods=["standard_mad", "task_only"], seeds=[0])
    run, logs = tmp_path / "runs" / "task_only" / "seed_0", tmp_path / "runs" / "logs"
    killer = threading.Thread(target=lambda: os.kill(wait_for(lambda: trainer_pid(run), "the trainer"), 9))
    killer.start()
    assert RayCluster(cluster.address, retries=0).run(load_plan(plan)) == 1
    killer.join()
    log = (logs / "task_only_seed0.log").read_text()
    assert "== task_only_seed0: attempt 1 on" in log and "no attempt left: failed" in log
    assert not (tmp_path / "results" / "runs").exists()
    assert "task_only_seed0: attempt 1 lost (WorkerCrashedError" in capsys.readouterr().out

    (tmp_path / "raises").mkdir()  # a run that raises is not retried: its error, in its log too
    plan = write_plan(
        tmp_path / "raises", str(tmp_path / "no_such_model"), methods=["standard_mad", "task_only"], seeds=[0]
    )
    assert RayCluster(cluster.address).run(load_plan(plan)) == 1
    said = capsys.readouterr().out
    assert "ray: task_only_seed0: failed (" in said and "submitted" not in said, said
    log = (tmp_path / "raises" / "runs" / "logs" / "task_only_seed0.log").read_text()
    assert log.count("== task_only_seed0: attempt 1 on") == 1 and "== attempt 1 failed:" in log
    assert str(tmp_path / "no_such_model") in log.split("== attempt 1 failed:")[1], log
