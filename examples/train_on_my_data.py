"""Train a debate team on your own questions with your own reward, from Python.

    python examples/train_on_my_data.py                      # about 2 minutes on a 2-core CPU
    python examples/train_on_my_data.py --output-dir runs/mine --iterations 20

The questions here are a stand-in for yours: any list of {"question", "answer"} dicts, a
``datasets.Dataset`` or a JSONL file works the same. The reward function is yours too: it sees one debate
(a ``Trajectory``) and one agent, and returns a number that is added, with its weight, to UDPO's
uncertainty rewards. Afterwards the run folder holds metrics.jsonl (with ``reward/<your function>``), the
held-out evaluations before and after, and the trained adapters under checkpoints/.
"""

from __future__ import annotations

import argparse
import random

from peft import LoraConfig

from udpo import Trajectory, UDPOCallback, UDPOConfig, UDPOTrainer


def shopping_questions(n: int, seed: int) -> list[dict]:
    """Small word problems with numeric answers: the kind of in-house set a team would bring."""
    rng = random.Random(seed)
    items = ["pencils", "apples", "stickers", "marbles", "cards"]
    rows = []
    for k in range(n):
        have, buys, item = rng.randint(2, 9), rng.randint(2, 9), rng.choice(items)
        rows.append(
            {
                "id": f"shop-{seed}-{k}",
                "question": f"Mia has {have} {item} and buys {buys} more. How many {item} does she have now?",
                "answer": have + buys,
            }
        )
    return rows


def says_it_once(trajectory: Trajectory, agent: int) -> float:
    """1 when the agent's last reply puts exactly one answer in \\boxed{}, else 0: a format reward."""
    last = trajectory.turns[agent][-1].text
    return float(last.count("\\boxed{") == 1)


class PrintProgress(UDPOCallback):
    """Prints each iteration's mean reward and accuracy (main process only)."""

    def on_iteration_end(self, trainer, iteration, metrics):
        if trainer.main:
            print(
                f"iteration {iteration}: reward {metrics['reward/mean']:.3f}, accuracy {metrics['train/accuracy']:.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/example_my_data")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--eval-questions", type=int, default=6, help="held-out questions, before and after")
    cli = parser.parse_args()

    args = UDPOConfig(
        output_dir=cli.output_dir,
        n_agents=2,
        rounds=1,
        max_tokens=40,
        temperature=0.7,
        questions_per_iteration=2,
        debates_per_question=1,  # one debate a question keeps the example short (the default: 4)
        max_iterations=cli.iterations,
        warmup_fraction=0.1,  # 3 of the 30 questions calibrate each agent's reward coefficients
        eval_questions=cli.eval_questions,
        eval_steps=0,  # evaluate before and after training
        learning_rate=1e-3,
        warmup_steps=1,
        reward_weights=[0.5],  # one weight per reward function
        save_steps=cli.iterations,
        progress=False,
    )
    trainer = UDPOTrainer(
        model="smollm2-135m-instruct",
        args=args,
        train_dataset=shopping_questions(30, seed=1),
        eval_dataset=shopping_questions(6, seed=2),
        reward_funcs=[says_it_once],
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        callbacks=[PrintProgress()],
    )
    with trainer:
        result = trainer.train()
    before, after = result.get("before", {}), result.get("after", {})
    print(
        f"held-out accuracy: {before.get('accuracy', float('nan')):.2f} -> {after.get('accuracy', float('nan')):.2f}"
    )
    print(f"run folder: {result['run_dir']}")


if __name__ == "__main__":
    main()
