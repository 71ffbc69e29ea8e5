"""Stages that change what agents send or who they are, as attacks do.

- :class:`MessageRewrite`: a message transform rewrites each round's responses as peers read them
  (AutoInject is one); the author's own history keeps what it wrote.
- :class:`AssignProfiles`: given agents run with given profiles (AutoTransform's malicious ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..tasks.base import Question, Task
from .base import DebateState, Stage

if TYPE_CHECKING:
    from ..debate import AgentSpec

#: transform(question, round, responses) -> the responses as peers will read them. ``responses[i]`` is
#: None for an agent that did not speak in that round (and must stay None). A transform may also define
#: ``transform_batch([(question, round, responses), ...])`` to get a whole round at once.
MessageTransform = Callable[[Question, int, list[str | None]], list[str | None]]


class MessageRewrite(Stage):
    """Rewrites the sent copy of each new response with ``transform`` (one batched call per round)."""

    name = "message_rewrite"

    def __init__(self, transform: MessageTransform, name: str | None = None):
        self.transform = transform
        self.name = name or getattr(transform, "name", self.name)

    def outgoing(self, states: Sequence[DebateState], rnd: int) -> None:
        items = [(s.question, rnd, [s.sent.get((i, rnd)) for i in range(s.n_agents)]) for s in states]
        batch = getattr(self.transform, "transform_batch", None)
        out = batch(items) if batch is not None else [self.transform(*item) for item in items]
        for s, (_, _, before), after in zip(states, items, out, strict=True):
            for i, text in enumerate(after):
                if before[i] is not None:
                    s.sent[(i, rnd)] = text


class AssignProfiles(Stage):
    """Agents ``profiles`` names (index -> system prompt) get that profile; adapters are kept."""

    name = "assign_profiles"

    def __init__(self, profiles: Mapping[int, str], name: str | None = None):
        self.profiles = dict(profiles)
        self.name = name or self.name

    def prepare(self, agents: list[AgentSpec], task: Task) -> list[AgentSpec]:
        bad = [i for i in self.profiles if not 0 <= i < len(agents)]
        if bad:
            raise ValueError(f"profile for agent {bad[0]}, but the team has agents 0..{len(agents) - 1}")
        return [
            dataclasses.replace(a, profile=self.profiles[i]) if i in self.profiles else a
            for i, a in enumerate(agents)
        ]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "agents": sorted(self.profiles)}
