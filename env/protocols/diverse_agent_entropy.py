"""DiverseAgentEntropy (paper sections 3.3-3.5) and the self-consistency baseline, on any QA task.

**DiverseAgentEntropy** (``DiverseAgentEntropy``), per query, every step one backend call for the batch:

1. varied questions (:mod:`.varied_questions`): conceptualize, aspects, aspect questions, paraphrases,
   then the n agents' questions: the query itself (for multiple choice with its options), a
   paraphrase, and aspect questions from distinct aspects;
2. each agent (the same model) answers its own question freely; the answer it implies for the query
   is then extracted by a separate call that shows only that response and the query in the task's
   format (so it parses like any answer of the task; nothing parseable is "I don't know", ``None``);
3. 1-1 cross-play, rounds 1..R*: every agent is paired with a randomly chosen agent whose current
   answer differs, preferring one it has not met yet; it sees its own conversation so far plus the
   partner's question and the partner's previous-round answer, and states its actual answer to the
   query in the task's format (parsed directly). Rounds are synchronous. The interaction ends when all
   agents agree, when no agent changed its answer in two consecutive rounds, or after R* rounds;
4. answers are clustered (:mod:`.answer_clusters`: normalized match, optionally an LLM judge at
   scoring time; partner choice and stopping use normalized match) and scored by
   :func:`udpo.rewards.diverse_agent_entropy.diverse_agent_entropy`: weights from each agent's answer
   changes over the R rounds run, the weighted answer distribution, its entropy, the prediction, and
   strict / loose abstention.

**Self-consistency** (``SelfConsistency``): k samples of the task's own prompt (one call), clustered
the same way; the entropy of their answers, the majority prediction, SC(3/5) abstention, and the
strict / loose entropy thresholds for comparison.

Each query becomes a :class:`Trajectory` whose answer matrix is the agents' clustered answers per round
(n x (R+1); k x 1 for self-consistency), so ``udpo diagnose`` reads these runs like debates; ``meta``
holds the questions, the score, the weights, the partners and the abstention decisions.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

from udpo.rewards.diverse_agent_entropy import (
    SC_MIN_VOTES,
    THRESHOLDS,
    diverse_agent_entropy,
    self_consistency,
)

from ..backends.base import Backend, SamplingParams
from ..debate import AgentSpec
from ..tasks.base import Answer, Question, Task
from ..trajectory import Trajectory, Turn
from .answer_clusters import AnswerJudge, cluster_by_match, normalize_answer
from .procedures import Procedure, chat, generate, make_turn, request
from .varied_questions import QuestionGenerator, select_questions

ANSWER_PROFILE = "You answer questions accurately and concisely, keeping to what the question asks."
EXTRACT_PROFILE = (
    "You read a response and report which answer it gives to a question, using only what the response "
    "says and no knowledge of your own. If the response gives no answer to that question, say that you "
    "do not know."
)


@dataclass
class DAEConfig:
    """DiverseAgentEntropy settings.

    n_agents: n, agents and varied questions (paper: 5). max_rounds: R*, the cap on interaction rounds
    (the paper's ablations use 4). n_aspects / per_aspect: perspectives asked for and questions per
    perspective (paper: up to 5 and 5; 3 keeps CPU runs cheap). agent: the model under test (every agent
    and every generation step). sampling: of every call. cluster_judge: also merge answers an LLM judges
    equivalent. batch_size: queries handled together. seed: question selection and partner draws.
    """

    n_agents: int = 5
    max_rounds: int = 4
    n_aspects: int = 5
    per_aspect: int = 3
    agent: AgentSpec = field(default_factory=AgentSpec)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cluster_judge: bool = False
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_agents < 2:
            raise ValueError(f"n_agents must be >= 2 (1-1 interaction needs a partner), got {self.n_agents}")
        if self.max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0, got {self.max_rounds}")


@dataclass
class SCConfig:
    """Self-consistency settings: ``samples`` answers to the query (paper: 5); SC(``min_votes``/samples)
    abstains unless the majority answer has that many votes; the rest as in :class:`DAEConfig`."""

    samples: int = 5
    min_votes: int = SC_MIN_VOTES
    agent: AgentSpec = field(default_factory=AgentSpec)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cluster_judge: bool = False
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 1 or not 1 <= self.min_votes <= self.samples:
            raise ValueError(
                f"need samples >= 1 and 1 <= min_votes <= samples, got {self.samples}, {self.min_votes}"
            )


def query_stem(question: Question) -> str:
    """The query without its lettered options (the text varied questions are written about)."""
    if "question" in question.meta:
        return str(question.meta["question"])
    if question.options:
        head, sep, _ = question.text.rpartition("\n\n(A) ")
        return head if sep else question.text
    return question.text


def answer_text(task: Task, question: Question, answer: Answer) -> str:
    """An answer as an agent reads it: "(B) Paris" for an option, the verdict's wording for a labelled
    task, "I don't know" for None."""
    if answer is None:
        return "I don't know"
    if question.options and isinstance(answer, str) and len(answer) == 1:
        index = ord(answer) - ord("A")
        if 0 <= index < len(question.options):
            return f"({answer}) {question.options[index]}"
    label_text = getattr(task, "label_text", None)
    return label_text(answer) if label_text else str(answer)


def _clusters(
    judge: AnswerJudge | None, items: list[tuple[Question, list[Answer]]]
) -> list[dict[Answer, Answer]]:
    """Per item, a map answer -> cluster representative (normalized match, then the judge if any)."""
    maps = []
    for _, answers in items:
        reps = cluster_by_match(answers)
        maps.append(dict(zip(answers, reps, strict=True)))
    if judge is None:
        return maps
    merged = judge.merge(
        [(query_stem(q), list(dict.fromkeys(m.values()))) for (q, _), m in zip(items, maps, strict=True)]
    )
    return [{a: j[r] for a, r in m.items()} for m, j in zip(maps, merged, strict=True)]


class DiverseAgentEntropy(Procedure):
    """Varied questions, agents, 1-1 cross-play and the weighted entropy (see the module docstring)."""

    name = "diverse_agent_entropy"

    def __init__(
        self, task: Task, backend: Backend, config: DAEConfig | None = None, meta: dict | None = None
    ):
        self.config = config or DAEConfig()
        super().__init__(task, backend, self.config.batch_size, meta)
        cfg = self.config
        self.generator = QuestionGenerator(backend, cfg.agent, cfg.sampling, cfg.n_aspects, cfg.per_aspect)
        self.judge = AnswerJudge(backend, cfg.agent) if cfg.cluster_judge else None

    def _call(self, prompts: list[list[dict[str, str]]]) -> list[tuple]:
        reqs = [request(self.config.agent, m, self.config.sampling) for m in prompts]
        return list(zip(reqs, generate(self.backend, reqs), strict=True))

    def run_batch(self, questions: list[Question]) -> list[Trajectory]:
        cfg, n = self.config, self.config.n_agents
        rngs = [random.Random(f"{cfg.seed}:{q.id}") for q in questions]
        self.stage("varied questions")
        sets = self.generator.generate([query_stem(q) for q in questions])
        asked = [
            [q.text if x == s.query else x for x in select_questions(s, n, rng)]
            for q, s, rng in zip(questions, sets, rngs, strict=True)
        ]
        keys = [(k, j) for k in range(len(questions)) for j in range(n)]
        convs = {(k, j): chat(ANSWER_PROFILE, asked[k][j]) for k, j in keys}
        self.stage("answers")
        replies = self._call([convs[key] for key in keys])
        self.stage("answer extraction")
        extracted = self._call(
            [
                chat(EXTRACT_PROFILE, f"Response:\n{c.text}\n\n{self.task.prompt(questions[k])}")
                for (k, _), (_, c) in zip(keys, replies, strict=True)
            ]
        )
        turns: list[list[list[Turn]]] = [[[] for _ in range(n)] for _ in questions]
        for (k, j), (req, c), (_, e) in zip(keys, replies, extracted, strict=True):
            turns[k][j].append(make_turn(j, 0, req, c, self.task.read(e.text, questions[k])))
            convs[k, j] = req.messages + [{"role": "assistant", "content": c.text}]
        partners: list[list[list[int]]] = [[] for _ in questions]
        active = [k for k in range(len(questions)) if not _settled(turns[k])]
        for rnd in range(1, cfg.max_rounds + 1):
            if not active:
                break
            self.stage(f"cross-play round {rnd}")
            pairs = [
                (k, j, self._partner(turns[k], j, partners[k], rngs[k])) for k in active for j in range(n)
            ]
            prompts = []
            for k, j, p in pairs:
                q = questions[k]
                partner_answer = answer_text(self.task, q, turns[k][p][-1].answer)
                prompts.append(
                    convs[k, j]
                    + [{"role": "user", "content": self._cross_play(q, asked[k][p], partner_answer)}]
                )
            for k in active:
                partners[k].append([p for kk, _, p in pairs if kk == k])
            for (k, j, _), (req, c) in zip(pairs, self._call(prompts), strict=True):
                turns[k][j].append(make_turn(j, rnd, req, c, self.task.read(c.text, questions[k])))
                convs[k, j] = req.messages + [{"role": "assistant", "content": c.text}]
            active = [k for k in active if not _settled(turns[k])]
        raw = [[[t.answer for t in row] for row in item] for item in turns]
        maps = _clusters(
            self.judge, [(q, [a for row in r for a in row]) for q, r in zip(questions, raw, strict=True)]
        )
        out = []
        for k, q in enumerate(questions):
            matrix = [[maps[k][a] for a in row] for row in raw[k]]
            rounds = len(partners[k])
            score = diverse_agent_entropy(matrix, rounds=rounds, key=q.id)
            out.append(
                self.trajectory(
                    q,
                    matrix,
                    score.prediction,
                    turns[k],
                    method=self.name,
                    questions=asked[k],
                    concept=sets[k].concept,
                    aspects=sets[k].aspects,
                    aspect_questions=sets[k].aspect_questions,
                    paraphrases=sets[k].paraphrases,
                    generation=sets[k].raw,
                    extractions=[e.text for (kk, _), (_, e) in zip(keys, extracted, strict=True) if kk == k],
                    raw_answers=raw[k],
                    partners=partners[k],
                    rounds_run=rounds,
                    entropy=score.entropy,
                    normalized_entropy=score.normalized,
                    weights=list(score.weights),
                    changes=list(score.changes),
                    distribution=[[y, p] for y, p in score.distribution],
                    abstain={name: score.abstains(t) for name, t in THRESHOLDS.items()},
                )
            )
        return out

    def _partner(self, item: list[list[Turn]], j: int, history: list[list[int]], rng: random.Random) -> int:
        """A random agent whose current answer differs from j's, one j has not met yet if possible."""
        mine = normalize_answer(item[j][-1].answer)
        differ = [k for k in range(len(item)) if k != j and normalize_answer(item[k][-1].answer) != mine]
        if not differ:  # only when all agree, which ends the interaction before a round is asked
            raise RuntimeError("no disagreeing partner; the interaction should have stopped")
        met = {r[j] for r in history}
        fresh = [k for k in differ if k not in met]
        return rng.choice(fresh or differ)

    def _cross_play(self, question: Question, partner_question: str, partner_answer: str) -> str:
        stem = query_stem(question)
        return (
            f'In another conversation you were asked: "{partner_question}"\n'
            f'There, your answer to the question "{stem}" was: {partner_answer}.\n'
            "Taking both conversations into account, what is your actual answer to that question? Keep "
            "your answer unless you are now convinced it is wrong.\n\n"
            f"{self.task.prompt(question)}"
        )


def _settled(item: list[list[Turn]]) -> bool:
    """Stop rule: all agents agree now, or no agent changed its answer in the last two rounds."""
    latest = [normalize_answer(row[-1].answer) for row in item]
    if all(a == latest[0] for a in latest):
        return True
    if len(item[0]) < 3:
        return False
    return all(
        normalize_answer(row[-1].answer)
        == normalize_answer(row[-2].answer)
        == normalize_answer(row[-3].answer)
        for row in item
    )


class SelfConsistency(Procedure):
    """k samples of the task's prompt: entropy, majority, SC(3/5) (see the module docstring)."""

    name = "self_consistency"

    def __init__(
        self, task: Task, backend: Backend, config: SCConfig | None = None, meta: dict | None = None
    ):
        self.config = config or SCConfig()
        super().__init__(task, backend, self.config.batch_size, meta)
        self.judge = AnswerJudge(backend, self.config.agent) if self.config.cluster_judge else None

    def run_batch(self, questions: list[Question]) -> list[Trajectory]:
        cfg, k = self.config, self.config.samples
        profile = cfg.agent.profile if cfg.agent.profile is not None else self.task.default_profile
        keys = [(n, s) for n in range(len(questions)) for s in range(k)]
        reqs = [
            request(cfg.agent, chat(profile, self.task.prompt(questions[n])), cfg.sampling) for n, _ in keys
        ]
        done = generate(self.backend, reqs)
        turns = [
            make_turn(s, 0, r, c, self.task.read(c.text, questions[n]))
            for (n, s), r, c in zip(keys, reqs, done, strict=True)
        ]
        raw = [[t.answer for t in turns[n * k : (n + 1) * k]] for n in range(len(questions))]
        maps = _clusters(self.judge, list(zip(questions, raw, strict=True)))
        out = []
        for n, q in enumerate(questions):
            samples: list[Hashable | None] = [maps[n][a] for a in raw[n]]
            sc = self_consistency(samples, cfg.min_votes, key=q.id)
            abstain = {f"sc_{cfg.min_votes}_of_{k}": sc.abstain_majority}
            abstain.update({name: sc.abstains(t) for name, t in THRESHOLDS.items()})
            out.append(
                self.trajectory(
                    q,
                    [[a] for a in samples],
                    sc.prediction,
                    [[t] for t in turns[n * k : (n + 1) * k]],
                    method=self.name,
                    raw_answers=raw[n],
                    rounds_run=0,
                    entropy=sc.entropy,
                    normalized_entropy=sc.normalized,
                    votes=sc.votes,
                    distribution=[[y, p] for y, p in sc.distribution],
                    abstain=abstain,
                )
            )
        return out
