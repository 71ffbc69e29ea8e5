"""A study's records graded again (udpo.study.regrade): each turn's answer read again from its text, the
vote taken again, and every table built from the re-graded debates beside the tables as recorded."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from study_helpers import no_diagnosis_plots

from udpo.env.tasks import get_task
from udpo.env.trajectory import Trajectory, Turn
from udpo.study.grader_comparison import COMPARISON_FILE
from udpo.study.plan import CompareConfig, load_plan
from udpo.study.record import EVALS, METRICS, RUN, RunRecord
from udpo.study.regrade import regrade
from udpo.study.runner import write_results
from udpo.study.tables import REGRADED, build_results, markdown_table

ROOT = Path(__file__).resolve().parents[1]
ARITHMETIC = {"task": "arithmetic", "task_options": {"answer_only": True}}


def debate(qid: str, question: str, gold: str, texts: list[str], recorded: list[str | None]) -> Trajectory:
    """A debate of len(texts) agents and one round after the first, each agent saying the same text twice,
    with the answers, vote and correct of the old grader as given (``recorded``; ties to agent 0)."""
    answers = [[a, a] for a in recorded]
    finals = [a for a in recorded if a is not None]
    prediction = max(finals, key=finals.count) if finals else None  # the old rule: the earliest of a tie
    turns = [[Turn(i, t, [], text, recorded[i]) for t in (0, 1)] for i, text in enumerate(texts)]
    return Trajectory(qid, question, gold, answers, prediction, prediction == gold, turns, {"rounds_run": 1})


def echoed() -> Trajectory:
    """Agent 0 restates "What is 252 / 6?" (the old grader read 42, right); its peers answer 43 and 44."""
    return debate(
        "arithmetic-test-s0-1", "What is 252 / 6?", "42", ["252 / 6", "43", "44"], ["42", "43", "44"]
    )


def digest(key: str, answer: str) -> str:
    return hashlib.sha256(f"{key}\n{answer}".encode()).hexdigest()


def test_an_echoed_division_is_no_answer_and_the_split_votes_by_the_hash_rule():
    task = get_task("arithmetic", answer_only=True)
    old = echoed()
    assert old.correct and old.prediction == "42"
    new = regrade(old, task)
    assert new.answers == [[None, None], ["43", "43"], ["44", "44"]]
    assert [turn.form for turn in new.turns[0]] == ["restatement", "restatement"]
    assert new.prediction == min(("43", "44"), key=lambda a: digest(old.question_id, a))
    assert not new.correct
    assert (new.question_id, new.question, new.gold, new.meta) == (
        old.question_id,
        old.question,
        "42",
        old.meta,
    )
    assert old.answers[0] == ["42", "42"]  # the record itself is left as it was


def test_a_three_way_split_goes_to_the_smallest_digest_whichever_agent_gave_it():
    task = get_task("arithmetic", answer_only=True)
    texts = ["The answer is 41.", "43", "\\boxed{44}"]
    for qid in ("q-a", "q-b", "q-c", "q-d"):
        winner = min(("41", "43", "44"), key=lambda a: digest(qid, a))
        for shift in range(3):  # every agent order
            order = texts[shift:] + texts[:shift]
            d = regrade(debate(qid, "What is 6 * 7?", winner, order, [None, None, None]), task)
            assert d.prediction == winner and d.correct
            assert sorted(row[-1] for row in d.answers) == ["41", "43", "44"]


def test_an_agent_that_did_not_speak_keeps_its_answer_and_a_debate_without_turns_is_refused():
    task = get_task("arithmetic", answer_only=True)
    d = echoed()
    d.turns[2] = d.turns[2][:1]  # agent 2 stopped after round 0
    d.turns[2][0] = Turn(2, 0, [], "42", "42")
    assert regrade(d, task).answers[2] == ["42", "42"]
    with pytest.raises(ValueError, match="keeps no turns"):
        regrade(Trajectory("q", "What is 1 + 1?", "2", [["2"]], "2", True), task)


def write_record(folder: Path, method: str, seed: int, evaluations: dict[int, list[Trajectory]]) -> None:
    """A committed record as udpo study writes one, by hand."""
    folder.mkdir(parents=True)
    lines = [
        json.dumps({**d.to_dict(), "meta": {"iteration": it, "rounds_run": 1}}) + "\n"
        for it, debates in evaluations.items()
        for d in debates
    ]
    (folder / EVALS).write_bytes(gzip.compress("".join(lines).encode(), mtime=0))
    (folder / METRICS).write_bytes(gzip.compress(b'{"kind": "train", "iteration": 1}\n', mtime=0))
    budget = {"iterations": 1, "debates": 2, "optimizer_steps": 1, "generated_tokens": 9, "warmup_debates": 0}
    (folder / RUN).write_text(
        json.dumps(
            {
                "method": method,
                "seed": seed,
                "evaluations": list(evaluations),
                "budget": budget,
                "config": ARITHMETIC,
            }
        )
    )


def plain(qid: str, right: bool) -> Trajectory:
    answer = "12" if right else "13"
    return debate(qid, "What is 3 * 4?", "12", [answer] * 3, [answer] * 3)


def test_the_tables_count_an_echo_right_as_recorded_and_wrong_re_graded(tmp_path, monkeypatch):
    no_diagnosis_plots(monkeypatch)
    results = tmp_path / "results"
    config = CompareConfig(
        recipe="unused.yaml",
        methods=["standard_mad", "task_only", "udpo"],
        seeds=[0, 1],
        output_dir=str(tmp_path / "absent"),
        results_dir=str(results),
        bootstrap_resamples=100,
        comparisons=[["udpo", "task_only"]],
    )
    for seed in (0, 1):
        start = [plain("arithmetic-test-s0-0", False), plain("arithmetic-test-s0-2", False), echoed()]
        start[2] = debate(start[2].question_id, start[2].question, "42", ["43"] * 3, ["43"] * 3)
        write_record(results / "runs" / f"task_only_seed{seed}", "task_only", seed, {0: start, 1: start})
        final = [plain("arithmetic-test-s0-0", True), plain("arithmetic-test-s0-2", False), echoed()]
        write_record(results / "runs" / f"udpo_seed{seed}", "udpo", seed, {1: final})
    recorded = write_results(config, "recorded")
    assert recorded["grader"] == "recorded"
    assert recorded["methods"]["udpo"]["accuracy"]["per_seed"] == [2 / 3, 2 / 3]
    assert (results / "table.md").read_text().startswith("| method |")
    current = write_results(config, "current")
    assert current["methods"]["udpo"]["accuracy"]["per_seed"] == [1 / 3, 1 / 3]
    assert current["methods"]["task_only"]["accuracy"]["per_seed"] == [0.0, 0.0]
    assert current["comparisons"]["udpo - task_only"]["accuracy"]["delta"] == pytest.approx(1 / 3)
    assert recorded["comparisons"]["udpo - task_only"]["accuracy"]["delta"] == pytest.approx(2 / 3)
    table = (results / REGRADED / "table.md").read_text()
    assert table.startswith("Re-graded:") and (results / "table.md").read_text() != table
    totals = current["grader_comparison"]["totals"]
    # per seed, udpo's echoed debate: agent 0's two turns read 42 as recorded, and its vote (42, by the old
    # tie to agent 0) was right; nothing else changed
    assert totals == {
        "turns": 3 * 2 * 3 * 3 * 2,  # methods x seeds x debates x agents x rounds
        "turns_lost": 4,
        "turns_gained": 0,
        "votes": 3 * 2 * 3,
        "votes_lost": 2,
        "votes_gained": 0,
        "votes_lost_tie_rule": 0,
        "votes_gained_tie_rule": 0,
    }
    comparison = (results / REGRADED / COMPARISON_FILE).read_text()
    assert "| udpo | 0.667 [" in comparison and "| -0.333 |" in comparison
    assert "| udpo - task_only | re-graded | +0.333 |" in comparison
    assert "right as recorded and wrong re-graded: 4" in comparison


def test_a_record_without_its_config_cannot_be_re_graded(tmp_path):
    folder = tmp_path / "task_only_seed0"
    write_record(folder, "task_only", 0, {0: [echoed()]})
    run = json.loads((folder / RUN).read_text())
    (folder / RUN).write_text(json.dumps({**run, "config": None}))
    assert RunRecord.load(folder).evaluation(0)[0].correct
    with pytest.raises(ValueError, match="keeps no config"):
        RunRecord.load(folder, "current").evaluation(0)
    with pytest.raises(ValueError, match="unknown grader"):
        RunRecord.load(folder, "newest")


@pytest.mark.slow
def test_the_committed_study_as_recorded_gives_its_committed_table_but_for_u_sys_and_the_forms():
    """The tables of docs/lab/results/debate_reward as recorded are its committed table.md line for line,
    except the U_sys cells (U's leave-one-out votes now break ties by the digest, not by agent order) and
    the answer-forms section (written since): every accuracy and interval of the study is reproduced."""
    config = load_plan(ROOT / "recipes" / "compare" / "debate_reward.yaml")
    results, _ = build_results(config, "recorded")
    committed = (ROOT / "docs" / "lab" / "results" / "debate_reward" / "table.md").read_text().splitlines()
    rebuilt = markdown_table(results).splitlines()
    forms = next(i for i, line in enumerate(rebuilt) if line.startswith("Answer forms"))
    rebuilt = rebuilt[: forms - 1] + rebuilt[rebuilt.index("", forms + 3) :]
    assert len(rebuilt) == len(committed)
    differ = [i for i, (a, b) in enumerate(zip(committed, rebuilt, strict=True)) if a != b]
    assert differ
    for i in differ:  # a row of the seed tables on u_sys, or in the first table only its u_sys cell
        a, b = committed[i].split("|"), rebuilt[i].split("|")
        assert "| u_sys |" in committed[i] or [j for j in range(len(a)) if a[j] != b[j]] == [5]
