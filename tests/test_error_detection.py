"""ColMAD, CopMAD, Ensemble and single-agent error detection: control flow on a scripted backend (logic
only), quote verification, and a ColMAD run through ``udpo detect`` on a tiny random model (the hf
backend's real path; its verdicts are noise)."""

from __future__ import annotations

import json

import pytest

from udpo.analysis.detection import comparison_table, summarize_detection
from udpo.cli import main
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import AgentSpec
from udpo.env.protocols.error_detection import DetectionConfig, make_detector, parse_confidence
from udpo.env.protocols.quotes import is_verified, mark_quotes
from udpo.env.tasks import get_task
from udpo.env.trajectory import read_trajectories
from udpo.rewards.detection import detection_scores

PROFILES = ["Reviewer A checks responses.", "Reviewer B checks responses."]


@pytest.fixture(scope="module")
def task():
    return get_task("realmistake")


@pytest.fixture(scope="module")
def items(task, shared_data):
    return task.load("test", shared_data, limit=6)


def config(**kw) -> DetectionConfig:
    return DetectionConfig(debaters=[AgentSpec(profile=p) for p in PROFILES], **kw)


def role(request) -> str:
    system = request.messages[0]["content"]
    if system.startswith("You judge"):
        return "judge"
    if system in PROFILES:
        return f"solo{PROFILES.index(system)}"
    return "alice" if system.startswith("You are Alice") else "bob"


def item_of(request, items) -> int:
    user = request.messages[-1]["content"]
    return next(k for k, q in enumerate(items) if q.text in user)


def verdict(label: str) -> str:
    return f"I checked it.\nVerdict: {label.replace('_', ' ')}"


def scripted(items, solo: dict[int, tuple[str, str]], debate_text=None, judge_text=None) -> ScriptedBackend:
    """Solo verdicts per item (A, B); debaters and judge answer with the given functions."""

    def script(request, _):
        who, k = role(request), item_of(request, items)
        if who.startswith("solo"):
            return verdict(solo[k][int(who[-1])])
        if who == "judge":
            return judge_text(k) if judge_text else verdict("error")
        return debate_text(who, k, request) if debate_text else verdict("no_error")

    return ScriptedBackend(script)


def test_the_agreement_shortcut_makes_no_judge_call(task, items):
    qs = items[:3]
    backend = scripted(qs, {0: ("error", "error"), 1: ("no_error", "no_error"), 2: ("error", "no_error")})
    out = make_detector("colmad", task, backend, config()).run(qs, progress=False)
    # call 1: both solo answers of all 3 items; calls 2-3: the two rounds of item 2 only; call 4: its judge
    assert [len(c) for c in backend.calls] == [6, 2, 2, 1]
    assert [role(r) for r in backend.calls[3]] == ["judge"]
    later = [item_of(r, qs) for call in backend.calls[1:] for r in call]
    assert set(later) == {2}
    assert [t.meta["judge_called"] for t in out] == [False, False, True]
    assert (out[0].answers, out[0].prediction) == ([["error"], ["error"]], "error")
    assert (out[1].answers, out[1].prediction) == ([["no_error"], ["no_error"]], "no_error")
    assert out[2].answers == [["error", "no_error", "no_error"], ["no_error", "no_error", "no_error"]]
    assert out[2].prediction == "error" and out[2].meta["rounds_run"] == 2  # the judge's verdict
    assert out[2].meta["sides"] == ["error", "no_error"]
    assert all(t.correct == (t.prediction == t.gold) for t in out)

    agreeing = scripted(qs, {k: ("error", "error") for k in range(3)})
    make_detector("colmad", task, agreeing, config()).run(qs, progress=False)
    assert [len(c) for c in agreeing.calls] == [6]  # one call for everything, no judge at all


def test_unparsed_solo_answers_are_no_agreement(task, items):
    qs = items[:1]
    backend = ScriptedBackend(
        lambda r, _: "I am not sure." if role(r).startswith("solo") else verdict("no_error")
    )
    (t,) = make_detector("colmad", task, backend, config(rounds=1)).run(qs, progress=False)
    assert t.meta["judge_called"] and t.meta["sides"] == ["error", "no_error"]
    assert t.answers == [[None, "no_error"], [None, "no_error"]]


