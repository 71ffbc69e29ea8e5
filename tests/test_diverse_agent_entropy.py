"""DiverseAgentEntropy and self-consistency procedures: question generation and selection, 1-1 cross-play
and its stopping rules, clustering (scripted backend, logic only), and runs through ``udpo uncertainty`` on
a tiny random model that writes option letters (the hf backend's real path)."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from udpo.cli import main
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.protocols.answer_clusters import AnswerJudge, cluster_by_match, normalize_answer
from udpo.env.protocols.diverse_agent_entropy import (
    ANSWER_PROFILE,
    EXTRACT_PROFILE,
    DAEConfig,
    DiverseAgentEntropy,
    SCConfig,
    SelfConsistency,
    answer_text,
    query_stem,
)
from udpo.env.protocols.varied_questions import (
    CONCEPT_PROMPT,
    QuestionSet,
    keeps_query,
    list_lines,
    select_questions,
)
from udpo.env.tasks import TASK_NAMES, Question, get_task
from udpo.env.trajectory import read_trajectories
from udpo.rewards.diverse_agent_entropy import STRICT_THRESHOLD, diverse_agent_entropy


@pytest.fixture(scope="module")
def task():
    return get_task("commonsenseqa")


@pytest.fixture(scope="module")
def items(task, shared_data):
    return task.load("dev", shared_data, limit=2)


def agent_script(items, interact, minority: str = "B"):
    """Generation steps answer in the expected formats; an agent's first answer is A, except the agent
    holding the paraphrase ("Put differently: ..."), which says ``minority``; ``interact(own, rnd,
    partner)`` gives an agent's answer in cross-play round ``rnd``."""

    def script(request, _):
        system, user = request.messages[0]["content"], request.messages[-1]["content"]
        stem = next((query_stem(q) for q in items if query_stem(q) in user), None)
        if system == CONCEPT_PROMPT:
            return "What is a thing used for?"
        if system.startswith("List up to"):
            return "1. history\n- culture\n* science\n"
        if system.startswith("Write 1 new questions"):
            aspect = user.split("Aspect: ")[1]
            return f"Q1: From the angle of {aspect}: {stem}"
        if system.startswith("Write 1 different questions"):
            return f"Put differently: {user}"
        if system == EXTRACT_PROFILE:
            return f"Answer: ({re.search(r'I believe ([A-E])', user).group(1)})"
        assert system == ANSWER_PROFILE
        if len(request.messages) == 2:
            return f"I believe {minority}" if user.startswith("Put differently") else "I believe A"
        own = re.search(r"I believe ([A-E])", request.messages[2]["content"]).group(1)
        partner = re.search(r"was: \(([A-E])\)", user).group(1)
        rnd = sum(m["role"] == "user" for m in request.messages) - 1
        return f"Answer: ({interact(own, rnd, partner)})"

    return script


def run_dae(task, items, interact, **kw):
    backend = ScriptedBackend(agent_script(items, interact))
    config = DAEConfig(n_agents=5, n_aspects=3, per_aspect=1, **kw)
    return backend, DiverseAgentEntropy(task, backend, config).run(items, progress=False)


def test_questions_are_generated_selected_and_batched(task, items):
    backend, out = run_dae(task, items, lambda own, rnd, partner: own, max_rounds=4)
    # concept, aspects, aspect questions (3 per item), paraphrases, answers, extraction, then 2 rounds
    assert [len(c) for c in backend.calls] == [2, 2, 6, 2, 10, 10, 10, 10]
    for t, q in zip(out, items, strict=True):
        stem = query_stem(q)
        assert t.meta["concept"] == "What is a thing used for?"
        assert t.meta["aspects"] == ["history", "culture", "science"]
        assert t.meta["questions"] == [
            q.text,  # the query itself, with its options
            f"Put differently: {stem}",
            *(f"From the angle of {a}: {stem}" for a in ("history", "culture", "science")),
        ]
        assert [turns[0].messages[-1]["content"] for turns in t.turns] == t.meta["questions"]


def test_a_stubborn_minority_stops_after_two_stable_rounds(task, items):
    backend, out = run_dae(task, items, lambda own, rnd, partner: own, max_rounds=4)
    for t, q in zip(out, items, strict=True):
        assert t.meta["rounds_run"] == 2  # nobody moved in rounds 1 and 2
        assert t.answers == [["A"] * 3, ["B"] * 3, ["A"] * 3, ["A"] * 3, ["A"] * 3]
        for partners in t.meta["partners"]:  # everyone talks to someone who disagrees
            assert partners[1] in (0, 2, 3, 4) and [partners[j] for j in (0, 2, 3, 4)] == [1] * 4
        assert t.meta["partners"][0][1] != t.meta["partners"][1][1]  # agent 1 meets someone new
        assert t.meta["weights"] == pytest.approx([0.2] * 5)
        assert t.meta["entropy"] == pytest.approx(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2)))
        assert t.prediction == "A" and t.meta["abstain"] == {"strict": False, "loose": False}
        # the cross-play prompt shows the partner's question and its answer with the option text
        prompt = t.turns[0][1].messages[-1]["content"]
        assert f'asked: "{t.meta["questions"][1]}"' in prompt and f"was: (B) {q.options[1]}." in prompt


