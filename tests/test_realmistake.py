"""The realmistake task: the password-protected zip read in memory, splits, other sources, verdict parsing."""

from __future__ import annotations

import json
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from udpo.env.tasks import get_task
from udpo.env.tasks.data import DataError
from udpo.env.tasks.realmistake import ZIP_PASSWORD, parse_verdict

SUBTASKS = ("math_word_problem_generation", "finegrained_fact_verification", "answerability_classification")


@pytest.fixture(scope="module")
def task():
    return get_task("realmistake")


@pytest.fixture(scope="module")
def everything(task, shared_data):
    return task.load("test", shared_data)


def test_the_zip_holds_three_tasks_two_models_and_binary_labels(everything, shared_data):
    assert len(everything) == 900
    counts = Counter((q.meta["subtask"], q.meta["response_model"]) for q in everything)
    assert counts == {(s, m): 140 if m == "gpt4" else 160 for s in SUBTASKS for m in ("gpt4", "llama2")}
    assert Counter(q.gold for q in everything) == {"error": 649, "no_error": 251}
    assert len({q.id for q in everything}) == 900
    # nothing was extracted beside the zip
    assert sorted(p.name for p in Path(shared_data, "realmistake").iterdir()) == ["data.zip"]


def test_items_show_input_and_response_and_interleave_the_files(task, everything):
    q = everything[0]
    assert q.meta["input"].strip() in q.text and q.meta["response"].strip() in q.text
    assert task.prompt(q).endswith("otherwise 'Verdict: no error'.")
    first_six = [(q.meta["subtask"], q.meta["response_model"]) for q in everything[:6]]
    assert first_six == [(s, m) for s in SUBTASKS for m in ("gpt4", "llama2")]  # a small limit covers all


def test_splits_select_models_and_subtasks(task, shared_data, everything):
    gpt4 = task.load("gpt4", shared_data)
    assert len(gpt4) == 420 and {q.meta["response_model"] for q in gpt4} == {"gpt4"}
    ans = task.load("answerability_classification", shared_data)
    assert len(ans) == 300 and {q.meta["subtask"] for q in ans} == {"answerability_classification"}
    one = task.load("finegrained_fact_verification:llama2", shared_data, limit=5)
    assert [q.id for q in one] == [
        q.id
        for q in everything
        if q.meta["subtask"] == "finegrained_fact_verification" and q.meta["response_model"] == "llama2"
    ][:5]
    with pytest.raises(ValueError, match="unknown split 'dev' for task realmistake"):
        task.load("dev", shared_data)


def _rows(shared_data, subtask, model_file, n) -> list[dict]:
    with zipfile.ZipFile(Path(shared_data, "realmistake", "data.zip")) as z:
        data = z.read(f"data/{subtask}/{model_file}.jsonl", pwd=ZIP_PASSWORD.encode()).decode()
    return [json.loads(line) for line in data.splitlines()[:n]]


def test_an_extracted_folder_and_a_single_file_load_like_the_zip(task, shared_data, tmp_path):
    """A few rows of each file in the authors' extracted layout (written to pytest's tmp folder only)."""
    for s in SUBTASKS:
        for m in ("gpt-4-0613", "Llama-2-70b-chat-hf"):
            path = tmp_path / "data" / s / f"{m}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in _rows(shared_data, s, m, 2)))
    from_zip = task.load("test", shared_data, limit=12)
    assert task.load("test", tmp_path) == from_zip
    assert task.load("test", tmp_path / "data") == from_zip
    single = tmp_path / "one.jsonl"
    single.write_text((tmp_path / "data" / SUBTASKS[2] / "Llama-2-70b-chat-hf.jsonl").read_text())
    expected = [
        q for q in from_zip if q.meta["response_model"] == "llama2" and q.meta["subtask"] == SUBTASKS[2]
    ]
    assert task.load("llama2", single) == expected
    with pytest.raises(DataError, match="no ReaLMistake items for split 'gpt4'"):
        task.load("gpt4", single)


def test_hub_rows_convert_like_the_zip(task, shared_data, monkeypatch):
    datasets = pytest.importorskip("datasets")
    files = {"gpt4": "gpt-4-0613", "llama2": "Llama-2-70b-chat-hf"}
    served = {(s, m): _rows(shared_data, s, f, 3) for s in SUBTASKS for m, f in files.items()}
    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda name, config, split: datasets.Dataset.from_list(served[config, split]),
    )
    local = task.load("test", shared_data, limit=18)
    assert task.load("test", "ryokamoi/realmistake") == local
    assert task.load(SUBTASKS[0], "ryokamoi/realmistake:" + SUBTASKS[0]) == [
        q for q in local if q.meta["subtask"] == SUBTASKS[0]
    ]


def test_bad_sources_are_named(task, tmp_path, monkeypatch):
    bad = tmp_path / "data.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="data.zip: not a zip file"):
        task.load("test", bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="realmistake/data.zip not found"):
        task.load("test", empty)
    meta = {"id": "a", "task_name": SUBTASKS[0], "llm_response_model": "gpt-4-0613"}
    line = {"input": "x", "llm_response": "y", "error_label": "maybe", "metadata": meta}
    single = tmp_path / "bad.jsonl"
    single.write_text("\n" + json.dumps(line) + "\n")
    with pytest.raises(
        DataError, match=r"bad.jsonl:2: 'error_label' should be 'error' or 'no_error', got 'maybe'"
    ):
        task.load("gpt4", single)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match="pip install 'udpo\\[hub\\]'"):
        task.load("test", "ryokamoi/realmistake")


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("The numbers check out.\nVerdict: no error", "no_error"),
        ("Verdict: error", "error"),
        ("**Final verdict:** Error", "error"),
        ("verdict = no_error", "no_error"),
        ("Verdict: no error... wait, the total is wrong.\nVerdict: error", "error"),
        ("Therefore, the model response contains an error.", "error"),
        ("Therefore, the model response contains no error.", "no_error"),
        ("The response does not contain any errors.", "no_error"),
        ("The response doesn't have an error", "no_error"),
        ("The response is error-free.", "no_error"),
        ("It has errors in step 2.", "error"),
        ("The answer is Sam Tick.", None),
        ("", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) == verdict
