"""scripts/gpu_study.py, the pinned study's runs on a lent GPU machine in two calls (docs/lab/gpu_study.md):
which runs the GPU takes, how the model is cut to travel, the pack itself (in a scratch repository), the
converted model's fingerprint, the records copied as they land, and the stop at the deadline. Fast: no
model is loaded, nothing trains (the whole job on a tiny plan is run by hand: the page's CPU check)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_study.py"
PLAN = "recipes/compare/debate_reward.yaml"


@pytest.fixture(scope="module")
def gs():
    spec = importlib.util.spec_from_file_location("gpu_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_study"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def plan(gs):
    return gs.Plan(("task_only", "udpo"), tuple(range(8)), "runs/dr", "docs/lab/results/dr", False)


def test_the_plan_is_read_with_the_runner_s_own_folder_names(gs):
    from udpo.study.plan import CompareConfig

    ours = gs.Plan.read(ROOT / PLAN)
    theirs = CompareConfig.load(ROOT / PLAN)
    assert ours.methods == tuple(theirs.trained()) == ("task_only", "udpo")
    assert ours.seeds == tuple(theirs.seeds) == tuple(range(8))
    assert not ours.tables_when_done
    for method, seed in [("task_only", 0), ("udpo", 7)]:
        name = gs.run_name(method, seed)
        assert ours.run_dir(name) == theirs.run_dir(method, seed)
        assert ours.record_dir(name) == theirs.record_dir(method, seed)


def test_by_default_the_gpu_takes_whole_free_seeds_highest_first(gs, plan):
    recorded = ["task_only_seed0", "udpo_seed0"]
    picked = gs.pick(plan, recorded, ["udpo_seed1"])  # the CPU started one arm of seed 1
    assert picked.seeds == [7, 6, 5, 4, 3, 2]
    assert picked.runs[:3] == ["task_only_seed7", "udpo_seed7", "task_only_seed6"] and len(picked.runs) == 12
    assert picked.skip == []
    assert picked.notes == ["seed 1: left to the CPU (a run started or recorded there)"]
    assert gs.pick(plan, plan.runs(), []).runs == []


def test_asked_runs_and_seeds_keep_their_order_and_a_split_seed_is_marked(gs, plan):
    picked = gs.pick(plan, ["task_only_seed0"], ["udpo_seed5"], ["udpo_seed7", "0", "udpo_seed5"])
    assert picked.seeds == [7, 0, 5]
    assert picked.runs == ["udpo_seed7", "udpo_seed0", "udpo_seed5"]
    # the arms left to another machine get a marker; a recorded one too (the pinned tree has no records)
    assert picked.skip == ["task_only_seed7", "task_only_seed0", "task_only_seed5"]
    assert "udpo_seed5: started on the CPU too" in picked.notes[0]
    assert [n.split(" split")[0] for n in picked.notes[1:]] == ["seed 7", "seed 5"]  # seed 0's other is done
    for bad, why in [
        ("task_only_seed0", "recorded already"),
        ("udpo_seed8", "not a run"),
        ("mappo_seed1", "not a run"),
        ("udpo7", "not a run name"),
    ]:
        with pytest.raises(gs.PackError, match=why):
            gs.pick(plan, ["task_only_seed0"], [], [bad])


def test_taken_reads_records_here_and_run_folders_of_the_cpu_s_study(gs, plan, tmp_path):
    main, study = tmp_path / "main", tmp_path / "study"
    (main / plan.record_dir("udpo_seed0")).mkdir(parents=True)
    (main / plan.record_dir("udpo_seed0") / "run.json").write_text("{}")
    (main / plan.record_dir("task_only_seed0")).mkdir(parents=True)  # no run.json: unfinished, not recorded
    (study / plan.record_dir("task_only_seed0")).mkdir(parents=True)
    (study / plan.record_dir("task_only_seed0") / "run.json").write_text("{}")
    for name in ["task_only_seed0", "udpo_seed0", "task_only_seed1"]:
        (study / plan.run_dir(name)).mkdir(parents=True)
    assert gs.taken(plan, [main, study], study) == {
        "recorded": ["task_only_seed0", "udpo_seed0"],
        "started": ["task_only_seed1"],
    }
    assert gs.taken(plan, [main], None) == {"recorded": ["udpo_seed0"], "started": []}


def test_the_model_is_cut_as_evenly_as_both_calls_allow(gs):
    mib = 2**20
    # the real sizes: the 98,362,432-byte GGUF, a 5 MiB checkout, 6.7 MiB of wheels, a 2.3 MiB tree
    first, second = gs.split(98_362_432, 5 * mib + int(6.7 * mib), 5 * mib + int(2.3 * mib))
    assert first + second == 98_362_432 and abs(first - second) <= 1
    # little room in call 1: it takes what fits, call 2 the rest
    first, second = gs.split(100, 50, 10, limit=100, margin=5)
    assert (first, second) == (45, 55)
    with pytest.raises(gs.PackError, match=r"does not fit in two calls .* call 1 carries .* call 2"):
        gs.split(100, 50, 50, limit=100, margin=5)
    with pytest.raises(gs.PackError):
        gs.split(10, 120, 0, limit=100, margin=5)


def test_the_pin_is_the_one_the_plan_page_names(gs):
    assert gs.pin_of(ROOT / "docs" / "lab" / "plan_debate_reward.md") == "1255960"


def _model_folder(path: Path, tensors: dict, template: str = "{{ x }}") -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    from tokenizers import Tokenizer, models

    vocab = {"a": 0, "b": 1, "ab": 2, "?": 3}
    Tokenizer(models.BPE(vocab, [("a", "b")], unk_token="?")).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "b"}))
    (path / "chat_template.jinja").write_text(template)
    (path / "config.json").write_text(json.dumps({"hidden_size": 4, "transformers_version": "x"}))
    return path


def test_the_fingerprint_reads_the_tensors_not_the_file_layout(gs, tmp_path):
    import torch

    w, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(3, dtype=torch.bfloat16)
    one = gs.digest(_model_folder(tmp_path / "one", {"w": w, "b": b}))
    assert gs.digest(_model_folder(tmp_path / "two", {"b": b, "w": w})) == one  # another order, same model
    read = {name: data for name, _, _, data in gs.safetensors_tensors(tmp_path / "one" / "model.safetensors")}
    assert read["w"] == w.numpy().tobytes()
    changed = w.clone()
    changed[1, 2] += 1e-6
    other = gs.digest(_model_folder(tmp_path / "three", {"w": changed, "b": b}))
    assert gs.compare_digest(other, one) == ["weights"]
    templated = gs.digest(_model_folder(tmp_path / "four", {"w": w, "b": b}, template="{{ y }}"))
    assert gs.compare_digest(templated, one) == ["tokenizer"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_the_pack_holds_both_pieces_the_pinned_tree_and_what_is_taken(gs, tmp_path, capsys):
    import torch

    repo = tmp_path / "repo"
    (repo / "recipes" / "compare").mkdir(parents=True)
    (repo / "recipes" / "compare" / "p.yaml").write_text(
        "recipe: r.yaml\nmethods: [standard_mad, task_only, udpo]\nseeds: [0, 1, 2]\noutput_dir: runs/p\n"
        "results_dir: results/p\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "plan")
    (repo / "results" / "p" / "runs" / "udpo_seed0").mkdir(parents=True)
    (repo / "results" / "p" / "runs" / "udpo_seed0" / "run.json").write_text("{}")
    study = tmp_path / "study"
    (study / "runs" / "p" / "task_only" / "seed_1").mkdir(parents=True)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(os.urandom(300_001))
    converted = _model_folder(tmp_path / "converted", {"w": torch.zeros(2)})
    manifest = gs.pack(
        repo, repo / ".gpu_study", "HEAD", "recipes/compare/p.yaml", gguf, converted, study, repo / ".whl"
    )
    pack = repo / ".gpu_study"
    pieces = [(pack / p).read_bytes() for p in gs.PIECES]
    assert pieces[0] + pieces[1] == gguf.read_bytes() and abs(len(pieces[0]) - len(pieces[1])) <= 1
    assert manifest["recorded"] == ["udpo_seed0"] and manifest["started"] == ["task_only_seed1"]
    assert (
        manifest["digest"] == gs.digest(converted)
        and manifest["pin"] == _git(repo, "rev-parse", "HEAD").strip()
    )
    assert json.loads((pack / gs.MANIFEST).read_text()) == manifest
    with tarfile.open(pack / gs.TREE) as tar:
        assert "recipes/compare/p.yaml" in tar.getnames()
    # ignored by git: no call carries it unless named
    assert "/.gpu_study/" in (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert _git(repo, "status", "--porcelain", "--untracked-files=all").split() == [
        "??",
        "results/p/runs/udpo_seed0/run.json",
    ]
    out = capsys.readouterr().out
    assert "call 1 carries" in out and "the GPU's default: seeds 2 (2 runs)" in out


def test_records_are_copied_as_they_land_and_markers_keep_runs_from_training(gs, plan, tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    out.mkdir()
    gs.write_markers(plan, tree, ["task_only_seed7"])
    marker = json.loads((tree / plan.record_dir("task_only_seed7") / "run.json").read_text())
    assert marker["skip"] == gs.SKIP_NOTE and (marker["method"], marker["seed"]) == ("task_only", 7)
    gs.write_markers(plan, tree, ["udpo_seed6"])  # a later call on the same machine: its own markers only
    assert [p.parent.name for p in (tree / plan.results_dir / "runs").glob("*/run.json")] == ["udpo_seed6"]
    gs.write_markers(plan, tree, ["task_only_seed7"])
    folder = tree / plan.record_dir("udpo_seed7")
    folder.mkdir(parents=True)
    (folder / "evals.jsonl.gz").write_bytes(b"x")
    assert gs.landed(plan, tree, ["udpo_seed7", "udpo_seed6"]) == []  # run.json is written last
    (folder / "run.json").write_text("{}")
    assert gs.landed(plan, tree, ["udpo_seed7", "udpo_seed6"]) == ["udpo_seed7"]
    gs.write_records(plan, tree, ["udpo_seed7"], out)
    with tarfile.open(out / gs.RECORDS) as tar:
        assert sorted(tar.getnames()) == [
            "runs/udpo_seed7",
            "runs/udpo_seed7/evals.jsonl.gz",
            "runs/udpo_seed7/run.json",
        ]
    assert sorted(p.name for p in out.iterdir()) == [gs.RECORDS]


def test_workers_are_sized_by_runs_cores_and_free_memory(gs):
    assert gs.workers_for(12, 16, 139.0, 12) == 8  # an H200: the cores bind
    assert gs.workers_for(12, 16, 78.0, 12) == 6  # an H100: the memory binds
    assert gs.workers_for(3, 16, 139.0, 12) == 3
    assert gs.workers_for(4, 2, None, 12) == 1  # this 2-core CPU, no GPU
    assert gs.workers_for(4, 16, 5.0, 12) == 1
    assert gs.workers_for(12, 16, 139.0, 12, seconds=220) == 4  # a short call: one wave that lands
    assert gs.workers_for(12, 16, 139.0, 12, seconds=540) == 8


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent's wait counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_stop_ends_the_whole_process_group(gs, tmp_path):
    pids = tmp_path / "pids"
    group = subprocess.Popen(
        ["sh", "-c", f"sleep 60 & echo $! >> {pids}; sleep 60 & echo $! >> {pids}; wait"],
        start_new_session=True,
    )
    while len(pids.read_text().split() if pids.exists() else []) < 2:
        time.sleep(0.05)
    begin = time.monotonic()
    gs.stop(group, grace=5)
    assert group.poll() is not None and time.monotonic() - begin < 5
    children = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 2
    while any(map(_running, children)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_running, children))  # the workers of the group, not only its leader


def test_merge_commits_each_record_with_its_machine_once_and_hands_it_to_the_cpu_s_runner(gs, tmp_path):
    plan = gs.Plan(("task_only", "udpo"), (0, 1), "runs/p", "results/p", False)
    repo, study, back = tmp_path / "repo", tmp_path / "study", tmp_path / "back"
    for folder in (repo, study / "runs" / "p" / "udpo" / "seed_1", back):
        folder.mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.name", "t")  # merge commits as the checkout's own user
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "start")
    tree = tmp_path / "tree"
    for name in ("task_only_seed1", "udpo_seed1"):
        record = tree / plan.record_dir(name)
        record.mkdir(parents=True)
        (record / "evals.jsonl.gz").write_bytes(name.encode())
        (record / "run.json").write_text(json.dumps({"config": {"dtype": "fp32"}}))
        info = gs.machine_json(record, "NVIDIA H200", "decode step uncompiled", "off", "1255960abc")
    assert info["gpu"] == "NVIDIA H200" and info["dtype"] == "fp32" and info["cores"] == os.cpu_count()
    assert info["collected_from"].startswith("1255960 (pinned tree on a lent GPU machine")
    assert json.loads((record / gs.MACHINE).read_text()) == info
    gs.write_records(plan, tree, ["task_only_seed1", "udpo_seed1"], back)
    # udpo seed 1 is recorded here already (the CPU finished it first): its record stays
    (repo / plan.record_dir("udpo_seed1")).mkdir(parents=True)
    (repo / plan.record_dir("udpo_seed1") / "run.json").write_text("{}")
    (repo / "other.txt").write_text("the lead's own work in progress")
    _git(repo, "add", "other.txt")  # staged, and no part of a record's commit
    merged = gs.merge(back / gs.RECORDS, repo, plan, "1255960abc", study, commit=True)
    assert merged == ["task_only_seed1"]
    # named as the CPU's records are: "debate_reward: record of udpo_seed1 (at 1255960, <machine>, fp32)"
    assert (
        _git(repo, "log", "--format=%s", "-1")
        == "p: record of task_only_seed1 (at 1255960, NVIDIA H200, fp32)\n"
    )
    assert _git(repo, "show", "--name-only", "--format=", "HEAD").split() == [
        "results/p/runs/task_only_seed1/evals.jsonl.gz",
        "results/p/runs/task_only_seed1/machine.json",
        "results/p/runs/task_only_seed1/run.json",
    ]
    assert (repo / plan.record_dir("udpo_seed1") / "run.json").read_text() == "{}"
    assert _git(repo, "status", "--porcelain").split() == [
        "A",
        "other.txt",
        "??",
        "results/p/runs/udpo_seed1/",
    ]
    for name in ("task_only_seed1", "udpo_seed1"):  # the CPU's runner counts both as done
        assert (study / plan.record_dir(name) / "run.json").is_file()
    assert gs.merge(back / gs.RECORDS, repo, plan, "1255960abc", study, commit=True) == []
