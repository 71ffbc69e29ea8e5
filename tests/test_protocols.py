"""Debate protocols (docs/protocols.md): DIGRA's arithmetic on hand-computed cases, subset enumeration,
stopping rules, topologies, pruning on hand-made embeddings, misconception refutation, injection,
composition with the attacks, and the protocol options. Logic runs on the scripted backend and a
table-driven scorer; the real model is in test_protocols_real.py."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from udpo.env.attacks import AttackConfig, apply_attack
from udpo.env.backends.base import Backend, Capabilities, ChatRequest, ScoreRequest
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.protocols import (
    DIGRATopology,
    FullTopology,
    Injection,
    Interventions,
    Protocol,
    ProtocolConfig,
    RandomTopology,
    Refuter,
    SparseTopology,
    StableAgentStop,
    UnanimityStop,
    build_protocol,
)
from udpo.env.protocols.digra import choose_peers, information_gain_ratio, mean_token_entropy, peer_subsets
from udpo.env.protocols.interventions import diversity_prune, quality_prune
from udpo.env.tasks import get_task

AGENT = re.compile(r"\[Agent (\d)\]")


def boxed(value) -> str:
    return f"So the answer is \\boxed{{{value}}}."


def agent_of(req: ChatRequest) -> int:
    return int(req.adapter.split("_")[1])


def team(n: int) -> DebateConfig:
    return DebateConfig(n_agents=n, rounds=2, agents=[AgentSpec(adapter=f"agent_{i}") for i in range(n)])


@pytest.fixture
def arithmetic():
    task = get_task("arithmetic")
    return task, task.load(split="test", limit=2)


# --- DIGRA's arithmetic ----------------------------------------------------------------------
def test_peer_subsets_enumerates_every_nonempty_subset_smallest_first():
    assert peer_subsets([3, 0, 2]) == [(0,), (2,), (3,), (0, 2), (0, 3), (2, 3), (0, 2, 3)]
    assert len(peer_subsets(range(4))) == 2**4 - 1  # N = 5: each agent weighs 15 peer sets
    assert peer_subsets([]) == []


def test_igr_reproduces_the_papers_three_agent_example():
    """Table 10 of the DIGRA paper: agent 1 weighs {2}, {3}, {3, 2}; entropies R3 > R2 > R1; its printed
    ratios are 0.69, 1.37 and 0.91, and agent 3 is chosen. The entropies below are chosen to give
    those ratios (the paper prints only the ratios): Hbar(R1) = 0.49, Hbar(R2) = 0.495, Hbar(R3) = 0.5.
    {2}: IG = 0.49 - 0.34845 = 0.14155, IGR = (0.2 + 0.14155) / 0.495 = 0.69
    {3}: IG = 0.49 - 0.005 = 0.485, IGR = 0.685 / 0.5 = 1.37
    {2,3}: IG = 0.49 - 0.237275 = 0.252725, IGR = 0.452725 / 0.4975 = 0.91"""
    peer = {2: 0.495, 3: 0.5}
    conditional = {(2,): 0.34845, (3,): 0.005, (2, 3): 0.237275}
    best, scores = choose_peers(0.49, conditional, peer)
    assert scores == pytest.approx({(2,): 0.69, (3,): 1.37, (2, 3): 0.91})
    assert best == (3,)


def test_digra_and_dig_differ_when_the_informative_peer_is_uncertain():
    """Hbar(R_i) = 1.0; peers 1 (0.8) and 2 (1.2). IG: {1} 0.25, {2} 0.7, {1,2} 0.65.
    IGR: {1} 0.45/0.8 = 0.5625, {2} 0.9/1.2 = 0.75, {1,2} 0.85/1.0 = 0.85."""
    peer = {1: 0.8, 2: 1.2}
    conditional = {(1,): 0.75, (2,): 0.3, (1, 2): 0.35}
    best, scores = choose_peers(1.0, conditional, peer, alpha=0.2, variant="digra")
    assert best == (1, 2) and scores == pytest.approx({(1,): 0.5625, (2,): 0.75, (1, 2): 0.85})
    best, scores = choose_peers(1.0, conditional, peer, variant="dig")
    assert best == (2,) and scores == pytest.approx({(1,): 0.25, (2,): 0.7, (1, 2): 0.65})
    tie, _ = choose_peers(1.0, {(1,): 0.5, (2,): 0.5}, {1: 1.0, 2: 1.0})
    assert tie == (1,)  # equal ratios: the first subset enumerated


def test_mean_token_entropy_and_zero_denominator():
    assert mean_token_entropy([1.0, 2.0, 4.5]) == pytest.approx(2.5)
    assert mean_token_entropy([]) == 0.0
    assert information_gain_ratio(0.1, [0.0, 0.0]) == math.inf
    assert information_gain_ratio(-0.5, [0.0]) == -math.inf
    assert information_gain_ratio(0.3, [0.5, 1.5], alpha=0.2) == pytest.approx(0.5)


class TableScorer(Backend):
    """Forced-decoding entropies from tables (logic tests only): a response read after the question
    alone gets ``alone[text]``; read after peers, ``conditional[(text, peers in the order shown)]``.
    Records every call's requests."""

    name = "table"
    capabilities = Capabilities(returns_logits=True)

    def __init__(self, alone: dict[str, float], conditional: dict, constant: float | None = None):
        self.alone, self.conditional, self.constant, self.calls = alone, conditional, constant, []

    def generate(self, requests):
        raise NotImplementedError

    def token_entropies(self, requests: list[ScoreRequest]) -> list[list[float]]:
        self.calls.append(list(requests))
        out = []
        for r in requests:
            shown = tuple(int(a) - 1 for a in AGENT.findall(r.messages[-1]["content"]))
            if self.constant is not None:
                value = self.constant
            else:
                value = self.conditional[(r.response, shown)] if shown else self.alone[r.response]
            out.append([value, value])  # two tokens of the same entropy: the mean is the value
        return out


