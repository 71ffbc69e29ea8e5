"""Benchmark: every parser of model output on 1 MB of degenerate output vs the same pattern at 1 KB.

    python benchmarks/parsers.py [--size 1000000]

Each pattern ("1,", "\\boxed{", "(A)", "a. ", ...) is repeated to ``--size`` characters and to 1,000
characters; each parser is timed on both, side by side in this run (best of three calls). Prints, per
parser, the slowest large input, its time and its ratio to the small input of the same pattern: the
parsers read a bounded part of a reply, so the time stops growing with the input.
"""

from __future__ import annotations

import argparse
import random
import time

from udpo.env.attacks.autoinject import builtin_corruption, clean_rewrite, parse_keyed, split_sentences
from udpo.env.attacks.autotransform import clean_profile
from udpo.env.tasks.parsing import (
    boxed_contents,
    canonical_number,
    extract_numbers,
    last_number,
    normalize_number,
    parse_choice,
    parse_number_answer,
    parse_text_answer,
)

PARSERS = {
    "parse_number_answer": parse_number_answer,
    "parse_choice": lambda t: parse_choice(t, "ABCDE"),
    "parse_text_answer": parse_text_answer,
    "normalize_number": normalize_number,
    "canonical_number": canonical_number,
    "extract_numbers": extract_numbers,
    "last_number": last_number,
    "boxed_contents": boxed_contents,
    "split_sentences": split_sentences,
    "parse_keyed": lambda t: parse_keyed(t, [1, 2, 3]),
    "clean_profile": clean_profile,
    "clean_rewrite": clean_rewrite,
    "builtin_corruption": lambda t: builtin_corruption(t, random.Random(0)),
}
PATTERNS = ["1,", "1", "1/", "-", "\\boxed{", "\\boxed{1}", "{", "(A)", "C)\n", "answer is ", " ", "\n", "!"]
PATTERNS += ["a. ", "[1] ", "```x\n", "**", "a "]


def best_of_three(call, text: str) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        call(text)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="characters of the large inputs")
    args = parser.parse_args()
    print(f"{'parser':22s} {'slowest pattern':>16s} {'large (ms)':>11s} {'1 KB (ms)':>10s} {'ratio':>7s}")
    for name, call in PARSERS.items():
        rows = []
        for pattern in PATTERNS:
            large = pattern * (args.size // len(pattern) + 1)
            small = pattern * (1_000 // len(pattern) + 1)
            rows.append((best_of_three(call, large), best_of_three(call, small), pattern))
        large_s, small_s, pattern = max(rows)
        print(
            f"{name:22s} {pattern!r:>16s} {large_s * 1e3:11.1f} {small_s * 1e3:10.3f} "
            f"{large_s / max(small_s, 1e-9):7.0f}"
        )


if __name__ == "__main__":
    main()
