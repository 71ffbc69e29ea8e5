"""Tasks: loading from the shared/data layout, splits, determinism, errors, and a scripted debate."""

from __future__ import annotations

import csv
import json
import re
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.protocols.base import Message, peer_message
from udpo.env.tasks import TASK_NAMES, get_task
from udpo.env.tasks import data as data_module
from udpo.env.tasks.arithmetic import LEVELS, Arithmetic
from udpo.env.tasks.data import DataError, HubDataset, resolve_source
from udpo.env.tasks.parsing import LETTERS


def ids(questions):
    return [q.id for q in questions]


# --- gsm8k --------------------------------------------------------------------------------


def test_gsm8k_loads_both_splits(shared_data):
    task = get_task("gsm8k")
    test, train = task.load("test", shared_data), task.load("train", shared_data)
    assert (len(test), len(train)) == (1319, 7473)
    assert test[0].gold == "18" and "Janet" in test[0].text
    assert len(set(ids(test + train))) == len(test) + len(train)
    assert all(q.gold is not None and q.options is None for q in test + train)
    with open(Path(shared_data, "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    comma = next(i for i, r in enumerate(raw) if "," in r["answer"].split("####")[-1])
    assert test[comma].gold == raw[comma]["answer"].split("####")[-1].strip().replace(",", "")


def test_gsm8k_accepts_every_data_path_form(shared_data, monkeypatch):
    task = get_task("gsm8k")
    expected = ids(task.load("test", shared_data, limit=5))
    assert ids(task.load("test", Path(shared_data, "gsm8k"), limit=5)) == expected
    assert ids(task.load("test", Path(shared_data, "gsm8k", "test.jsonl"), limit=5)) == expected
    assert ids(task.load("test", limit=5)) == expected  # ../shared/data beside the checkout
    monkeypatch.setenv("UDPO_DATA_DIR", shared_data)
    assert ids(task.load("test", limit=5)) == expected
    assert task.load("test", limit=0) == []


def test_gsm8k_parse_and_is_correct(shared_data):
    task = get_task("gsm8k")
    q = task.load("test", shared_data, limit=1)[0]
    assert task.is_correct(task.parse("9 eggs at $2 each: \\boxed{18.00}", q), q)
    assert not task.is_correct(task.parse("\\boxed{19}", q), q)
    assert not task.is_correct(task.parse("no idea", q), q)
    assert "\\boxed{}" in task.prompt(q)


# --- truthfulqa -----------------------------------------------------------------------------


def test_truthfulqa_mc1_options_and_gold(shared_data):
    task = get_task("truthfulqa")
    questions = task.load("all", shared_data)
    with open(Path(shared_data, "truthfulqa", "TruthfulQA.csv"), encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(questions) == len(rows) == 817
    for q, row in zip(questions, rows, strict=True):
        assert q.options[LETTERS.index(q.gold)] == row["Best Answer"].strip()
        wrong = {a.strip().rstrip(";").strip() for a in row["Incorrect Answers"].split("; ")} - {""}
        assert set(q.options) == wrong | {row["Best Answer"].strip()}
        assert q.text.startswith(row["Question"].strip())
        assert f"({LETTERS[len(q.options) - 1]}) " in q.text
    golds = {q.gold for q in questions}
    assert {"A", "B", "C", "D", "E", "F"} <= golds  # the best answer is not always A
    assert max(len(q.options) for q in questions) == 13  # letters beyond E are needed


def test_truthfulqa_shuffle_is_deterministic_per_seed(shared_data):
    task = get_task("truthfulqa")
    a, b, c = (task.load("test", shared_data, seed=s) for s in (0, 0, 1))
    assert a == b and [q.options for q in a] == [q.options for q in b]
    assert ids(a) == ids(c)  # the split does not depend on the seed ...
    assert sum(x.options != y.options for x, y in zip(a, c, strict=True)) > len(a) // 2  # ... the order does
    assert all(set(x.options) == set(y.options) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize(("name", "whole"), [("truthfulqa", "all"), ("commonsenseqa", "dev")])
def test_partitioned_splits_are_disjoint_halves(shared_data, name, whole):
    task = get_task(name)
    everything, train, test = (task.load(s, shared_data) for s in (whole, "train", "test"))
    assert not set(ids(train)) & set(ids(test))
    assert sorted(ids(train) + ids(test)) == sorted(ids(everything))
    assert 0.4 < len(test) / len(everything) < 0.6


# --- commonsenseqa --------------------------------------------------------------------------


def test_commonsenseqa_loads_dev(shared_data):
    task = get_task("commonsenseqa")
    questions = task.load("dev", shared_data)
    with open(Path(shared_data, "commonsenseqa", "dev_rand_split.jsonl"), encoding="utf-8") as f:
        raw = [json.loads(line) for line in f]
    assert len(questions) == 1221
    for q, r in zip(questions, raw, strict=True):
        assert (q.id, q.gold, list(q.options)) == (r["id"], r["answerKey"], r["choices"]["text"])
    q = questions[0]
    assert task.parse("A bank is secure. Answer: (A)", q) == "A" == q.gold
    assert task.parse("(F)", q) is None
    assert "A, B, C, D, E" in task.format_instruction(q)


# --- arithmetic -----------------------------------------------------------------------------


def _value(expression: str) -> Fraction:
    """Independent check of a generated expression (only digits, spaces and + - * /)."""
    assert re.fullmatch(r"[\d +\-*/]+", expression)
    return Fraction(eval(expression))  # noqa: S307 - digits and operators only, checked above


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_arithmetic_levels_gold_and_disjoint_splits(level):
    task = Arithmetic(difficulty=level, n_questions=120)
    train, test = task.load("train"), task.load("test")
    for q in train + test:
        expression = q.meta["expression"]
        assert q.text == f"What is {expression}?" and q.meta["level"] == level
        assert Fraction(q.gold) == _value(expression)
        assert q.gold == str(int(q.gold))  # exact integer results
    train_problems = {q.meta["expression"] for q in train}
    for q in test:
        expression = q.meta["expression"]
        assert expression not in train_problems
        terms = expression.split(" ")
        if len(terms) == 3 and terms[1] in "+*":  # nor its commutative twin
            assert f"{terms[2]} {terms[1]} {terms[0]}" not in train_problems
    assert len(set(ids(train + test))) == 240


def test_arithmetic_is_deterministic_and_seeded():
    task = get_task("arithmetic", difficulty=[1, 2, 3], n_questions=30)
    a, b, c = task.load("test", seed=0), task.load("test", seed=0), task.load("test", seed=7)
    assert a == b and [q.text for q in a] == [q.text for q in b]
    assert [q.text for q in a] != [q.text for q in c]
    assert [q.meta["level"] for q in a[:6]] == [1, 2, 3, 1, 2, 3]
    assert ids(task.load("test", seed=0, limit=4)) == ids(a)[:4]
    assert len({q.text for q in Arithmetic(difficulty=2, n_questions=200).load("test")}) == 200  # no repeats


def test_arithmetic_answer_only_asks_for_the_bare_number_in_every_round():
    reasoned, bare = get_task("arithmetic"), get_task("arithmetic", answer_only=True)
    question = bare.load("train", limit=1)[0]
    assert "step by step" in reasoned.prompt(question)
    assert bare.prompt(question) == f"{question.text}\n\nAnswer with the number only."
    assert "never explain" in bare.default_profile and bare.default_profile != reasoned.default_profile
    # rounds t >= 1 show the peers' answers, then ask the question again in the same form
    shown = [Message(agent=1, round=0, text="It is 12.")]
    later = peer_message(bare, question, shown, 1)
    assert later.endswith(f"{question.text} Answer with the number only.") and "It is 12." in later
    assert "Weigh their reasoning" in peer_message(reasoned, question, shown, 1)
    assert bare.parse("3 + 9 = 12", question) == "12"
    assert [q.gold for q in bare.load("test")] == [q.gold for q in reasoned.load("test")]


def test_arithmetic_options_are_checked():
    with pytest.raises(ValueError, match="difficulty"):
        Arithmetic(difficulty=9)
    with pytest.raises(ValueError, match="difficulty"):
        Arithmetic(difficulty=[])
    with pytest.raises(ValueError, match="n_questions"):
        Arithmetic(n_questions=0)
    with pytest.raises(ValueError, match="generated"):
        Arithmetic().load("test", data_path="somewhere")


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TASK_NAMES)
def test_unknown_split_names_the_choices(name):
    task = get_task(name)
    with pytest.raises(ValueError, match=f"unknown split 'validation' for task {name}; choose one of"):
        task.load("validation")


def test_negative_limit_is_refused(shared_data):
    with pytest.raises(ValueError, match="limit"):
        get_task("commonsenseqa").load("dev", shared_data, limit=-1)


def test_missing_files_are_named(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "gsm8k" / "train.jsonl"))):
        get_task("gsm8k").load("train", tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        get_task("gsm8k").load("test", tmp_path / "nope.jsonl")
    monkeypatch.setenv("UDPO_DATA_DIR", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="UDPO_DATA_DIR"):
        get_task("commonsenseqa").load("dev")
    monkeypatch.delenv("UDPO_DATA_DIR")
    monkeypatch.setattr(data_module, "_REPO_ROOT", tmp_path / "checkout")
    with pytest.raises(FileNotFoundError, match="--data"):
        get_task("truthfulqa").load("test")


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD_GSM = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"question": "x", ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"answer": "#### 3"}), "missing key 'question'"),
        (json.dumps({"question": "q", "answer": "no marker"}), "should end with '#### <number>'"),
        (json.dumps({"question": "q", "answer": "#### three"}), "should end with '#### <number>'"),
        (json.dumps({"question": 3, "answer": "#### 3"}), "'question' should be str"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, message):
    path = _write(tmp_path / "bad.jsonl", [GOOD_GSM, "", line])
    with pytest.raises(DataError, match=re.escape(f"{path}:3: ") + ".*" + re.escape(message)):
        get_task("gsm8k").load("test", path)


