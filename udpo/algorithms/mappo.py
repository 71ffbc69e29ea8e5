"""MAPPO (Yu et al. 2022), adapted to debate as the UDPO paper does (docs/algorithms.md, "The baselines:
MAPPO and RMAAC"): every agent is a policy trained with PPO on the shared team reward, and one centralized
critic ``V(s_r)`` sees the question and all agents' answers of the previous round. The shared math is in
:mod:`.actor_critic`."""

from __future__ import annotations

from udpo.env.protocols.adversary import critic_state
from udpo.env.trajectory import Trajectory

from .actor_critic import ActorCritic, previous_answers


class MAPPO(ActorCritic):
    """Centralized state: the same ``s_r`` for every agent."""

    name = "mappo"

    def states(self, trajectory: Trajectory, agent: int) -> list[str]:
        return [
            critic_state(trajectory.question, previous_answers(trajectory, turn.round))
            for turn in trajectory.turns[agent]
        ]
