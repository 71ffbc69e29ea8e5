"""Multi-agent debate (Du et al.): N agents, round 0 alone, then T synchronous rounds.

In round t >= 1 each agent that still speaks reads what the debate protocol shows it (Standard MAD:
every peer's round t-1 response) on top of its own conversation so far, and answers again. Every
(question, agent) request of a round goes to the backend in one ``generate`` call. The protocol
(``udpo.env.protocols``: topologies, interventions, attacks, injection, stopping rules) decides who
reads what and who stops; this loop only runs its hooks. The team's prediction is the majority vote
of the last round (SPEC section 1); an agent or debate that stopped carries its answer forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from udpo.rewards import majority_vote

from .backends.base import Backend, ChatRequest, SamplingParams
from .progress import DebateProgress, as_progress
from .protocols.base import DebateState, Message, Stage, peer_message
from .protocols.protocol import Protocol
from .protocols.rewrite import MessageRewrite, MessageTransform
from .protocols.stopping import UnanimityStop
from .tasks.base import Question, Task
from .trajectory import Trajectory, TrajectoryWriter, Turn

__all__ = ["AgentSpec", "DebateConfig", "DebateEnv", "DebateProgress", "MessageTransform", "peer_message"]


@dataclass
class AgentSpec:
    """One debater. profile: its system prompt (None: the task's default profile).
    adapter: the LoRA adapter the backend serves it with (None: base model).
    model: base model name for heterogeneous teams (None: the backend's default).
    sampling: its own sampling parameters (None: the debate's)."""

    profile: str | None = None
    adapter: str | None = None
    model: str | None = None
    sampling: SamplingParams | None = None


@dataclass
class DebateConfig:
    """n_agents: N. rounds: T, debate rounds after round 0. sampling: default per-agent sampling.
    agents: per-agent specs (default N plain agents). early_stop: end a debate once every agent
    gives the same parsed answer (later rounds carry the answers forward).
    batch_size: questions debated together; all their requests of a round form one backend call."""

    n_agents: int = 3
    rounds: int = 2
    sampling: SamplingParams = field(default_factory=SamplingParams)
    agents: list[AgentSpec] | None = None
    early_stop: bool = False
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {self.n_agents}")
        if self.rounds < 0:
            raise ValueError(f"rounds must be >= 0, got {self.rounds}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.agents is None:
            self.agents = [AgentSpec() for _ in range(self.n_agents)]
        if len(self.agents) != self.n_agents:
            raise ValueError(f"{len(self.agents)} agent specs given for n_agents={self.n_agents}")


class DebateEnv:
    """Runs debates over a list of questions with one backend and one protocol.

    protocol: a Protocol, or stages to compose (default: Standard MAD, the full topology).
    message_transform: shorthand for a MessageRewrite stage (e.g. AutoInject) added to the protocol.
    ``config.early_stop`` adds the unanimity stop. meta: merged into every trajectory's ``meta``, which
    also records the protocol (``meta["protocol"]``).
    """

    def __init__(
        self,
        task: Task,
        backend: Backend,
        config: DebateConfig | None = None,
        protocol: Protocol | Sequence[Stage] | None = None,
        message_transform: MessageTransform | None = None,
        meta: dict | None = None,
    ):
        self.task = task
        self.backend = backend
        self.config = config or DebateConfig()
        base = protocol if isinstance(protocol, Protocol) else Protocol(protocol or ())
        extra: list[Stage] = [MessageRewrite(message_transform)] if message_transform is not None else []
        extra += [UnanimityStop()] if self.config.early_stop else []
        self.protocol = base.with_stages(*extra)
        self.agents = self.protocol.prepare(list(self.config.agents or []), task)
        self.meta = {**dict(meta or {}), "protocol": self.protocol.describe()}

    def run(
        self,
        questions: Sequence[Question],
        writer: TrajectoryWriter | None = None,
        progress: bool | DebateProgress = True,
    ) -> list[Trajectory]:
        """Debate every question; trajectories of each finished batch are appended to ``writer``.

        progress: True draws a line that moves as rounds, turns and tokens go by (``udpo.env.progress``),
        False draws nothing; a :class:`DebateProgress` is reported to and left open (the caller's line:
        several runs on one line, or a line under the training bar).
        """
        out: list[Trajectory] = []
        bs = self.config.batch_size
        reporter, owned = as_progress(progress)
        budget = (
            max((a.sampling or self.config.sampling).max_tokens for a in self.agents) if self.agents else 0
        )
        reporter.add_work(len(questions), len(questions) * self.turns_per_question, budget)
        n_batches = -(-len(questions) // bs)
        try:
            with reporter.counting():
                for b, start in enumerate(range(0, len(questions), bs)):
                    reporter.start_batch(b, n_batches)
                    batch = self.debate_batch(list(questions[start : start + bs]), reporter)
                    if writer is not None:
                        writer.write(batch)
                    out.extend(batch)
                    reporter.finish_questions(len(batch), sum(bool(t.correct) for t in batch))
        finally:
            if owned:
                reporter.close()
        return out

    @property
    def turns_per_question(self) -> int:
        """Agent turns of one debate that runs every round: N x (T + 1)."""
        return self.config.n_agents * (self.config.rounds + 1)

    def debate_batch(
        self, questions: list[Question], progress: DebateProgress | None = None
    ) -> list[Trajectory]:
        """Debate a batch of questions together, one backend call per round (reported to ``progress``)."""
        cfg, protocol = self.config, self.protocol
        turns_run = 0
        states = [DebateState(q, k, self.agents) for k, q in enumerate(questions)]
        convs = [[self._opening(q, a) for a in self.agents] for q in questions]
        for t in range(cfg.rounds + 1):
            live = [s for s in states if not s.done]
            if not live:
                break
            if t > 0:
                protocol.outgoing(live, t - 1)
                protocol.select(live, t)
            protocol.supply(live, t)
            if progress is not None:
                progress.start_round(t, cfg.rounds)
            speaking = [(s, i) for s in live for i in s.speakers()]
            for s, i in speaking:
                if t > 0:
                    text = peer_message(self.task, s.question, s.reads[i], t)
                    convs[s.index][i].append({"role": "user", "content": text})
            generated = [(s, i) for s, i in speaking if i not in s.supplied]
            requests = [
                ChatRequest(
                    messages=[dict(m) for m in convs[s.index][i]],
                    sampling=self.agents[i].sampling or cfg.sampling,
                    adapter=self.agents[i].adapter,
                    model=self.agents[i].model,
                )
                for s, i in generated
            ]
            completions = self.backend.generate(requests) if requests else []
            if len(completions) != len(requests):
                raise RuntimeError(
                    f"backend returned {len(completions)} completions for {len(requests)} requests"
                )
            done = {
                (s.index, i): (req, c)
                for (s, i), req, c in zip(generated, requests, completions, strict=True)
            }
            for s, i in speaking:
                if (s.index, i) in done:
                    req, c = done[(s.index, i)]
                    turn = Turn(
                        agent=i,
                        round=t,
                        messages=req.messages,
                        text=c.text,
                        answer=self.task.parse(c.text, s.question),
                        prompt_ids=c.prompt_ids,
                        completion_ids=c.completion_ids,
                        logprobs=c.logprobs,
                        adapter=req.adapter,
                        finish_reason=c.finish_reason,
                    )
                else:
                    text = s.supplied[i]
                    turn = Turn(
                        agent=i,
                        round=t,
                        messages=[dict(m) for m in convs[s.index][i]],
                        text=text,
                        answer=self.task.parse(text, s.question),
                        adapter=self.agents[i].adapter,
                        finish_reason="injected",
                    )
                turn.reads = [[m.agent, m.round] for m in s.reads[i]]
                turn.details = s.details[i]
                s.turns[i].append(turn)
                s.sent[(i, t)] = turn.text
                convs[s.index][i].append({"role": "assistant", "content": turn.text})
            turns_run += len(speaking)
            if progress is not None:
                tokens = sum(len(c.completion_ids) or len(c.logprobs) for c in completions)
                progress.finish_turns(len(speaking), len(completions), tokens)
            for s in states:  # agents that did not speak, and stopped debates, carry their answers forward
                for i in range(s.n_agents):
                    s.answers[i].append(
                        s.turns[i][-1].answer if s.turns[i][-1].round == t else s.answers[i][-1]
                    )
            for s in live:
                s.clear_round()
            protocol.after_round(live, t)
        for s in states:
            for row in s.answers:
                row.extend([row[-1]] * (cfg.rounds + 1 - len(row)))
        if progress is not None:
            progress.skip_turns(len(questions) * self.turns_per_question - turns_run)  # stopped early
        return [self._trajectory(s) for s in states]

    def _opening(self, question: Question, agent: AgentSpec) -> list[dict[str, str]]:
        profile = agent.profile if agent.profile is not None else self.task.default_profile
        msgs = [{"role": "system", "content": profile}] if profile else []
        msgs.append({"role": "user", "content": self.task.prompt(question)})
        return msgs

    def _trajectory(self, state: DebateState) -> Trajectory:
        q, answers = state.question, state.answers
        prediction = majority_vote([a[-1] for a in answers])
        meta = {
            "task": self.task.name,
            "n_agents": self.config.n_agents,
            "rounds": self.config.rounds,
            "rounds_run": max(turn.round for row in state.turns for turn in row),
            **self.meta,
        }
        return Trajectory(
            question_id=q.id,
            question=q.text,
            gold=q.gold,
            answers=answers,
            prediction=prediction,
            correct=self.task.is_correct(prediction, q),
            turns=state.turns,
            meta=meta,
        )


def worst_case_prompt_tokens(
    task: Task,
    question: Question,
    config: DebateConfig,
    encode: Callable[[list[dict[str, str]]], list[int]],
    reads_pool: bool = False,
) -> int:
    """An upper bound on the tokens of any request of a debate of ``question``, completion included.

    The last round's conversation is the longest: the opening, then per earlier round the agent's own
    answer and a message carrying the answers it reads: the n - 1 peers' latest, or with ``reads_pool``
    (interventions) every response of every earlier round. It is rendered with empty answers (``encode``:
    the backend's chat rendering) and each answer then counted at ``max_tokens``, plus the completion and
    a few tokens per answer for merges at the seams.
    """
    n, T = config.n_agents, config.rounds
    env = DebateEnv(task, backend=None, config=config)  # type: ignore[arg-type]
    longest, seen = 0, set()
    for agent in config.agents or []:
        if (agent.profile, agent.sampling) in seen:
            continue
        seen.add((agent.profile, agent.sampling))
        conv, answers = env._opening(question, agent), 1  # the completion
        for rnd in range(1, T + 1):
            if reads_pool:
                reads = [Message(j % n, j // n, "") for j in range(n * rnd)]
            else:
                reads = [Message(j, rnd - 1, "") for j in range(n - 1)]
            conv.append({"role": "assistant", "content": ""})
            conv.append({"role": "user", "content": peer_message(task, question, reads, rnd)})
            answers += 1 + len(reads)
        budget = (agent.sampling or config.sampling).max_tokens
        longest = max(longest, len(encode(conv)) + answers * (budget + 4))
    return longest
