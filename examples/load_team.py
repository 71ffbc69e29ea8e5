"""Load a trained team and let it debate questions of your own, from Python.

    python examples/train_on_my_data.py --output-dir runs/example_my_data    # first, a team to load
    python examples/load_team.py runs/example_my_data                        # its latest checkpoint
    python examples/load_team.py team/ --save team_copy/                     # an export, saved again

The folder may be a run folder (its latest checkpoint), a checkpoint folder or an export (``udpo export``,
``Team.save_pretrained``). The team debates with the settings it was trained with (rounds, sampling); each
question's line shows the team's answer (the last round's majority vote), each agent's last answer and
whether the team was right, then the accuracy and uncertainty metrics of the whole set.
"""

from __future__ import annotations

import argparse

from udpo import Team

#: questions with gold answers (the answer format, here numbers, is inferred from them)
QUESTIONS = [
    {"question": "Mia has 4 pencils and buys 5 more. How many pencils does she have now?", "answer": 9},
    {"question": "A box holds 6 apples. How many apples are in 3 boxes?", "answer": 18},
    {"question": "Tom had 12 marbles and gave away 5. How many marbles does he have left?", "answer": 7},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a run folder, a checkpoint folder or an export folder")
    parser.add_argument("--max-tokens", type=int, default=None, help="reply length (default: as trained)")
    parser.add_argument("--save", default=None, help="also save the team there (the layout of udpo export)")
    cli = parser.parse_args()

    team = Team.from_pretrained(cli.folder)
    print(f"{team.n_agents} agents on {team.base_model}, trained {team.manifest.iteration} iterations")
    result = team.debate(QUESTIONS, max_tokens=cli.max_tokens, seed=0, progress=False)
    for row, answer, votes, correct in zip(
        QUESTIONS, result.answers, result.votes, result.correct, strict=True
    ):
        print(f"{row['question']}\n  team: {answer}  agents: {votes}  right: {correct}")
    summary = result.summary()
    print(", ".join(f"{key} {summary[key]:.3f}" for key in ("accuracy", "u_intra", "u_inter", "u_sys")))
    if cli.save:
        print(f"saved to {team.save_pretrained(cli.save)}")


if __name__ == "__main__":
    main()