def test_the_minority_is_convinced_and_the_agents_agree(task, items):
    _, out = run_dae(task, items, lambda own, rnd, partner: partner if own == "B" else own, max_rounds=4)
    for t in out:
        assert t.meta["rounds_run"] == 1 and t.meta["changes"] == [0, 1, 0, 0, 0]
        assert t.meta["entropy"] == 0.0 and t.prediction == "A"


def test_the_round_cap_ends_endless_flipping(task, items):
    def interact(own, rnd, partner):
        return ("C" if rnd % 2 else "B") if own == "B" else own

    backend, out = run_dae(task, items, interact, max_rounds=3)
    assert len(backend.calls) == 6 + 3
    for t in out:
        assert t.meta["rounds_run"] == 3 and t.answers[1] == ["B", "C", "B", "C"]
        assert t.meta["changes"] == [0, 3, 0, 0, 0]
        # weights (R - r + 1): 4, 1, 4, 4, 4 over 17
        assert dict(map(tuple, t.meta["distribution"])) == pytest.approx({"A": 16 / 17, "C": 1 / 17})


def test_unanimous_first_answers_need_no_interaction(task, items):
    backend = ScriptedBackend(agent_script(items, lambda own, rnd, partner: own, minority="A"))
    out = DiverseAgentEntropy(task, backend, DAEConfig(n_aspects=3, per_aspect=1)).run(items, progress=False)
    assert len(backend.calls) == 6  # no cross-play call
    assert all(t.meta["rounds_run"] == 0 and t.meta["entropy"] == 0 for t in out)