def test_digra_debate_reads_the_chosen_peers_in_descending_entropy(arithmetic):
    """N = 3, T = 1, one question. Agent k says "A{k}" with Hbar 0.5, 1.0, 2.0. Conditional entropies
    make agent 0 read {2, 1} (IGR (0.2 + 0.4) / 1.5 = 0.4 beats {1} 0.3 and {2} 0.15), agent 1 read {0}
    (IGR 1.4 vs {2} 0.35 and {0, 2} 0.64) and agent 2 read {1} (IGR 1.2, vs 0.8 and 0.8)."""
    task, questions = arithmetic
    texts = [f"A{k} {boxed(k)}" for k in range(3)]
    alone = dict(zip(texts, [0.5, 1.0, 2.0], strict=True))
    conditional = {
        (texts[0], (1,)): 0.4, (texts[0], (2,)): 0.4, (texts[0], (2, 1)): 0.1,
        (texts[1], (0,)): 0.5, (texts[1], (2,)): 0.5, (texts[1], (2, 0)): 0.6,
        (texts[2], (0,)): 2.0, (texts[2], (1,)): 1.0, (texts[2], (1, 0)): 1.6,
    }  # fmt: skip
    scorer = TableScorer(alone, conditional)
    backend = ScriptedBackend(lambda req, n: texts[agent_of(req)])
    config = DebateConfig(n_agents=3, rounds=1, agents=[AgentSpec(adapter=f"agent_{i}") for i in range(3)])
    env = DebateEnv(task, backend, config, protocol=[DIGRATopology(task, scorer)])
    (traj,) = env.run(questions[:1], progress=False)
    assert [traj.turns[i][1].reads for i in range(3)] == [[[2, 0], [1, 0]], [[0, 0]], [[1, 0]]]
    shown_to_0 = traj.turns[0][1].messages[-1]["content"]
    assert AGENT.findall(shown_to_0) == ["3", "2"]  # the higher-entropy peer first
    details = traj.turns[0][1].details["digra"]
    assert details["selected"] == [1, 2] and details["igr"]["1,2"] == pytest.approx(0.4)
    assert details["igr"]["1"] == pytest.approx(0.3) and details["igr"]["2"] == pytest.approx(0.15)
    # two batched scoring calls in the round: 3 responses alone, then 3 agents x 3 peer sets
    assert [len(c) for c in scorer.calls] == [3, 9]
    assert all(r.adapter == f"agent_{int(r.response[1])}" for c in scorer.calls for r in c)
    assert traj.meta["protocol"]["name"] == "digra"


