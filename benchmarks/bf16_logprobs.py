"""Benchmark: how far the trainer's log-probs are from the sampler's, in fp32 and in bf16.

    python benchmarks/bf16_logprobs.py [--questions 8] [--agents 3] [--rounds 1] [--max-tokens 32]

For each weight dtype (fp32, bf16) the team is built once (adapters at their start, so the policy is the
base model), debates are sampled with the ``hf`` backend, which records each token's log-prob as it
samples, and the trainer recomputes the same tokens' log-probs from the stored ids
(``MultiAgentPolicy.token_logprobs``, the update's packed forward passes). Printed per setting, over
every completion token: the mean and largest |trainer - sampler|, and the per-token KL estimate
``exp(r) - r - 1`` with ``r = trainer - sampler`` (what the first update sees as the policy's drift
before any step), plus the largest |sum of r| over one agent's turn (the trajectory-level ratio's log).
A third line scores the bf16 debates with the fp32 trainer: the mismatch when the engine samples in
bf16 and the trainer trains in fp32.
"""

from __future__ import annotations

import argparse

import torch

from udpo.env.backends import SamplingParams
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.tasks.arithmetic import Arithmetic
from udpo.training.policy import MultiAgentPolicy


def debates(policy: MultiAgentPolicy, args: argparse.Namespace) -> list:
    task = Arithmetic(difficulty=1, n_questions=max(args.questions, 8))
    config = DebateConfig(
        n_agents=args.agents,
        rounds=args.rounds,
        sampling=SamplingParams(temperature=0.7, max_tokens=args.max_tokens, seed=0),
        debate_batch_size=args.questions,
    )
    env = DebateEnv(task, policy.rollout_backend(), config)
    return env.run(task.load("test")[: args.questions], progress=False)


@torch.no_grad()
def mismatch(policy: MultiAgentPolicy, trajectories: list) -> dict[str, float]:
    diffs, turn_sums = [], []
    for agent in range(policy.n_agents):
        turns = [turn for t in trajectories for turn in t.turns[agent] if turn.completion_ids]
        recomputed = policy.token_logprobs(
            agent, [t.prompt_ids for t in turns], [t.completion_ids for t in turns], temperature=0.7
        )
        for turn, lp in zip(turns, recomputed, strict=True):
            r = lp.double().cpu() - torch.tensor(turn.logprobs, dtype=torch.float64)
            diffs.append(r)
            turn_sums.append(float(r.sum().abs()))
    r = torch.cat(diffs)
    return {
        "tokens": r.numel(),
        "mean |d|": float(r.abs().mean()),
        "max |d|": float(r.abs().max()),
        "KL per token": float((r.exp() - r - 1).mean()),
        "max |turn sum|": max(turn_sums),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    rows, sampled = {}, {}
    for dtype in ("fp32", "bf16"):
        policy = MultiAgentPolicy(args.model, n_agents=args.agents, dtype=dtype)
        sampled[dtype] = debates(policy, args)
        rows[f"{dtype} sampler, {dtype} trainer"] = mismatch(policy, sampled[dtype])
        if dtype == "fp32":
            fp32_policy = policy
    rows["bf16 sampler, fp32 trainer"] = mismatch(fp32_policy, sampled["bf16"])
    print(f"threads {torch.get_num_threads()}; {args.questions} questions x {args.agents} agents x "
          f"{args.rounds + 1} rounds, {args.max_tokens} tokens, temperature 0.7")  # fmt: skip
    for name, row in rows.items():
        print(f"{name:28s} " + "  ".join(f"{k} {v:.3g}" for k, v in row.items()))


if __name__ == "__main__":
    main()
