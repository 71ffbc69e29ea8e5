"""The pieces of ``udpo study --ray`` that need no cluster: the plan's ``resources``, a record handed over
as files, where a Ray study's runs in flight show in ``--status``, the output a task streams, which
addresses are held to 127.0.0.1, and the command line. (The Ray runs themselves: tests/test_study_ray.py,
slow.)"""

from __future__ import annotations

import os

import pytest
from study_helpers import finished_run
from test_study import write_plan

from udpo.config import ConfigError
from udpo.study.plan import RESOURCES, CompareConfig, check_resources
from udpo.study.ray_executor import bootstrap_address, loopback, share, streamed_output, threads
from udpo.study.record import RUN, place_record, record_files, write_record
from udpo.study.runner import IN_FLIGHT, format_progress
from udpo.training import run_lock


def test_a_plans_resources_are_checked_and_filled_in():
    assert check_resources({}) == RESOURCES == {"num_cpus": 1, "num_gpus": 0}
    assert check_resources({"num_gpus": 0.25}) == {"num_cpus": 1, "num_gpus": 0.25}
    assert check_resources({"num_cpus": 0.5, "num_gpus": 2}) == {"num_cpus": 0.5, "num_gpus": 2}
    for bad, message in [
        ({"gpus": 1}, "a mapping of num_cpus and num_gpus"),
        ([1], "a mapping"),
        ({"num_cpus": 0}, "num_cpus must be > 0"),
        ({"num_gpus": -1}, "num_gpus must be a number >= 0"),
        ({"num_gpus": True}, "num_gpus must be a number"),
        ({"num_gpus": 1.5}, "a fraction below 1 or a whole number"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_resources(bad)
    assert (threads({"num_cpus": 0.5}), threads({"num_cpus": 4})) == (1, 4)
    assert [share({"num_gpus": g}) for g in (0, 0.5, 1, 2)] == [None, 0.5, None, None]


def test_a_record_handed_over_as_files_is_the_record(tmp_path):
    run = tmp_path / "run"
    finished_run(run, "task_only", [True, False], [True, True])
    record = write_record(run, tmp_path / "there", "task_only", 0)
    files = record_files(record.folder)
    assert RUN in files and all(isinstance(v, bytes) for v in files.values())
    here = place_record(files, tmp_path / "here")
    assert record_files(here.folder) == files and here.evaluation(1) == record.evaluation(1)
    with pytest.raises(ValueError, match="not a run record's files"):
        place_record({**files, "../x": b""}, tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="run.json is missing"):
        record_files(tmp_path / "run")


def test_status_names_a_live_ray_drivers_runs_in_flight(tmp_path):
    config = CompareConfig.load(write_plan(tmp_path, "smollm2-135m-instruct", seeds=[0]))
    logs = tmp_path / "runs" / "logs"
    logs.mkdir(parents=True)
    (logs / IN_FLIGHT).write_text('{"driver": "pid 1 on h", "task_only_seed0": "attempt 2 on node-3"}')
    assert format_progress(config)[0] == "task_only      seed 0: waiting"  # no driver holds output_dir
    with run_lock.held(config.output_dir):
        assert format_progress(config) == [
            "task_only      seed 0: waiting (on Ray: attempt 2 on node-3)",
            "coin_control   seed 0: waiting",
        ]


def test_a_tasks_output_streams_from_its_file_descriptors(capfd):
    sent = []
    with streamed_output(sent.append):  # fd 1: print's outside pytest's capture, C code's, children's
        os.write(1, b"from fd 1\n")
        os.write(2, b"from fd 2\n")
    os.write(1, b"after\n")
    assert "".join(sent) == "from fd 1\nfrom fd 2\n"
    assert capfd.readouterr().out == "after\n"


def test_one_machine_addresses_are_held_to_loopback(monkeypatch):
    assert [loopback(a) for a in ("local", "127.0.0.1:6379", "localhost:1", "ray://[::1]:10001")] == [
        True
    ] * 4
    assert not loopback("10.0.0.2:6379") and not loopback("auto")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert bootstrap_address("auto") == "10.0.0.2:6379" and bootstrap_address("local") == "local"


def test_the_command_hands_the_ray_address_to_the_study_and_refuses_mixed_executors(
    tmp_path, monkeypatch, capsys
):
    from udpo.cli import main
    from udpo.study import ray_executor

    plan = write_plan(tmp_path, "smollm2-135m-instruct")
    ran = []
    monkeypatch.setattr(
        ray_executor.RayCluster, "run", lambda self, config, seeds: ran.append((self, seeds)) or 0
    )
    assert main(["study", str(plan), "--ray", "--seed", "1"]) == 0
    assert main(["study", str(plan), "--ray", "10.0.0.2:6379"]) == 0
    assert [(r.address, s) for r, s in ran] == [("auto", [1]), ("10.0.0.2:6379", None)]
    for extra in (["--workers", "2"], ["--threads", "2"], ["--status"]):
        assert main(["study", str(plan), "--ray", *extra]) == 2
        assert "--ray" in capsys.readouterr().err.splitlines()[-1]
