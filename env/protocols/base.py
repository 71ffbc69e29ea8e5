"""The debate protocol interface: who reads whom each round, in what form, and who keeps talking.

A protocol (:class:`~udpo.env.protocols.protocol.Protocol`) is an ordered list of :class:`Stage`
objects. The debate loop (``DebateEnv``) keeps one :class:`DebateState` per debate and calls the
stages' hooks, each over all live debates of a batch at once (so a stage's model calls are batched):

- ``prepare(agents, task)``, once: change the agents (AutoTransform gives compromised agents their
  malicious profile);
- ``supply(states, t)``, before round t: responses given instead of generated (controlled
  injection replaces round-0 responses);
- ``outgoing(states, t - 1)``, before round t >= 1: rewrite the round t-1 responses as peers will read
  them (AutoInject); the author's own history keeps what it wrote;
- ``select(states, t)``, before round t >= 1: for each agent that speaks in round t, the responses it
  reads and their text (topologies, DIGRA, pruning and refutation interventions); exactly one stage
  of a protocol selects;
- ``after_round(states, t)``, after round t: stopping rules (an agent stops speaking; the debate ends).

Agent and round indices are 0-based. An agent that stops keeps its last response: its answer is
carried forward in the answer matrix and peers keep reading that response.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..tasks.base import Answer, Question, Task
from ..trajectory import Turn

if TYPE_CHECKING:
    from ..debate import AgentSpec


@dataclass(frozen=True)
class Message:
    """One response as a peer reads it: its author, the round it was written in, and the text shown."""

    agent: int
    round: int
    text: str


@dataclass
class DebateState:
    """One debate in progress, as the protocol stages see and change it.

    index: the debate's position in its batch. agents: the team's specs (after ``prepare``).
    turns[i]: agent i's turns so far (its own words), one per round it spoke.
    answers[i][t]: agent i's parsed answer after round t (carried forward when it did not speak).
    sent[(i, t)]: agent i's round-t response as peers read it (set when it speaks; stages may rewrite).
    speaking[i]: whether agent i answers in the coming rounds. done: the debate has ended.
    reads[i], details[i], supplied: set by the stages for the coming round (what agent i reads, notes
    recorded in its turn, responses given instead of generated); cleared after each round.
    memory: stage-private state kept across rounds (keyed by the stage's name).
    """

    question: Question
    index: int
    agents: list[AgentSpec]
    turns: list[list[Turn]] = field(default_factory=list)
    answers: list[list[Answer]] = field(default_factory=list)
    sent: dict[tuple[int, int], str] = field(default_factory=dict)
    speaking: list[bool] = field(default_factory=list)
    done: bool = False
    reads: list[list[Message]] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    supplied: dict[int, str] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.agents)
        self.turns = self.turns or [[] for _ in range(n)]
        self.answers = self.answers or [[] for _ in range(n)]
        self.speaking = self.speaking or [True] * n
        self.clear_round()

    @property
    def n_agents(self) -> int:
        return len(self.agents)

    def speakers(self) -> list[int]:
        """The agents that answer in the coming round."""
        return [i for i in range(self.n_agents) if self.speaking[i]]

    def latest(self, agent: int) -> Message:
        """Agent ``agent``'s most recent response, as peers read it."""
        rnd = self.turns[agent][-1].round
        return Message(agent, rnd, self.sent[(agent, rnd)])

    def own_text(self, agent: int) -> str:
        """Agent ``agent``'s most recent response as it wrote it."""
        return self.turns[agent][-1].text

    def pool(self) -> list[Message]:
        """Every response so far, as peers read it, by round then agent."""
        return [Message(i, t, text) for (i, t), text in sorted(self.sent.items(), key=lambda kv: kv[0][::-1])]

    def clear_round(self) -> None:
        n = self.n_agents
        self.reads = [[] for _ in range(n)]
        self.details = [{} for _ in range(n)]
        self.supplied = {}


class Stage:
    """One part of a protocol; every hook does nothing unless overridden (see the module docstring).

    name: how the stage is reported in trajectory metadata. selects: whether it chooses the reads.
    """

    name: str = "stage"
    selects: bool = False

    def prepare(self, agents: list[AgentSpec], task: Task) -> list[AgentSpec]:
        return agents

    def supply(self, states: Sequence[DebateState], rnd: int) -> None:
        """Fill ``state.supplied[i]`` for agents whose round-``rnd`` response is given, not generated."""

    def outgoing(self, states: Sequence[DebateState], rnd: int) -> None:
        """Rewrite ``state.sent[(i, rnd)]`` of the agents that spoke in round ``rnd``."""

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        """Fill ``state.reads[i]`` (and ``state.details[i]``) for every speaker of round ``rnd``."""

    def after_round(self, states: Sequence[DebateState], rnd: int) -> None:
        """Update ``state.speaking`` and ``state.done`` once round ``rnd`` is answered."""

    def describe(self) -> dict[str, Any]:
        """The stage's settings, for trajectory metadata."""
        return {"name": self.name}

    def close(self) -> None:
        """Release models the stage loaded itself."""


def peer_message(task: Task, question: Question, reads: Sequence[Message], rnd: int) -> str:
    """The user message of round ``rnd``: the responses the agent reads, then the request to answer.

    Responses of the previous round are labelled ``[Agent k]`` (1-based); older ones (interventions
    read the pool of all past responses) ``[Agent k, round t]``.
    """
    if reads:
        latest = all(m.round == rnd - 1 for m in reads)
        shown = "\n\n".join(
            f"[Agent {m.agent + 1}{'' if m.round == rnd - 1 else f', round {m.round}'}]\n{m.text.strip()}"
            for m in reads
        )
        intro = "Their latest responses" if latest else "Responses from the discussion so far"
        head = f"Other agents answered the same question. {intro}:\n\n{shown}\n\n"
    else:
        head = ""
    return f"{head}{task.debate_request(question)}"