def _csqa_line(**changes) -> str:
    record = {
        "id": "q1",
        "question": "Where are books kept?",
        "question_concept": "books",
        "choices": {"label": list("ABCDE"), "text": ["library", "sea", "sky", "oven", "shoe"]},
        "answerKey": "A",
    }
    return json.dumps({**record, **changes})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (_csqa_line(answerKey="F"), "answerKey 'F' is not one of the choice labels"),
        (_csqa_line(choices={"label": ["A", "C"], "text": ["x", "y"]}), "choices should be labelled A, B"),
        (_csqa_line(choices={"label": ["A", "B"]}), "in 'choices': missing key 'text'"),
        (_csqa_line(id="q0"), "id 'q0' already used at"),
    ],
)
def test_malformed_commonsenseqa(tmp_path, line, message):
    path = _write(tmp_path / "dev.jsonl", [_csqa_line(id="q0"), line])
    with pytest.raises(DataError, match=re.escape(f"{path}:2: {message}")):
        get_task("commonsenseqa").load("dev", path)


HEADER = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("A,B,Is it?,Yes,Yes,No,src,extra", "3: 8 fields, the header has 7"),
        ("A,B,Is it?,Yes,Yes", "3: 5 fields, the header has 7"),
        ("A,B,Is it?,Yes,Yes,; ;,src", "3: no incorrect answers"),
        ('A,B,"Is it?,Yes,Yes,No,src', "3: a quote opened in this row is never closed"),
        ('A,B,"Is" it?,Yes,Yes,No,src', "malformed CSV"),
    ],
)
def test_malformed_truthfulqa_csv(tmp_path, row, message):
    path = _write(tmp_path / "tqa.csv", [HEADER, "A,B,Is sky blue?,Yes,Yes,No; Green,src", row])
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*" + re.escape(message)):
        get_task("truthfulqa").load("all", path)


