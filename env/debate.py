"""Standard multi-agent debate (Du et al.): N agents, round 0 alone, then T synchronous rounds.

In round t >= 1 agent i reads the round t-1 responses of the peers its topology shows it (all peers
by default) on top of its own conversation so far, and answers again. Every (question, agent)
request of a round goes to the backend in one ``generate`` call. The team's prediction is the
majority vote of the last round (SPEC section 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from udpo.rewards import majority_vote

from .backends.base import Backend, ChatRequest, SamplingParams
from .tasks.base import Question, Task
from .trajectory import Trajectory, TrajectoryWriter, Turn

#: topology(question_index, agent, round, n_agents) -> indices of the peers agent reads this round
Topology = Callable[[int, int, int, int], Sequence[int]]
#: message_transform(question, round, responses) -> the responses as peers will read them. A transform
#: may also define ``transform_batch([(question, round, responses), ...])`` to get a whole round at once.
MessageTransform = Callable[[Question, int, list[str]], list[str]]


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


def peer_message(task: Task, question: Question, peers: list[tuple[int, str]]) -> str:
    """The user message of a debate round: the peers' latest responses, then the request to answer."""
    if peers:
        shown = "\n\n".join(f"[Agent {j + 1}]\n{text.strip()}" for j, text in peers)
        head = f"Other agents answered the same question. Their latest responses:\n\n{shown}\n\n"
    else:
        head = ""
    return (
        f"{head}Weigh their reasoning against your own: keep your answer if you still believe it, "
        f"change it if they showed you a mistake. {task.format_instruction(question)}"
    )


def all_peers(q: int, i: int, t: int, n: int) -> list[int]:
    """The full topology: every agent reads every other agent."""
    return [j for j in range(n) if j != i]