def test_collaborative_rounds_read_the_transcript_with_verified_quotes(task, items):
    q = items[0]
    real = q.meta["response"].strip().splitlines()[0][:40]

    def debate_text(who, k, request):
        return (
            f"Position: {who} thinks so.\nEvidence: <quote>{real}</quote> and <quote>words nobody wrote</quote>\n"
            f"Self-audit: I may have misread.\nConfidence: {'0.8' if who == 'alice' else '65%'}\n"
            + verdict("error")
        )

    backend = scripted([q], {0: ("no_error", "error")}, debate_text=debate_text)
    (t,) = make_detector("colmad", task, backend, config()).run([q], progress=False)
    rounds = backend.calls[1:3]
    alice_r1, bob_r1 = rounds[0]
    assert "You currently support the verdict 'no error'" in alice_r1.messages[0]["content"]
    assert "You currently support the verdict 'error'" in bob_r1.messages[0]["content"]
    for r in (alice_r1, bob_r1):
        user = r.messages[-1]["content"]
        assert "Self-audit:" in user and "Confidence:" in user and "<quote></quote>" in user
        assert "This is round 1 of 2" in user and "First answers, each written alone" in user
    bob_r2 = rounds[1][1].messages[-1]["content"]
    assert "alice thinks so" in bob_r2  # round 2 reads round 1
    assert f"<v_quote>{real}</v_quote>" in bob_r2 and "<u_quote>words nobody wrote</u_quote>" in bob_r2
    judge = backend.calls[3][0].messages[-1]["content"]
    assert judge.count(f"<v_quote>{real}</v_quote>") == 4 and "<quote>" not in judge
    assert "Alice stands for the verdict 'error' and Bob for 'error'" in judge  # their latest verdicts
    assert t.meta["quotes"] == {"verified": [2, 2], "unverified": [2, 2]}
    assert t.meta["confidence"] == [[None, 0.8, 0.8], [None, 0.65, 0.65]]


def test_copmad_assigns_sides_and_always_asks_the_judge(task, items):
    qs = items[:2]
    backend = scripted(qs, {}, judge_text=lambda k: verdict("no_error"))
    out = make_detector("copmad", task, backend, config(rounds=2)).run(qs, progress=False)
    assert [len(c) for c in backend.calls] == [4, 4, 4, 2]  # opening, 2 rebuttals, judge: all items each time
    opening = backend.calls[0]
    assert (
        "argue that the correct verdict on the model response is 'error'" in opening[0].messages[0]["content"]
    )
    assert "is 'no error'" in opening[1].messages[0]["content"]
    assert "The debate starts now." in opening[0].messages[-1]["content"]
    assert "Opening statements" in backend.calls[1][0].messages[-1]["content"]
    assert all(t.meta["judge_called"] and t.meta["sides"] == ["error", "no_error"] for t in out)
    assert [t.prediction for t in out] == ["no_error", "no_error"]
    assert all(len(row) == 3 for t in out for row in t.answers)


def test_ensemble_takes_the_common_verdict_else_a_seeded_draw(task, items):
    qs = items[:6]
    solo = {k: ("error", "error") if k < 2 else ("error", "no_error") for k in range(6)}
    out = make_detector("ensemble", task, scripted(qs, solo), config(seed=3)).run(qs, progress=False)
    assert [t.prediction for t in out[:2]] == ["error", "error"] and not out[0].meta["random_choice"]
    drawn = [t.prediction for t in out[2:]]
    assert set(drawn) <= {"error", "no_error"} and all(t.meta["random_choice"] for t in out[2:])
    again = make_detector("ensemble", task, scripted(qs, solo), config(seed=3)).run(qs, progress=False)
    assert [t.prediction for t in again] == [t.prediction for t in out]  # reproducible per seed and item
    other_seeds = [
        [
            t.prediction
            for t in make_detector("ensemble", task, scripted(qs, solo), config(seed=s)).run(
                qs, progress=False
            )[2:]
        ]
        for s in range(4, 10)
    ]
    assert any(d != drawn for d in other_seeds)  # the draw does depend on the seed