@pytest.mark.parametrize(
    ("name", "suffix"), [("gsm8k", "jsonl"), ("commonsenseqa", "jsonl"), ("truthfulqa", "csv")]
)
def test_non_utf8_files_are_named(tmp_path, name, suffix):
    path = tmp_path / f"data.{suffix}"
    if suffix == "csv":
        path.write_bytes(b"Question,Best Answer,Incorrect Answers\n\xff\xfe,b,c\n")
        where = f"{path}"
    else:  # JSON Lines are decoded line by line: the error names the line
        path.write_bytes(b'{"question": "1+1?", "answer": "#### 2"}\n{"question": "\xff\xfe"}\n')
        where = f"{path}:2"
    with pytest.raises(DataError, match=re.escape(f"{where}: not UTF-8 text")):
        get_task(name).load(get_task(name).splits[0], path)


def test_truthfulqa_csv_missing_column(tmp_path):
    path = _write(tmp_path / "tqa.csv", ["Question,Best Answer", "Is it?,Yes"])
    with pytest.raises(DataError, match="missing column.*Incorrect Answers"):
        get_task("truthfulqa").load("all", path)


def test_truthfulqa_small_file_with_repeats_and_blanks(tmp_path):
    path = _write(tmp_path / "tqa.csv", [HEADER, "A,B,Is sky blue?,Yes,Yes,No; Green; No;; Yes,src"])
    (q,) = get_task("truthfulqa").load("all", path)
    assert sorted(q.options) == ["Green", "No", "Yes"] and q.options[LETTERS.index(q.gold)] == "Yes"