class DebateEnv:
    """Runs Standard MAD over a list of questions with one backend."""

    def __init__(
        self,
        task: Task,
        backend: Backend,
        config: DebateConfig | None = None,
        topology: Topology = all_peers,
        message_transform: MessageTransform | None = None,
        meta: dict | None = None,
    ):
        self.task = task
        self.backend = backend
        self.config = config or DebateConfig()
        self.topology = topology
        self.message_transform = message_transform
        self.meta = dict(meta or {})

    def run(
        self,
        questions: Sequence[Question],
        writer: TrajectoryWriter | None = None,
        progress: bool = True,
    ) -> list[Trajectory]:
        """Debate every question; trajectories of each finished batch are appended to ``writer``."""
        out: list[Trajectory] = []
        bs = self.config.batch_size
        bar = tqdm(total=len(questions), desc="debate", unit="q", disable=not progress)
        try:
            for start in range(0, len(questions), bs):
                batch = self.debate_batch(list(questions[start : start + bs]))
                if writer is not None:
                    writer.write(batch)
                out.extend(batch)
                bar.update(len(batch))
                bar.set_postfix(acc=f"{sum(t.correct for t in out) / len(out):.2f}")
        finally:
            bar.close()
        return out

    def debate_batch(self, questions: list[Question]) -> list[Trajectory]:
        """Debate a batch of questions together, one backend call per round."""
        cfg, n, T = self.config, self.config.n_agents, self.config.rounds
        agents = cfg.agents or []
        convs = [[self._opening(q, a) for a in agents] for q in questions]
        turns: list[list[list[Turn]]] = [[[] for _ in range(n)] for _ in questions]
        answers: list[list[list]] = [[[] for _ in range(n)] for _ in questions]
        active = list(range(len(questions)))
        for t in range(T + 1):
            if t > 0:
                shown = self._transformed(
                    questions, active, [[turns[qi][j][-1].text for j in range(n)] for qi in active], t - 1
                )
                for qi, latest in zip(active, shown, strict=True):
                    for i in range(n):
                        peers = [(j, latest[j]) for j in self.topology(qi, i, t, n)]
                        convs[qi][i].append(
                            {"role": "user", "content": peer_message(self.task, questions[qi], peers)}
                        )
            keys = [(qi, i) for qi in active for i in range(n)]
            requests = [
                ChatRequest(
                    messages=[dict(m) for m in convs[qi][i]],
                    sampling=agents[i].sampling or cfg.sampling,
                    adapter=agents[i].adapter,
                    model=agents[i].model,
                )
                for qi, i in keys
            ]
            completions = self.backend.generate(requests)
            if len(completions) != len(requests):
                raise RuntimeError(
                    f"backend returned {len(completions)} completions for {len(requests)} requests"
                )
            for (qi, i), req, c in zip(keys, requests, completions, strict=True):
                ans = self.task.parse(c.text, questions[qi])
                turns[qi][i].append(
                    Turn(
                        agent=i,
                        round=t,
                        messages=req.messages,
                        text=c.text,
                        answer=ans,
                        prompt_ids=c.prompt_ids,
                        completion_ids=c.completion_ids,
                        logprobs=c.logprobs,
                        adapter=req.adapter,
                        finish_reason=c.finish_reason,
                    )
                )
                answers[qi][i].append(ans)
                convs[qi][i].append({"role": "assistant", "content": c.text})
            if cfg.early_stop and t < T:
                active = [qi for qi in active if not _unanimous([answers[qi][i][-1] for i in range(n)])]
            for qi in range(len(questions)):  # stopped debates carry their answers forward
                for i in range(n):
                    if len(answers[qi][i]) < t + 1:
                        answers[qi][i].append(answers[qi][i][-1])
        return [self._trajectory(q, answers[k], turns[k]) for k, q in enumerate(questions)]

    def _transformed(
        self, questions: list[Question], active: list[int], latest: list[list[str]], rnd: int
    ) -> list[list[str]]:
        """The round-``rnd`` responses of the active debates as peers read them (one batched call when the
        transform has ``transform_batch``, e.g. AutoInject)."""
        transform = self.message_transform
        if transform is None:
            return latest
        batch = getattr(transform, "transform_batch", None)
        if batch is not None:
            return batch([(questions[qi], rnd, texts) for qi, texts in zip(active, latest, strict=True)])
        return [transform(questions[qi], rnd, texts) for qi, texts in zip(active, latest, strict=True)]

    def _opening(self, question: Question, agent: AgentSpec) -> list[dict[str, str]]:
        profile = agent.profile if agent.profile is not None else self.task.default_profile
        msgs = [{"role": "system", "content": profile}] if profile else []
        msgs.append({"role": "user", "content": self.task.prompt(question)})
        return msgs

    def _trajectory(self, q: Question, answers: list[list], turns: list[list[Turn]]) -> Trajectory:
        prediction = majority_vote([a[-1] for a in answers])
        meta = {
            "task": self.task.name,
            "n_agents": self.config.n_agents,
            "rounds": self.config.rounds,
            "rounds_run": len(turns[0]) - 1,
            **self.meta,
        }
        return Trajectory(
            question_id=q.id,
            question=q.text,
            gold=q.gold,
            answers=answers,
            prediction=prediction,
            correct=self.task.is_correct(prediction, q),
            turns=turns,
            meta=meta,
        )


def _unanimous(final: list) -> bool:
    return final[0] is not None and all(a == final[0] for a in final)


def worst_case_prompt_tokens(
    task: Task,
    question: Question,
    config: DebateConfig,
    encode: Callable[[list[dict[str, str]]], list[int]],
) -> int:
    """An upper bound on the tokens of any request of a debate of ``question``, completion included.

    The last round's conversation is the longest: the opening, then per earlier round the agent's own
    answer and a message carrying every peer's answer. It is rendered with empty answers (``encode``: the
    backend's chat rendering) and each answer then counted at ``max_tokens``, plus the completion and a
    few tokens per answer for merges at the seams.
    """
    n, T = config.n_agents, config.rounds
    env = DebateEnv(task, backend=None, config=config)  # type: ignore[arg-type]
    longest, seen = 0, set()
    for agent in config.agents or []:
        if (agent.profile, agent.sampling) in seen:
            continue
        seen.add((agent.profile, agent.sampling))
        conv = env._opening(question, agent)
        for _ in range(T):
            conv.append({"role": "assistant", "content": ""})
            peers = [(j, "") for j in range(n - 1)]
            conv.append({"role": "user", "content": peer_message(task, question, peers)})
        budget = (agent.sampling or config.sampling).max_tokens
        longest = max(longest, len(encode(conv)) + (T * n + 1) * budget + 4 * T * n)
    return longest