def test_digra_scores_a_stopped_agents_response_once_and_asks_it_nothing(arithmetic):
    """Agent 0 repeats its answer (stops after round 1); agents 1 and 2 keep changing theirs."""
    task, questions = arithmetic
    scorer = TableScorer(
        {}, {}, constant=1.0
    )  # every set scores IGR 0.2: ties go to the first, {lowest peer}

    def script(req, n):
        i, rnd = agent_of(req), sum(m["role"] == "assistant" for m in req.messages)
        return boxed(7) if i == 0 else boxed(10 * i + rnd)

    backend = ScriptedBackend(script)
    config = DebateConfig(n_agents=3, rounds=3, agents=[AgentSpec(adapter=f"agent_{i}") for i in range(3)])
    stages = [DIGRATopology(task, scorer), StableAgentStop(), UnanimityStop()]
    (traj,) = DebateEnv(task, backend, config, protocol=stages).run(questions[:1], progress=False)
    assert [len(c) for c in backend.calls] == [3, 3, 2, 2]  # agent 0 stopped after round 1
    assert [t.round for t in traj.turns[0]] == [0, 1]
    assert traj.answers[0] == ["7", "7", "7", "7"]  # carried forward
    # scored before round 1: the 3 round-0 responses, then 3 speakers x 3 peer sets; before round 2: the
    # 3 round-1 responses, 2 speakers x 3 sets; before round 3: only the 2 new round-2 responses (agent
    # 0's round-1 response keeps its entropy), 2 speakers x 3 sets
    assert [len(c) for c in scorer.calls] == [3, 9, 3, 6, 2, 6]
    # agent 1 reads agent 0 in every round; after agent 0 stops, its round-1 response
    assert [t.reads for t in traj.turns[1][1:]] == [[[0, 0]], [[0, 1]], [[0, 1]]]


def test_unanimity_and_stable_agent_stopping_rules(arithmetic):
    task, questions = arithmetic
    # all agree in round 0: the debate ends at once (round 0 only), answers carried forward
    backend = ScriptedBackend(lambda req, n: boxed(3))
    (traj,) = DebateEnv(task, backend, team(3), protocol=[UnanimityStop()]).run(questions[:1], progress=False)
    assert len(backend.calls) == 1 and traj.meta["rounds_run"] == 0 and traj.answers == [["3"] * 3] * 3
    # an unparsed answer repeated is not a stable answer; a parsed one held two rounds is
    outputs = {
        0: ["no idea", "still no idea", "no idea"],
        1: [boxed(1), boxed(1), boxed(2)],
        2: [boxed(5)] * 3,
    }

    def script(req, n):
        return outputs[agent_of(req)][sum(m["role"] == "assistant" for m in req.messages)]

    backend = ScriptedBackend(script)
    (traj,) = DebateEnv(task, backend, team(3), protocol=[StableAgentStop()]).run(
        questions[:1], progress=False
    )
    assert [[r.adapter for r in c] for c in backend.calls] == [
        ["agent_0", "agent_1", "agent_2"],
        ["agent_0", "agent_1", "agent_2"],
        ["agent_0"],
    ]
    assert traj.answers == [[None, None, None], ["1", "1", "1"], ["5", "5", "5"]]


# --- topologies ------------------------------------------------------------------------------
def peers_read(traj) -> list[list[int]]:
    return [[j for j, _ in traj.turns[i][1].reads] for i in range(traj.n_agents)]