# --- Hugging Face Hub ------------------------------------------------------------------------


def test_hub_names_resolve_with_default_configs():
    assert resolve_source("openai/gsm8k", "gsm8k", "test.jsonl", {"openai/gsm8k": "main"}) == HubDataset(
        "openai/gsm8k", "main"
    )
    assert resolve_source("openai/gsm8k:socratic", "gsm8k", "test.jsonl") == HubDataset(
        "openai/gsm8k", "socratic"
    )
    assert resolve_source("me/mirror", "gsm8k", "t.jsonl", {"openai/gsm8k": "main"}) == HubDataset(
        "me/mirror"
    )


def test_hub_without_datasets_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(DataError, match=re.escape("pip install 'udpo[hub]'")):
        get_task("gsm8k").load("test", "openai/gsm8k")


def test_hub_offline_gives_a_clear_error(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match="could not load 'truthfulqa/truthful_qa' .*local file or folder"):
        get_task("truthfulqa").load("test", "truthfulqa/truthful_qa")


def test_hub_rows_convert_like_local_files(monkeypatch, shared_data):
    """Rows shaped as the Hub serves them (one per config) give the same questions as the local files."""
    datasets = pytest.importorskip("datasets")
    with open(Path(shared_data, "gsm8k", "test.jsonl"), encoding="utf-8") as f:
        gsm = [json.loads(next(f)) for _ in range(3)]
    with open(Path(shared_data, "commonsenseqa", "dev_rand_split.jsonl"), encoding="utf-8") as f:
        csqa = [json.loads(line) for line in f]
    with open(Path(shared_data, "truthfulqa", "TruthfulQA.csv"), encoding="utf-8", newline="") as f:
        tqa_rows = list(csv.DictReader(f))
    tqa_generation = [
        {
            "question": r["Question"],
            "best_answer": r["Best Answer"],
            "incorrect_answers": r["Incorrect Answers"].split("; "),
        }
        for r in tqa_rows
    ]
    tqa_mc = [
        {
            "question": r["question"],
            "mc1_targets": {
                "choices": [r["best_answer"], *r["incorrect_answers"]],
                "labels": [1] + [0] * len(r["incorrect_answers"]),
            },
        }
        for r in tqa_generation
    ]
    served = {
        ("openai/gsm8k", "main", "test"): gsm,
        ("tau/commonsense_qa", None, "validation"): csqa,
        ("truthfulqa/truthful_qa", "generation", "validation"): tqa_generation,
        ("truthfulqa/truthful_qa", "multiple_choice", "validation"): tqa_mc,
    }
    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda name, config, split: datasets.Dataset.from_list(served[name, config, split]),
    )
    assert get_task("gsm8k").load("test", "openai/gsm8k") == get_task("gsm8k").load(
        "test", shared_data, limit=3
    )
    tqa, csqa_task = get_task("truthfulqa"), get_task("commonsenseqa")
    local = tqa.load("test", shared_data, seed=3)
    assert tqa.load("test", "truthfulqa/truthful_qa", seed=3) == local
    assert tqa.load("test", "truthfulqa/truthful_qa:multiple_choice", seed=3) == local
    assert csqa_task.load("train", "tau/commonsense_qa") == csqa_task.load("train", shared_data)


