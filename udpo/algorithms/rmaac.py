"""RMAAC (He et al. 2023), adapted to debate as the UDPO paper does (docs/algorithms.md, "The baselines: MAPPO
and RMAAC"): the state an agent observes is the set of peer answers; during training rollouts an adversary
swaps at most ``adversary_budget`` peers' answers per round for the candidate the critic values lowest
(:class:`udpo.env.protocols.adversary.RMAACAdversary`). The actors train on the debates they saw, perturbed
prompts included, and the critic on the perturbed states (the swap is recorded in each turn's
``details["adversary"]``). Advantages, losses and GAE are MAPPO's (:mod:`.actor_critic`)."""

from __future__ import annotations

from udpo.env.protocols.adversary import RMAACAdversary, critic_state, observed_answers
from udpo.env.tasks.base import Task
from udpo.env.trajectory import Trajectory

from .actor_critic import ActorCritic, previous_answers
from .base import Advantages, RolloutBatch


class RMAAC(ActorCritic):
    """Per-agent state: what the agent observed, the adversary's swap applied; the adversary swaps at most
    ``settings.adversary_budget`` peers' answers per agent and round."""

    name = "rmaac"

    def states(self, trajectory: Trajectory, agent: int) -> list[str]:
        out = []
        for turn in trajectory.turns[agent]:
            answers = previous_answers(trajectory, turn.round)
            if answers is not None:
                answers = observed_answers(answers, (turn.details or {}).get("adversary"))
            out.append(critic_state(trajectory.question, answers))
        return out

    def batch_metrics(self, batch: RolloutBatch, advantages: Advantages) -> dict[str, float]:
        """The actor-critic's statistics and ``adversary/swap_rate``: the share of the turns after round 0
        whose reader the adversary gave a swapped peer answer."""
        read = [turn for t in batch.trajectories for row in t.turns for turn in row if turn.round > 0]
        swapped = sum(bool((turn.details or {}).get("adversary")) for turn in read)
        rate = swapped / len(read) if read else 0.0
        return {**super().batch_metrics(batch, advantages), "adversary/swap_rate": rate}

    def adversary_stage(self, task: Task) -> RMAACAdversary:
        """The protocol stage that perturbs training rollouts, scoring states with this critic."""
        return RMAACAdversary(
            task, lambda texts: self.critic.values(texts).tolist(), self.settings.adversary_budget
        )