def test_full_sparse_and_random_topologies(arithmetic):
    task, questions = arithmetic
    config = DebateConfig(n_agents=5, rounds=1)
    run = lambda stages: DebateEnv(task, ScriptedBackend([boxed(1)]), config, protocol=stages).run(  # noqa: E731
        questions, progress=False
    )
    assert peers_read(run([])[0]) == [[j for j in range(5) if j != i] for i in range(5)]
    assert peers_read(run([FullTopology()])[0]) == peers_read(run([])[0])
    assert peers_read(run([SparseTopology(0.5)])[0]) == [[1, 2], [2, 3], [3, 4], [4, 0], [0, 1]]
    assert peers_read(run([SparseTopology(0.25)])[0]) == [[1], [2], [3], [4], [0]]
    first, again = run([RandomTopology(seed=3)]), run([RandomTopology(seed=3)])
    assert [peers_read(t) for t in first] == [peers_read(t) for t in again]
    drawn = [p for t in first + run([RandomTopology(seed=4)]) for p in peers_read(t)]
    assert all(1 <= len(p) <= 4 and len(set(p)) == len(p) for p in drawn)
    assert len({len(p) for p in drawn}) > 1  # the number of peers varies too
    with pytest.raises(ValueError, match="degree"):
        SparseTopology(0.0)


def test_one_protocol_chooses_the_reads():
    with pytest.raises(ValueError, match="one stage that chooses the reads"):
        Protocol([SparseTopology(), RandomTopology()])
    assert Protocol().name == "standard" and Protocol([UnanimityStop()]).stages[0].name == "standard"


# --- interventions ---------------------------------------------------------------------------
def test_quality_pruning_keeps_the_responses_closest_to_the_question():
    question = np.array([0.0, 0.0])
    vectors = np.array([[3.0, 0.0], [0.5, 0.5], [0.0, 2.0], [1.0, 0.0], [0.0, -0.6]])
    # distances 3, 0.707, 2, 1, 0.6
    assert quality_prune(question, vectors, 2) == [1, 4]
    assert quality_prune(question, vectors, 3) == [1, 3, 4]
    assert quality_prune(question, np.array([[1.0, 0], [0, 1.0]]), 1) == [0]  # tie: lower index


def test_diversity_pruning_picks_the_most_spread_subset():
    # a tight cluster at the origin and three far corners: the corners are the most diverse triple
    vectors = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 0.0], [0.0, 12.0], [0.0, 0.1], [-10.0, -10.0]])
    assert diversity_prune(vectors, 3) == [2, 3, 5]
    assert diversity_prune(vectors, 2) == [3, 5]  # the farthest pair: distance sqrt(10^2 + 22^2)
    assert diversity_prune(vectors, 6) == list(range(6)) and diversity_prune(vectors, 1) == [0]
    assert diversity_prune(vectors, 3, exact_limit=0) == [2, 3, 5]  # the greedy search agrees here
    # where it does not: the farthest pair (2, 3), sqrt(61) apart, is in no best triple. Sums of pairwise distances:
    # {0, 1, 2} = sqrt(37) + sqrt(17) + sqrt(58) = 17.82 (exact), {1, 2, 3} = sqrt(58) + sqrt(5) + sqrt(61) = 17.66
    spread = np.array([[-1.0, -1.0], [0.0, 5.0], [3.0, -2.0], [-2.0, 4.0], [4.0, 0.0]])
    assert diversity_prune(spread, 3) == [0, 1, 2]
    assert diversity_prune(spread, 3, exact_limit=0) == [1, 2, 3]


class Refusing(Backend):
    """A refuter stand-in: lists one error, then returns a corrected text; counts requests."""

    name = "refuter"

    def __init__(self):
        self.calls = []

    def generate(self, requests):
        from udpo.env.backends.base import Completion

        self.calls.append(list(requests))
        out = []
        for r in requests:
            prompt = r.messages[-1]["content"]
            if "A reviewer found" in prompt:
                original = re.search(r"<<<\n(.*?)\n>>>", prompt, re.S).group(1)
                out.append(Completion(text=f"FIXED({original})"))
            else:
                out.append(Completion(text="- the sum is wrong"))
        return out


