"""Hostile data and run files: task data (BOM, empty, header-only, stray quotes, deep nesting, empty or
non-text fields), trajectory lines with malformed fields, and ``udpo debate --resume`` on a file cut
short, missing its last newline, or holding debates of another shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from udpo.cli import main
from udpo.env.backends.base import SamplingParams
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import MAX_AGENTS, MAX_DEBATE_TOKENS, DebateConfig
from udpo.env.tasks import get_task
from udpo.env.tasks.data import DataError, iter_csv
from udpo.env.trajectory import read_trajectories

GSM = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"}
CSQA = {
    "id": "q1",
    "question": "Where do you keep milk?",
    "choices": {"label": ["A", "B", "C"], "text": ["fridge", "oven", "shelf"]},
    "answerKey": "A",
}
TQA_HEADER = "Type,Category,Question,Best Answer,Correct Answers,Incorrect Answers,Source"


def jsonl(path: Path, *records, raw: bytes = b"") -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + raw)
    return path


def load(task: str, path: Path, split: str):
    return get_task(task).load(split, str(path))


def test_a_byte_order_mark_is_valid_utf8(tmp_path):
    bom = b"\xef\xbb\xbf"
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_bytes(bom + json.dumps(GSM).encode() + b"\n")
    assert [q.gold for q in load("gsm8k", gsm, "test")] == ["7"]
    csqa = tmp_path / "csqa.jsonl"
    csqa.write_bytes(bom + json.dumps(CSQA).encode() + b"\n")
    assert [q.gold for q in load("commonsenseqa", csqa, "dev")] == ["A"]
    tqa = tmp_path / "tqa.csv"
    tqa.write_bytes(bom + f"{TQA_HEADER}\nA,B,Is the sky blue?,Yes,Yes,No; Never,src\n".encode())
    assert len(load("truthfulqa", tqa, "all")) == 1


@pytest.mark.parametrize(
    ("task", "name", "content", "message"),
    [
        ("gsm8k", "d.jsonl", b"", "{path}: no records (the file is empty)"),
        ("gsm8k", "d.jsonl", b"\n  \n", "{path}: no records (the file is empty)"),
        ("commonsenseqa", "d.jsonl", b"", "{path}: no records (the file is empty)"),
        ("truthfulqa", "d.csv", b"", "{path}: empty file, expected a header with columns Question"),
        ("truthfulqa", "d.csv", TQA_HEADER.encode() + b"\n", "{path}: a header but no rows"),
        (
            "truthfulqa",
            "d.csv",
            f'{TQA_HEADER}\nA,B,Is the "sky" blue?,Yes,Yes,No,src\n'.encode(),
            "{path}:2: stray quote in the field 'Is the \"sky\" blue?'",
        ),
        ("gsm8k", "d.jsonl", b"[" * 200_000 + b"]" * 200_000 + b"\n", "{path}:1: JSON nested too deeply"),
        ("gsm8k", "d.jsonl", json.dumps({**GSM, "question": "  "}).encode(), "{path}:1: 'question' is empty"),
        (
            "commonsenseqa",
            "d.jsonl",
            json.dumps({**CSQA, "question": ""}).encode(),
            "{path}:1: 'question' is empty",
        ),
        (
            "commonsenseqa",
            "d.jsonl",
            json.dumps({**CSQA, "choices": {"label": ["A", "B"], "text": [{"x": 1}, "oven"]}}).encode(),
            "{path}:1: in 'choices', 'text': entries must be strings, got dict",
        ),
        (
            "commonsenseqa",
            "d.jsonl",
            json.dumps({**CSQA, "choices": {"label": ["A", 2], "text": ["fridge", "oven"]}}).encode(),
            "{path}:1: in 'choices', 'label': entries must be strings, got int",
        ),
        (  # nulls where labels belong: a data error, not an AttributeError on None.strip()
            "commonsenseqa",
            "d.jsonl",
            json.dumps({**CSQA, "choices": {"label": [None] * 3, "text": ["a", "b", "c"]}}).encode(),
            "{path}:1: in 'choices', 'label': entries must be strings, got NoneType None at index 0",
        ),
        (
            "commonsenseqa",
            "d.jsonl",
            json.dumps({**CSQA, "choices": {"label": ["A", "B", "C"], "text": ["a", None, "c"]}}).encode(),
            "{path}:1: in 'choices', 'text': entries must be strings, got NoneType None at index 1",
        ),
        ("gsm8k", "d.jsonl", b'{"question": "q", "answer": "#### 1"}', None),  # no newline: still a record
        (
            "gsm8k",
            "d.jsonl",
            b'{"question": "q", "answer": "#### 1"',
            "{path}:1: not valid JSON",
        ),  # cut short
    ],
)
def test_bad_data_files_are_named(tmp_path, task, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    split = get_task(task).splits[0]
    if message is None:
        assert len(load(task, path, split)) == 1
        return
    with pytest.raises(DataError) as e:
        load(task, path, split)
    assert message.format(path=path) in str(e.value) and "\n" not in str(e.value)


ROW = "A,B,Is the sky blue?,Yes,Yes,No,src\n"


@pytest.mark.parametrize(
    ("task", "content", "message"),
    [
        (  # an unclosed quote on line 3 runs to the end of the file: named where it opens
            "truthfulqa",
            f'{TQA_HEADER}\n{ROW}A,B,"Is it?,Yes,Yes,No,src\n{ROW}{ROW}',
            "{path}:3: a quote opened in this row is never closed (the file ends inside the field)",
        ),
        (
            "truthfulqa",
            f'{TQA_HEADER}\n{ROW}A,B,Is it?,Yes,Yes,"{"x" * 1_000_000}",src\n',
            "{path}:3: a field longer than 131,072 characters",
        ),
        (  # a row after blank lines and a quoted field spanning lines: its first line is named
            "truthfulqa",
            f'{TQA_HEADER}\n\n{ROW}\n\nA,B,"Is\nit?",Yes,Yes,No,src,extra\n',
            "{path}:6: 8 fields, the header has 7",
        ),
        (
            "truthfulqa",
            f'{TQA_HEADER}\n{ROW}A,B,Q?,Yes,Yes,"{"; ".join(f"no {k}" for k in range(30))}",src\n',
            "{path}:3: 31 options, at most 26 can be lettered A-Z: 'Q?'",
        ),
    ],
)
def test_bad_rows_are_named_by_the_line_they_start_on(tmp_path, task, content, message):
    path = tmp_path / "data"
    path.write_text(content)
    with pytest.raises(DataError) as e:
        load(task, path, get_task(task).splits[0])
    assert str(e.value).startswith(message.format(path=path)) and "\n" not in str(e.value)


def test_rows_of_a_csv_are_numbered_by_their_first_line(tmp_path):
    path = tmp_path / "tqa.csv"
    path.write_text(f'{TQA_HEADER}\n\n"A","B","Two\nlines?",Yes,Yes,No,src\n{ROW}')
    assert [line for line, _ in iter_csv(path, ["Question"])] == [3, 5]


@pytest.mark.parametrize("given", ["", "   "])
def test_an_empty_data_path_says_so(tmp_path, monkeypatch, capsys, given):
    (tmp_path / "gsm8k").mkdir()
    jsonl(tmp_path / "gsm8k" / "test.jsonl", GSM)
    monkeypatch.chdir(tmp_path)  # an empty path must not be read as this folder, which holds data
    for task in ("gsm8k", "commonsenseqa", "truthfulqa", "realmistake"):
        with pytest.raises(FileNotFoundError, match=f"the data path given is empty \\({given!r}\\)"):
            load(task, given, get_task(task).splits[0])
    assert (
        main(["debate", "--task", "gsm8k", "--data-path", given, "--output-dir", str(tmp_path / "run")]) == 2
    )
    assert f"the data path given is empty ({given!r})" in capsys.readouterr().err


def test_quotes_inside_quoted_fields_are_fine(tmp_path):
    path = tmp_path / "tqa.csv"
    path.write_text(f'{TQA_HEADER}\nA,B,"He said ""hi"", then?",Yes,Yes,"No; ""Never""",src\n')
    (q,) = load("truthfulqa", path, "all")
    assert q.meta["question"] == 'He said "hi", then?' and '"Never"' in q.text