def test_self_consistency_samples_the_query(task, items):
    replies = iter(["Answer: (A)", "Answer: (A)", "Answer: (B)", "Answer: (A)", "no idea"] * 2)
    backend = ScriptedBackend(lambda r, n: next(replies))
    out = SelfConsistency(task, backend, SCConfig(samples=5)).run(items, progress=False)
    assert [len(c) for c in backend.calls] == [10]
    assert all(
        r.messages[-1]["content"] == task.prompt(items[i // 5]) for i, r in enumerate(backend.calls[0])
    )
    t = out[0]
    assert t.answers == [["A"], ["A"], ["B"], ["A"], [None]] and t.prediction == "A"
    assert t.meta["votes"] == 3 and t.meta["abstain"]["sc_3_of_5"] is False
    assert t.meta["entropy"] == pytest.approx(-(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2)))
    assert t.meta["abstain"]["strict"] is True and t.meta["abstain"]["loose"] is False


def test_answer_clustering_by_normalized_match_and_llm_judge():
    assert normalize_answer("  The Eiffel   Tower. ") == "eiffel tower" and normalize_answer(None) is None
    # each cluster's representative is its member that sorts first as text, wherever it came
    assert cluster_by_match(["The Paris", "paris.", "Lyon", None, "LYON"]) == [
        "The Paris",
        "The Paris",
        "LYON",
        None,
        "LYON",
    ]
    assert cluster_by_match(["LYON", "paris.", None, "Lyon", "The Paris"]) == [
        "LYON",
        "The Paris",
        None,
        "LYON",
        "The Paris",
    ]
    asked = []

    def judge(request, _):
        asked.append(request.messages[-1]["content"])
        text = request.messages[-1]["content"]
        return "Yes." if "Paris" in text and "capital of France" in text else "No"

    backend = ScriptedBackend(judge)
    maps = AnswerJudge(backend).merge(
        [("Capital of France?", ["Paris", "capital of France", "Lyon", None]), ("Other?", ["x", "y"])]
    )
    assert (
        len(backend.calls) == 1 and len(asked) == 4
    )  # 3 pairs of the first item (None is never asked), 1 of the second
    assert maps[0] == {"Paris": "Paris", "capital of France": "Paris", "Lyon": "Lyon", None: None}
    assert maps[1] == {"x": "x", "y": "y"}
    # the same cluster given the other way round keeps the same representative
    again = AnswerJudge(backend).merge([("Capital of France?", ["capital of France", "Paris"])])
    assert again == [{"capital of France": "Paris", "Paris": "Paris"}]


def test_question_filters_and_selection():
    query = "Which river flows through the capital of Hungary?"
    assert keeps_query("How did trade shape which river flows through the capital of Hungary?", query)
    assert not keeps_query("What is the capital of France?", query)  # lost the query's content
    assert not keeps_query(query, query) and not keeps_query("Which river flows through Hungary", query)
    assert list_lines("1. first\n\n- second\nQ3: third?\n* first\n", 5) == ["first", "second", "third?"]
    qs = QuestionSet(query="q?", aspect_questions=[["a1", "a2", "a3"], [], ["c1"]], paraphrases=["p1", "p2"])
    rng = random.Random(0)
    chosen = select_questions(qs, 5, rng)
    # the query, a paraphrase, one question per aspect (a, c), then a second one of aspect a before
    # the remaining paraphrase
    assert chosen[0] == "q?" and chosen[1] in ("p1", "p2") and chosen[3] == "c1"
    assert chosen[2].startswith("a") and chosen[4].startswith("a") and chosen[2] != chosen[4]
    assert select_questions(QuestionSet(query="q?"), 3, rng) == ["q?", "q?", "q?"]
    few = select_questions(QuestionSet(query="q?", paraphrases=["p1", "p2", "p3"]), 4, random.Random(1))
    assert few[0] == "q?" and sorted(few[1:]) == ["p1", "p2", "p3"]


def test_answer_text_reads_like_the_task(task, items):
    q = items[0]
    assert answer_text(task, q, "B") == f"(B) {q.options[1]}" and answer_text(task, q, None) == "I don't know"
    assert answer_text(get_task("realmistake"), Question("x", "t", "error"), "no_error") == "no error"


def test_configs_refuse_impossible_settings():
    with pytest.raises(ValueError, match="n_agents must be >= 2"):
        DAEConfig(n_agents=1)
    with pytest.raises(ValueError, match="min_votes"):
        SCConfig(samples=5, min_votes=6)


@pytest.mark.slow
def test_runs_on_a_tiny_model_and_diagnose(tmp_path, tokenizer_path):
    """DiverseAgentEntropy (3 agents, 1 round) and self-consistency on 2 CommonsenseQA questions through
    ``udpo uncertainty``, on a tiny random model that favours "(", ")" and the option letters (some of its
    answers parse, and differ: a cross-play round runs); ``udpo diagnose`` reads the DAE run and agrees
    on its score."""
    from tiny_models import build_tiny_llama

    letters = {"(": 9.0, ")": 9.0, **{c: 9.0 for c in "ABCDE"}, " ": 8.0}
    model = build_tiny_llama(tmp_path / "model", tokenizer_path, initializer_range=0.3, favour=letters)
    common = [
        "--model",
        model,
        "--task",
        "commonsenseqa",
        "--split",
        "dev",
        "--limit",
        "2",
        "--max-tokens",
        "10",
        "--seed",
        "3",
    ]
    dae_dir, sc_dir = tmp_path / "dae", tmp_path / "sc"
    dae_args = ["--n-agents", "3", "--max-rounds", "1", "--aspects", "1", "--per-aspect", "1"]
    assert main(["uncertainty", *common, *dae_args, "--output-dir", str(dae_dir)]) == 0
    assert main(["uncertainty", "--method", "self-consistency", *common, "--output-dir", str(sc_dir)]) == 0
    dae = read_trajectories(dae_dir / "trajectories.jsonl")
    summary = json.loads((dae_dir / "summary.json").read_text())
    assert summary["n_items"] == len(dae) == 2 and set(summary["policies"]) == {"none", "strict", "loose"}
    for t in dae:
        assert len(t.answers) == 3 and len(t.meta["questions"]) == 3 and t.meta["rounds_run"] in (0, 1)
        score = diverse_agent_entropy(t.answers, rounds=t.meta["rounds_run"], key=t.question_id)
        assert t.meta["entropy"] == pytest.approx(score.entropy) and t.prediction == score.prediction
        assert t.meta["abstain"]["strict"] == score.abstains(STRICT_THRESHOLD)
        assert all(turn.completion_ids for row in t.turns for turn in row)
    assert any(t.meta["rounds_run"] == 1 for t in dae)  # answers that differ: the cross-play round ran
    sc = read_trajectories(sc_dir / "trajectories.jsonl")
    assert [len(t.answers) for t in sc] == [5, 5]
    sc_policies = json.loads((sc_dir / "summary.json").read_text())["policies"]
    assert set(sc_policies) == {"none", "sc_3_of_5", "strict", "loose"}
    out = tmp_path / "diagnosis"
    assert main(["diagnose", str(dae_dir), "--out", str(out), "--no-plots"]) == 0
    diagnosed = json.loads((out / "summary.json").read_text())["runs"]["dae"]
    assert diagnosed["dae"] == pytest.approx(sum(t.meta["normalized_entropy"] for t in dae) / 2)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_task_runs_through_both_methods(name, shared_data):
    """A model that never answers: every task's questions go through all steps; nothing to answer means
    the largest entropy (each "no answer" a cluster of its own, by the silence rule), no prediction, and
    abstention under every policy."""
    task = get_task(name, difficulty=[1], n_questions=2) if name == "arithmetic" else get_task(name)
    questions = task.load("test", None if name.endswith("arithmetic") else shared_data, limit=2)
    backend = ScriptedBackend(["I would rather not say."])
    config = DAEConfig(n_agents=3, n_aspects=2, per_aspect=1)
    for t in DiverseAgentEntropy(task, backend, config).run(questions, progress=False):
        assert t.answers == [[None]] * 3 and t.prediction is None and not t.correct
        assert t.meta["normalized_entropy"] == pytest.approx(1.0) and all(t.meta["abstain"].values())
        assert len(t.meta["questions"]) == 3
    for t in SelfConsistency(task, backend, SCConfig(samples=3, min_votes=2)).run(questions, progress=False):
        assert t.answers == [[None]] * 3 and all(t.meta["abstain"].values())