def embed_table(table: dict[str, list[float]]):
    return lambda texts: np.array([table[t] for t in texts], dtype=float)


def test_interventions_qp_then_dp_then_mr_on_the_pool(arithmetic):
    """Round 1: the pool is the 4 round-0 responses; QP keeps the 2 closest to the question, DP keeps
    both (k = N = 4 >= 2), MR rewrites each with two requests. Round 2: the round-1 choice is left out."""
    task, questions = arithmetic
    question = questions[0]
    texts = {(i, t): f"r{i}{t} {boxed(i)}" for i in range(4) for t in range(3)}
    coords = {question.text: [0.0, 0.0]}
    for (i, t), text in texts.items():
        coords[text] = [float(i + 1), float(t)]  # agent 0 is closest to the question, then 1, ...
    backend = ScriptedBackend(
        lambda req, n: texts[(agent_of(req), sum(m["role"] == "assistant" for m in req.messages))]
    )
    refuter_backend = Refusing()
    stage = Interventions(task, embedder=embed_table(coords), refuter=Refuter(refuter_backend))
    config = DebateConfig(n_agents=4, rounds=2, agents=[AgentSpec(adapter=f"agent_{i}") for i in range(4)])
    (traj,) = DebateEnv(task, backend, config, protocol=[stage]).run([question], progress=False)
    assert all(traj.turns[i][1].reads == [[0, 0], [1, 0]] for i in range(4))
    assert "FIXED(r00" in traj.turns[2][1].messages[-1]["content"]  # agents read the corrected text
    # round 2: pool = 8 responses minus the 2 shown in round 1 -> 6; QP keeps 3: agents 2@0, 0@1, 1@1
    # (distances sqrt(9) = 3, sqrt(2), sqrt(5)); DP with k = 4 keeps all 3
    assert traj.turns[0][2].reads == [[2, 0], [0, 1], [1, 1]]
    assert traj.turns[0][2].details["interventions"] == {"candidates": 6, "shown": [[2, 0], [0, 1], [1, 1]]}
    # MR: exactly two requests per kept response, one batched call per step per round
    assert [len(c) for c in refuter_backend.calls] == [2, 2, 3, 3]
    assert stage.refuter.requests == 2 * (2 + 3)
    assert all(r.adapter is None for c in refuter_backend.calls for r in c)


def test_interventions_order_and_diversity_pruning_in_a_debate(arithmetic):
    task, questions = arithmetic
    question = questions[0]
    texts = [f"agent{i} {boxed(i)}" for i in range(4)]
    coords = {
        question.text: [0.0, 0.0],
        texts[0]: [1, 0],
        texts[1]: [1.1, 0],
        texts[2]: [0, 5],
        texts[3]: [-5, 0],
    }
    backend = ScriptedBackend(lambda req, n: texts[agent_of(req)])
    config = DebateConfig(n_agents=4, rounds=1, agents=[AgentSpec(adapter=f"agent_{i}") for i in range(4)])
    stage = Interventions(task, ops=["dp"], embedder=embed_table(coords), dp_k=2)
    (traj,) = DebateEnv(task, backend, config, protocol=[stage]).run([question], progress=False)
    assert traj.turns[0][1].reads == [[2, 0], [3, 0]]  # the two farthest apart
    with pytest.raises(ValueError, match="needs a refuter"):
        Interventions(task, ops=["mr"], embedder=embed_table(coords))
    with pytest.raises(ValueError, match="distinct names"):
        Interventions(task, ops=["qp", "qp"], embedder=embed_table(coords))


