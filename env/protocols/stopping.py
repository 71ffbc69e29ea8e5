"""Stopping rules (Yin et al., as DIGRA uses them; the paper's appendix B.3.2).

- :class:`UnanimityStop`: the debate ends once every agent gives the same answer and it is not None.
- :class:`StableAgentStop`: an agent whose answer is the same, and not None, in two consecutive
  rounds stops answering; its last response stands for the later rounds (peers keep reading it).
  The debate ends when every agent has stopped.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import DebateState, Stage


class UnanimityStop(Stage):
    name = "unanimity_stop"

    def after_round(self, states: Sequence[DebateState], rnd: int) -> None:
        for state in states:
            final = [row[rnd] for row in state.answers]
            if final[0] is not None and all(a == final[0] for a in final):
                state.done = True


class StableAgentStop(Stage):
    name = "stable_agent_stop"

    def after_round(self, states: Sequence[DebateState], rnd: int) -> None:
        if rnd < 1:
            return
        for state in states:
            for i in state.speakers():
                now, before = state.answers[i][rnd], state.answers[i][rnd - 1]
                if now is not None and now == before:
                    state.speaking[i] = False
            if not any(state.speaking):
                state.done = True