# --- a full debate on the scripted backend, per task -----------------------------------------


def _load_small(name: str, shared_data: str):
    if name == "arithmetic":
        return get_task(name, difficulty=[1, 4], n_questions=3).load("test")
    if name == "du-arithmetic":  # generated: no data path
        return get_task(name).load("test", limit=3)
    return get_task(name).load("test", shared_data, limit=3)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_scripted_debate_parses_every_turn(name, shared_data):
    """Agent 0 always answers right; agent 1 answers wrong, then gives up (unparsable) in round 2;
    agent 2 is wrong, then convinced in round 1. The parsed answer matrix, the vote and correctness
    follow from the task's parse rules."""
    task = get_task(name)
    questions = _load_small(name, shared_data)
    by_prompt = {task.prompt(q): q for q in questions}

    def wrong(q):
        if name == "realmistake":
            return "no_error" if q.gold == "error" else "error"
        if q.options is None:
            return str(int(Fraction(q.gold)) + 1)
        return LETTERS[(LETTERS.index(q.gold) + 1) % len(q.options)]

    def say(q, answer):
        if name == "realmistake":
            return f"I checked every requirement.\nVerdict: {answer.replace('_', ' ')}"
        if q.options is None:
            return f"Step by step it comes to {answer}, so the result is \\boxed{{{answer}}}."
        return f"I compared the options; (A) tempted me.\nAnswer: ({answer})"

    def script(request, call):
        q = by_prompt[request.messages[1]["content"]]
        agent = next(i for i, p in enumerate(profiles) if p == request.messages[0]["content"])
        round_ = (len(request.messages) - 2) // 2
        if agent == 1 and round_ == 2:
            return "I am not sure any more. A tough one."
        right = agent == 0 or (agent == 2 and round_ >= 1)
        return say(q, q.gold if right else wrong(q))

    profiles = [f"{task.default_profile} You are agent {i}." for i in range(3)]
    config = DebateConfig(
        n_agents=3, rounds=2, agents=[AgentSpec(profile=p) for p in profiles], debate_batch_size=2
    )
    trajectories = DebateEnv(task, ScriptedBackend(script), config).run(questions, progress=False)
    assert len(trajectories) == len(questions)
    for traj, q in zip(trajectories, questions, strict=True):
        w = wrong(q)
        assert traj.answers == [[q.gold] * 3, [w, w, None], [w, q.gold, q.gold]]
        assert traj.prediction == q.gold and traj.correct
        peer_turn = traj.turns[1][1].messages[-1]["content"]
        assert task.format_instruction(q) in peer_turn and say(q, q.gold).strip() in peer_turn