def test_single_agent_asks_once_per_item(task, items):
    qs = items[:3]
    backend = scripted(qs, {0: ("error", ""), 1: ("no_error", ""), 2: ("error", "")})
    out = make_detector("single", task, backend, config()).run(qs, progress=False)
    assert [len(c) for c in backend.calls] == [3]
    assert [t.answers for t in out] == [[["error"]], [["no_error"]], [["error"]]]


def test_quote_verification_by_exact_match():
    sources = ["Generate a problem about trains.", "Answer: 42 km"]
    assert is_verified("about trains", sources) and is_verified("  Answer: 42 km\n", sources)
    assert not is_verified("About trains", sources)  # case matters
    assert not is_verified("trains. Answer", sources)  # across the two sources
    assert not is_verified("   ", sources)
    check = mark_quotes(
        "See <quote>a problem</quote>, <quote>42 miles</quote>, <quote></quote> and <quote>Answer: 42",
        sources,
    )
    assert check.text == (
        "See <v_quote>a problem</v_quote>, <u_quote>42 miles</u_quote>, <u_quote></u_quote> and "
        "<u_quote>Answer: 42</u_quote>"  # unclosed: not verified although the words occur
    )
    assert (check.verified, check.unverified) == (1, 3)


@pytest.mark.parametrize(
    ("text", "value"),
    [("Confidence: 0.7", 0.7), ("**Confidence:** 85%", 0.85), ("confidence = 90", 0.9), ("Conf 0.3", None)],
)
def test_stated_confidence(text, value):
    assert parse_confidence(text) == value


def test_protocols_need_a_binary_task():
    with pytest.raises(ValueError, match="two verdict labels .* 'gsm8k' has none"):
        make_detector("colmad", get_task("gsm8k"), ScriptedBackend(["x"]))
    with pytest.raises(ValueError, match="unknown error-detection protocol 'mad'"):
        make_detector("mad", get_task("realmistake"), ScriptedBackend(["x"]))


def test_per_task_and_mean_tables(task, items):
    solo = {k: ("error", "error") if k % 2 else ("no_error", "no_error") for k in range(6)}
    out = make_detector("colmad", task, scripted(items, solo), config()).run(items, progress=False)
    summary = summarize_detection(out)
    assert set(summary["per_task"]) == {q.meta["subtask"] for q in items}
    for name, s in summary["per_task"].items():
        mine = [t for t in out if t.meta["subtask"] == name]
        assert s == detection_scores([t.prediction for t in mine], [t.gold for t in mine]).to_dict()
    assert summary["mean"]["f2"] == pytest.approx(sum(s["f2"] for s in summary["per_task"].values()) / 3)
    table = comparison_table([summary], labels=["colmad"])
    assert table.splitlines()[0].startswith("| run | n | answerability_classification F1 |")


def test_colmad_through_the_cli_on_a_tiny_model(tmp_path, tiny_model, capsys):
    """A ColMAD run through ``udpo detect``: two debaters and a judge on the tiny model, on 2 answerability
    items (short inputs)."""
    out = tmp_path / "colmad"
    args = ["detect", "--model", tiny_model, "--protocol", "colmad", "--limit", "2"]
    args += ["--split", "answerability_classification:gpt4"]
    assert main([*args, "--rounds", "1", "--max-tokens", "12", "--output-dir", str(out), "--seed", "1"]) == 0
    printed = capsys.readouterr().out
    trajectories = read_trajectories(out / "trajectories.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert len(trajectories) == summary["n_items"] == 2
    for t in trajectories:
        first = [row[0] for row in t.answers]
        agreed = first[0] is not None and first[0] == first[1]
        assert t.meta["judge_called"] == (not agreed)
        if agreed:
            assert t.prediction == first[0] and len(t.answers[0]) == 1
        else:
            assert len(t.answers[0]) == 2 and t.meta["judge"]["text"]
            assert t.prediction == get_task("realmistake").parse(t.meta["judge"]["text"], None)
        assert all(turn.completion_ids and len(turn.completion_ids) <= 12 for row in t.turns for turn in row)
    s = detection_scores([t.prediction for t in trajectories], [t.gold for t in trajectories])
    assert summary["overall"] == s.to_dict()
    assert summary["judge_calls"] == sum(t.meta["judge_called"] for t in trajectories)
    assert "answerability_classification" in printed and "mean over tasks" in printed