# --- udpo debate --resume --------------------------------------------------------------------------
ARGS = ["debate", "--task", "arithmetic", "--n-agents", "2", "--rounds", "1", "--debate-batch-size", "2"]


@pytest.fixture
def scripted(monkeypatch):
    """``udpo debate`` with a scripted engine (the resume logic under test is the command's, not a
    model's); returns the list of backends made, to see whether one was."""
    made = []

    def backend(args):
        made.append(ScriptedBackend(lambda request, k: f"I think it is \\boxed{{{k % 3}}}."))
        return made[-1]

    monkeypatch.setattr("udpo.cli.debate.backend_from_args", backend)
    return made


def debate(out: Path, *extra: str) -> int:
    return main([*ARGS, "--output-dir", str(out), *extra])


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def test_resume_drops_a_half_written_line_and_debates_its_question_again(tmp_path, scripted):
    out, file = tmp_path / "run", tmp_path / "run" / "trajectories.jsonl"
    assert debate(out, "--limit", "3") == 0
    whole = file.read_bytes()
    first_two = b"".join(line + b"\n" for line in lines_of(file)[:2])
    third = lines_of(file)[2]
    file.write_bytes(first_two + third[: len(third) // 2])  # killed while writing the third line
    with pytest.warns(UserWarning, match=f"{file}:3: dropped a last line cut short by an interrupted write"):
        assert debate(out, "--limit", "3", "--resume") == 0
    trajectories = read_trajectories(file)
    assert file.read_bytes().startswith(first_two) and file.read_bytes().endswith(b"\n")
    debated = [json.loads(line)["question_id"] for line in whole.splitlines()]
    assert [t.question_id for t in trajectories] == debated  # the third question debated again, once
    assert json.loads((out / "summary.json").read_text())["n_questions"] == 3


def test_resume_keeps_a_whole_last_line_missing_its_newline(tmp_path, scripted):
    out, file = tmp_path / "run", tmp_path / "run" / "trajectories.jsonl"
    assert debate(out, "--limit", "3") == 0
    file.write_bytes(file.read_bytes().rstrip(b"\n"))  # a whole record, no newline
    assert debate(out, "--limit", "3", "--resume") == 0  # nothing left to debate
    assert file.read_bytes().count(b"\n") == 3 and len(read_trajectories(file)) == 3
    assert json.loads((out / "summary.json").read_text())["n_questions"] == 3
    file.write_bytes(file.read_bytes().rstrip(b"\n"))
    assert debate(out, "--limit", "4", "--resume") == 0  # one more, appended on its own line
    trajectories = read_trajectories(file)
    assert len(trajectories) == 4 and file.read_bytes().count(b"\n") == 4
    assert json.loads((out / "summary.json").read_text())["n_questions"] == 4


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--n-agents", "3"], "debated with n_agents=2 (now 3)"),
        (["--rounds", "2"], "debated with rounds=1 (now 2)"),
        (["--seed", "5"], "debated with seed=0 (now 5)"),
        (["--split", "train"], "debated with split='test' (now 'train')"),
    ],
)
def test_resume_refuses_debates_of_other_settings_before_the_engine_starts(
    tmp_path, scripted, capsys, extra, needle
):
    out, file = tmp_path / "run", tmp_path / "run" / "trajectories.jsonl"
    assert debate(out, "--limit", "2") == 0
    before, made = file.read_bytes(), len(scripted)
    capsys.readouterr()
    assert (
        main([*ARGS, "--output-dir", str(out), "--limit", "3", "--resume", *extra]) == 2
    )  # the last flag wins
    err = capsys.readouterr().err
    assert f"{file}:1: {needle}" in err and len(err.strip().splitlines()) == 1, err
    assert file.read_bytes() == before and len(scripted) == made  # no engine was started


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--temperature", "-1"], "argument --temperature: must be >= 0, got -1"),
        (["--temperature", "nan"], "argument --temperature: expected a finite number, got 'nan'"),
        (["--top-p", "0"], "argument --top-p/--top_p: must be in (0, 1], got 0"),
        (["--max-tokens", "0"], "argument --max-tokens/--max_tokens: must be >= 1, got 0"),
        (["--rounds", "-1"], "argument --rounds: must be >= 0, got -1"),
        (
            ["--debate-batch-size", "0"],
            "argument --debate-batch-size/--debate_batch_size: must be >= 1, got 0",
        ),
        (["--limit", "-1"], "argument --limit: must be >= 1, got -1"),
        (["--api-key", "sk-secret"], None),
    ],
)
def test_bad_debate_settings_are_refused_before_the_engine_starts(tmp_path, scripted, capsys, extra, needle):
    """The parser refuses them (exit 2, usage and one error line), before anything is imported or made."""
    with pytest.raises(SystemExit) as e:
        debate(tmp_path / "run", *extra)
    err = capsys.readouterr().err
    assert e.value.code == 2
    if needle is None:  # never echoes the key
        assert "--api-key-file" in err and "sk-secret" not in err
    else:
        assert err.strip().splitlines()[-1] == f"udpo debate: error: {needle}"
    assert not scripted and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            ["--n-agents", "100000"],
            "n_agents=100000 is more than 1024: the team's metrics compare every pair",
        ),
        (["--n-agents", "1000", "--rounds", "0", "--max-tokens", "2048"], "can generate 2,048,000 tokens"),
        (["--rounds", "100000", "--max-tokens", "8"], "(rounds + 1)=100001 replies of up to max_tokens=8"),
    ],
)
def test_a_team_too_large_to_hold_is_refused_before_the_engine_starts(
    tmp_path, scripted, capsys, extra, needle
):
    assert debate(tmp_path / "run", *extra) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("udpo debate: error: ") and needle in lines[0], lines
    assert not scripted


