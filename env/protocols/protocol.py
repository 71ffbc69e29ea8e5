"""A protocol: stages composed in order (see ``base`` for the hooks and when the debate loop calls them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..tasks.base import Task
from .base import DebateState, Stage
from .topology import FullTopology

if TYPE_CHECKING:
    from ..debate import AgentSpec


class Protocol:
    """Stages run in order within each hook. Exactly one stage selects the reads; a protocol given none
    gets the full topology (Standard MAD). name: the protocol's name in trajectory metadata (default:
    the selecting stage's)."""

    def __init__(self, stages: Sequence[Stage] = (), name: str | None = None):
        stages = list(stages)
        selecting = [s.name for s in stages if s.selects]
        if len(selecting) > 1:
            raise ValueError(
                f"a protocol has one stage that chooses the reads, got {len(selecting)}: {selecting}"
            )
        if not selecting:
            stages.insert(0, FullTopology())
        self.stages = stages
        self.name = name or next(s.name for s in stages if s.selects)

    def with_stages(self, *extra: Stage) -> Protocol:
        """This protocol with ``extra`` stages appended (e.g. an attack); the stages are shared."""
        return Protocol([*self.stages, *extra], self.name)

    def prepare(self, agents: list[AgentSpec], task: Task) -> list[AgentSpec]:
        for stage in self.stages:
            agents = stage.prepare(agents, task)
        return agents

    def supply(self, states: Sequence[DebateState], rnd: int) -> None:
        for stage in self.stages:
            stage.supply(states, rnd)

    def outgoing(self, states: Sequence[DebateState], rnd: int) -> None:
        for stage in self.stages:
            stage.outgoing(states, rnd)

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        for stage in self.stages:
            stage.select(states, rnd)

    def after_round(self, states: Sequence[DebateState], rnd: int) -> None:
        for stage in self.stages:
            stage.after_round(states, rnd)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "stages": [s.describe() for s in self.stages]}

    def close(self) -> None:
        for stage in self.stages:
            stage.close()

    def __enter__(self) -> Protocol:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