# --- controlled injection --------------------------------------------------------------------
def test_injection_replaces_round0_and_is_checked_against_the_gold(arithmetic, tmp_path):
    task, questions = arithmetic
    backend = ScriptedBackend(lambda req, n: boxed(999))
    stage = Injection(task, ["wrong", "correct", "own"])
    (traj,) = DebateEnv(task, backend, team(3), protocol=[stage]).run(questions[:1], progress=False)
    gold = questions[0].gold
    assert (
        traj.answers[1][0] == gold and traj.answers[0][0] not in (gold, None) and traj.answers[2][0] == "999"
    )
    assert [len(c) for c in backend.calls] == [1, 3, 3]  # only agent 2 answers round 0 itself
    injected = traj.turns[0][0]
    assert injected.finish_reason == "injected" and injected.details == {"inject": "wrong"}
    assert injected.text in traj.turns[1][1].messages[-1]["content"]  # peers read the injected response
    assert [m["role"] for m in traj.turns[0][1].messages][-2:] == ["assistant", "user"]
    assert traj.meta["protocol"]["stages"][-1] == {
        "name": "inject",
        "pattern": ["wrong", "correct", "own"],
        "source": "builtin",
    }

    file = tmp_path / "inject.jsonl"
    file.write_text(
        f'{{"question_id": "{questions[0].id}", "correct": "It is \\\\boxed{{{gold}}}.", "wrong": ["\\\\boxed{{-1}}"]}}\n'
    )
    stage = Injection(task, ["correct", "wrong"], path=str(file))
    assert stage.response(questions[0], "correct", 0) == f"It is \\boxed{{{gold}}}."
    with pytest.raises(ValueError, match=f"no 'correct' response for question '{questions[1].id}'"):
        stage.response(questions[1], "correct", 0)
    file.write_text(f'{{"question_id": "{questions[0].id}", "correct": "\\\\boxed{{-1}}"}}\n')
    with pytest.raises(ValueError, match=r"'correct' response .* parses to '-1'"):
        Injection(task, ["correct"], path=str(file)).response(questions[0], "correct", 0)
    with pytest.raises(ValueError, match="3 entries for 2 agents"):
        DebateEnv(task, backend, team(2), protocol=[Injection(task, ["own", "own", "wrong"])])


# --- composition with the attacks --------------------------------------------------------------
def test_attacks_compose_with_a_topology(arithmetic):
    """AutoInject rewrites what the compromised agent sends; a sparse ring decides who reads it."""
    task, questions = arithmetic
    plan = apply_attack(
        AttackConfig(name="autoinject", attacker="builtin", p_message=1.0, p_sentence=1.0),
        task,
        DebateConfig(n_agents=3, rounds=1),
        [2],
    )
    backend = ScriptedBackend(lambda req, n: "I checked it. " + boxed(4))
    protocol = Protocol([SparseTopology(0.5)], "sparse").with_stages(*plan.stages)
    (traj,) = DebateEnv(task, backend, DebateConfig(n_agents=3, rounds=1), protocol=protocol).run(
        questions[:1], progress=False
    )
    assert peers_read(traj) == [[1], [2], [0]]
    read_by_1 = traj.turns[1][1].messages[-1]["content"]
    assert "It is not the case that I checked it" in read_by_1  # agent 2's corrupted message
    assert "It is not the case" not in traj.turns[2][0].text  # its own turn keeps what it wrote
    assert [s["name"] for s in traj.meta["protocol"]["stages"]] == ["sparse", "autoinject"]

    profiles = apply_attack(AttackConfig(name="autotransform", attacker="builtin"), task, team(3), [0])
    env = DebateEnv(task, ScriptedBackend([boxed(1)]), team(3), protocol=profiles.stages)
    assert env.agents[0].profile == profiles.debate_config.agents[0].profile != task.default_profile
    assert [a.adapter for a in env.agents] == ["agent_0", "agent_1", "agent_2"]