def test_the_debate_size_bounds_hold_in_the_library():
    DebateConfig(n_agents=MAX_AGENTS, rounds=0, sampling=SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=f"n_agents={MAX_AGENTS + 1} is more than {MAX_AGENTS}"):
        DebateConfig(n_agents=MAX_AGENTS + 1, rounds=0, sampling=SamplingParams(max_tokens=1))
    DebateConfig(n_agents=2, rounds=MAX_DEBATE_TOKENS // 2 - 1, sampling=SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match=f"more than the {MAX_DEBATE_TOKENS:,} one debate may hold"):
        DebateConfig(n_agents=2, rounds=MAX_DEBATE_TOKENS // 2, sampling=SamplingParams(max_tokens=1))


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("meta", ["a"], "'meta' must be an object, got list"),
        ("meta", "text", "'meta' must be an object, got str"),
        ("turns", {"a": 1}, "'turns' must be a list of per-agent lists"),
        ("turns", [[{"agent": 0}]], "turns[0][0]: unknown key(s) [], missing key(s)"),
        ("correct", "yes", "'correct' must be true or false"),
        ("question_id", [1], "'question_id' must be a string"),
    ],
)
def test_malformed_trajectory_fields_are_one_line(tmp_path, scripted, capsys, field, value, needle):
    out, file = tmp_path / "run", tmp_path / "run" / "trajectories.jsonl"
    assert debate(out, "--limit", "2") == 0
    records = [json.loads(line) for line in file.read_text().splitlines()]
    records[1][field] = value
    file.write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    for args in (
        [*ARGS, "--output-dir", str(out), "--limit", "2", "--resume"],
        ["diagnose", str(out), "--out", str(tmp_path / "d")],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and f"{file}:2: {needle}" in lines[0], err


@pytest.mark.slow
def test_mixed_shape_resume_in_a_real_process(tmp_path, scripted):
    """The real command refuses before it builds an engine: the model is a decoy no library can load,
    so building one would have failed with another error."""
    out = tmp_path / "run"
    assert debate(out, "--limit", "2") == 0
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "config.json").write_text("{}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "udpo.cli", *ARGS, "--output-dir", str(out), "--resume", "--n-agents", "3"]
    result = subprocess.run(
        [*cmd, "--model", str(decoy)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"udpo debate: error: {out / 'trajectories.jsonl'}:1: debated with ")
    assert f"model='smollm2-135m-instruct' (now '{decoy}')" in line and "n_agents=2 (now 3)" in line
