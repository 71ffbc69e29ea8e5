"""Train a debate team with reward functions written for TRL and a callback written for transformers.

    python examples/train_with_trl_reward.py                 # SmolLM2-135M, a few minutes on a 2-core CPU
    python examples/train_with_trl_reward.py --model path/to/model --iterations 2

The reward functions have the form TRL's GRPOTrainer takes, ``f(prompts, completions, **kwargs) ->
list[float]``: UDPO calls each once per batch of debates and per agent, with that agent's last prompts and
replies (chat messages, as TRL passes conversational data) and every field of the records as keywords
(here ``answer``, GSM8K's worked solution ending in ``#### <number>``). The callback is a plain
``transformers.TrainerCallback``: it gets ``on_log`` with a ``TrainerState`` as in transformers' Trainer,
one step per iteration. The records use GSM8K's layout, and UDPO reads their gold answers as the number
after ``####``.
"""

from __future__ import annotations

import argparse
import random

from peft import LoraConfig
from transformers import TrainerCallback

from udpo import UDPOConfig, UDPOTrainer


def word_problems(n: int, seed: int) -> list[dict]:
    """Small word problems in GSM8K's layout: a question, and an answer that works it out, then '#### N'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        have, buys = rng.randint(2, 9), rng.randint(2, 9)
        rows.append(
            {
                "question": f"Tom has {have} marbles and wins {buys} more. How many marbles does he have now?",
                "answer": f"Tom has {have} + {buys} = {have + buys} marbles.\n#### {have + buys}",
            }
        )
    return rows


def boxed_once(completions, **kwargs):
    """A format reward: 1 when the reply puts exactly one answer in \\boxed{}, else 0."""
    return [float(completion[0]["content"].count("\\boxed{") == 1) for completion in completions]


def matches_reference(completions, answer, **kwargs):
    """A reward from a dataset column: 1 when the reply boxes the number after the reference's '####'."""
    finals = [reference.rpartition("####")[2].strip() for reference in answer]
    return [
        float(f"\\boxed{{{final}}}" in completion[0]["content"])
        for completion, final in zip(completions, finals, strict=True)
    ]


class PrintLogs(TrainerCallback):
    """Prints each step's mean reward and each evaluation's accuracy (the main process only)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if "reward/mean" in logs:
            print(f"step {state.global_step}/{state.max_steps}: reward {logs['reward/mean']:.3f}")
        if "eval_accuracy" in logs:
            print(f"step {state.global_step}: held-out accuracy {logs['eval_accuracy']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--output-dir", default="runs/example_trl_reward")
    parser.add_argument("--iterations", type=int, default=3)
    cli = parser.parse_args()

    args = UDPOConfig(
        output_dir=cli.output_dir,
        n_agents=2,
        rounds=1,
        max_tokens=40,
        questions_per_iteration=2,
        debates_per_question=1,  # one debate a question keeps the example short (the default: 4)
        max_iterations=cli.iterations,
        warmup_fraction=0.2,  # 4 of the 20 questions calibrate each agent's reward coefficients
        eval_questions=4,
        eval_steps=0,  # evaluate before and after training
        learning_rate=1e-3,
        warmup_steps=1,
        reward_weights=[0.5, 1.0],  # one weight per reward function
        save_steps=cli.iterations,
        progress=False,
    )
    with UDPOTrainer(
        model=cli.model,
        args=args,
        train_dataset=word_problems(20, seed=1),
        eval_dataset=word_problems(4, seed=2),
        reward_funcs=[boxed_once, matches_reference],
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        callbacks=[PrintLogs()],
    ) as trainer:
        result = trainer.train()
    print(f"run folder: {result['run_dir']}")


if __name__ == "__main__":
    main()