# --- options ---------------------------------------------------------------------------------
def test_protocol_options_are_validated_with_clear_errors():
    assert ProtocolConfig.from_options("digra", {"alpha": 0.5}).options() == {"alpha": 0.5}
    with pytest.raises(ValueError, match="unknown protocol 'digraa'"):
        ProtocolConfig(name="digraa")
    with pytest.raises(ValueError, match="option degree applies to sparse, not to protocol digra"):
        ProtocolConfig.from_options("digra", {"degree": 0.3})
    with pytest.raises(ValueError, match="'alfa' \\(did you mean 'alpha'\\?\\)"):
        ProtocolConfig.from_options("digra", {"alfa": 0.3})
    with pytest.raises(ValueError, match="interventions: distinct names"):
        ProtocolConfig.from_options("interventions", {"interventions": ["qp", "xx"]})
    with pytest.raises(ValueError, match="inject_file needs inject"):
        ProtocolConfig.from_options("standard", {"inject_file": "x.jsonl"})
    with pytest.raises(ValueError, match="option alpha must be a number, got 'high'"):
        ProtocolConfig.from_options("digra", {"alpha": "high"})
    with pytest.raises(ValueError, match="inject: one entry per agent"):
        ProtocolConfig.from_options("standard", {"inject": ["right"]})


def test_build_protocol_by_name(arithmetic):
    task, _ = arithmetic
    backend = ScriptedBackend(["x"])
    assert build_protocol(ProtocolConfig(), task, backend).describe() == {
        "name": "standard",
        "stages": [{"name": "standard"}],
    }
    sparse = build_protocol(ProtocolConfig(name="sparse", degree=0.25), task, backend)
    assert sparse.describe()["stages"] == [{"name": "sparse", "degree": 0.25}]
    interventions = build_protocol(
        ProtocolConfig(name="interventions", interventions=["dp", "mr"]), task, backend
    )
    assert [s.name for s in interventions.stages] == ["interventions"] and interventions.stages[0].ops == [
        "dp",
        "mr",
    ]
    with pytest.raises(
        ValueError,
        match="the scripted backend cannot do \\(no logits\\); set the protocol option entropy_model",
    ):
        build_protocol(ProtocolConfig(name="digra"), task, backend)


def test_attack_evaluation_runs_under_a_protocol(arithmetic):
    from udpo.analysis.attack_eval import evaluate_attacks

    task, questions = arithmetic
    backend = ScriptedBackend(lambda req, n: "I checked it. " + boxed(4))
    attack = AttackConfig(name="autoinject", attacker="builtin", p_message=1.0, p_sentence=1.0)
    config = DebateConfig(n_agents=3, rounds=1)
    summary = evaluate_attacks(
        task,
        backend,
        questions,
        config,
        attack,
        [[2]],
        "m",
        protocol=Protocol([SparseTopology(0.5)], "sparse"),
    )
    assert [r["name"] for r in summary["rows"]] == ["natural", "m1-agents-2"]
    assert summary["rows"][1]["details"]["injections"]["messages_attacked"] == len(questions)


def test_training_recipes_name_a_protocol_and_its_options():
    from udpo.config import ConfigError, TrainConfig

    config = TrainConfig(protocol="digra", protocol_options='{"alpha": 0.5}')
    assert config.protocol_config() == ProtocolConfig(name="digra", alpha=0.5)
    assert TrainConfig(protocol="sparse", protocol_options={"degree": 0.25}).protocol_config().degree == 0.25
    with pytest.raises(ConfigError, match="protocol must be one of"):
        TrainConfig(protocol="woozle")
    with pytest.raises(ConfigError, match="protocol_options: protocol option degree applies to sparse"):
        TrainConfig(protocol="digra", protocol_options={"degree": 0.3})
    with pytest.raises(ConfigError, match="inject replaces round-0 responses"):
        TrainConfig(protocol_options={"inject": ["wrong", "own", "own"]})
    with pytest.raises(
        ConfigError, match="backend 'vllm' does not give; set protocol_options: {entropy_model"
    ):
        TrainConfig(protocol="digra", backend="vllm")
    assert (
        TrainConfig(protocol="digra", backend="vllm", protocol_options={"entropy_model": "m"}).protocol
        == "digra"
    )
