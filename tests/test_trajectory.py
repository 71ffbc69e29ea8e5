"""Trajectory JSONL files: round trip, append-only, whole lines, validation naming the line."""

from __future__ import annotations

import json

import pytest

from udpo.env.trajectory import (
    Trajectory,
    TrajectoryFormatError,
    TrajectoryWriter,
    Turn,
    iter_records,
    read_trajectories,
)


def make(qid: str, answers=None) -> Trajectory:
    answers = answers or [["1", "2"], [None, "2"]]
    turns = [
        [
            Turn(
                agent=i,
                round=t,
                messages=[{"role": "user", "content": "q"}],
                text=f"t{i}{t}",
                answer=a,
                prompt_ids=[1, 2],
                completion_ids=[3],
                logprobs=[-0.5],
            )
            for t, a in enumerate(row)
        ]
        for i, row in enumerate(answers)
    ]
    return Trajectory(
        question_id=qid,
        question="q?",
        gold="2",
        answers=answers,
        prediction="2",
        correct=True,
        turns=turns,
        meta={"task": "x"},
    )


def test_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write([make("a"), make("b")])
    back = read_trajectories(path)
    assert [t.question_id for t in back] == ["a", "b"]
    assert back[0] == make("a")
    assert back[0].n_agents == 2 and back[0].n_rounds == 1
    assert back[0].answers[1][0] is None


def test_appends_never_rewrites(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write([make("a")])
    first = path.read_bytes()
    with TrajectoryWriter(path) as w:
        w.write([make("b")])
    assert path.read_bytes().startswith(first)
    assert len(path.read_text().splitlines()) == 2


def test_partial_tail_is_dropped_on_open(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write([make("a")])
    with open(path, "a") as fh:  # a crashed writer left half a line
        fh.write('{"question_id": "b", "answ')
    with TrajectoryWriter(path) as w:
        w.write([make("c")])
    assert [t.question_id for t in read_trajectories(path)] == ["a", "c"]


def test_required_keys_are_present_in_each_line(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write([make("a")])
    d = json.loads(path.read_text())
    for key in ("question_id", "answers", "gold", "prediction", "correct", "turns"):
        assert key in d
    turn = d["turns"][0][0]
    for key in ("messages", "text", "prompt_ids", "completion_ids", "logprobs"):
        assert key in turn


def test_the_trainers_logprobs_stay_in_memory(tmp_path):
    """A turn's trainer log-probs are the ratio's denominator in memory and never reach a trajectory file:
    a debate the trainer scored writes the same line as before, and reads back with the engine's."""
    t = make("a")
    line = json.dumps(t.to_dict())
    t.turns[0][0].trainer_logprobs = [-0.25]
    assert t.turns[0][0].behavior_logprobs == [-0.25] and t.turns[0][1].behavior_logprobs == [-0.5]
    assert json.dumps(t.to_dict()) == line
    assert Trajectory.from_dict(t.to_dict()).turns[0][0].behavior_logprobs == [-0.5]
    record = t.to_dict()
    record["turns"][0][0]["trainer_logprobs"] = [-0.25]  # not a key of the file format
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(TrajectoryFormatError, match="unknown key"):
        list(iter_records(tmp_path / "t.jsonl"))


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "t.jsonl:2"),
        ('{"question_id": "x", "gold": 1, "prediction": 1, "correct": true}', "missing key(s) answers"),
        (
            '{"question_id": "x", "answers": [["1"], ["1", "2"]], "gold": 1, "prediction": 1, "correct": true}',
            "ragged",
        ),
        ("[1, 2]", "JSON object"),
    ],
)
def test_bad_line_is_named(tmp_path, line, needle):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write([make("a")])
    with open(path, "a") as fh:
        fh.write(line + "\n")
    with pytest.raises(TrajectoryFormatError, match="t.jsonl:2") as err:
        list(iter_records(path))
    assert needle in str(err.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_trajectories(tmp_path / "nope.jsonl")


def test_write_json_replaces_the_file_whole(tmp_path, monkeypatch):
    """udpo.env.jsonl.write_json, the one atomic writer: folders made, the old file kept when the rename
    fails, no temporary file left either way."""
    import os

    from udpo.env.jsonl import write_json

    path = tmp_path / "a" / "summary.json"
    write_json(path, {"x": 1, "name": "Zoë"})
    assert path.read_text(encoding="utf-8") == '{\n  "x": 1,\n  "name": "Zoë"\n}\n'

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"x": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text(encoding="utf-8")) == {"x": 1, "name": "Zoë"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]
