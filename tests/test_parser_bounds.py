"""Every parser of model output takes any text and stays fast: no exception, a well-formed result, and
under 50 ms per call on 1 MB inputs (degenerate outputs a server can send: "1,1,1,...", "\\boxed{" x 10^5,
a million "!"), measured as the best of three calls."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from udpo.env.attacks.autoinject import builtin_corruption, clean_rewrite, parse_keyed, split_sentences
from udpo.env.attacks.autotransform import clean_profile
from udpo.env.tasks import parsing
from udpo.env.tasks.parsing import (
    LETTERS,
    boxed_contents,
    canonical_number,
    extract_numbers,
    last_number,
    normalize_number,
    parse_choice,
    parse_number_answer,
    parse_text_answer,
    reply_tail,
)

# a linear pass over a megabyte: a few ms quiet, 54 ms seen with both cores of the AVX2 CI machine busy;
# a super-linear pattern takes seconds on a megabyte, far above this bound
LIMIT_S = 0.15
MEGABYTE = 1_000_000


def check_number(result):
    assert result is None or (isinstance(result, str) and canonical_number(result) == result)


def check_numbers(result):
    assert isinstance(result, list)
    for number in result:
        check_number(number)


def check_choice(result):
    assert result is None or result in "ABCDE"


def check_text(result):
    assert result is None or (isinstance(result, str) and result == result.strip() and result)


def check_strings(result):
    assert isinstance(result, list) and all(isinstance(x, str) for x in result)


def check_split(result, text):
    assert "".join(result.pieces) == text  # lossless


#: a question whose numbers the degenerate outputs are made of, so the restatement check runs on them
QUESTION = "What is 1 + 12 * 2 - 10 / 5, in 1,000 units of 0.5?"
#: name -> (call on a text, check of its result given the text)
PARSERS = {
    "parse_number_answer": (parse_number_answer, lambda r, t: check_number(r)),
    "parse_number_answer of a question": (
        lambda t: parse_number_answer(t, QUESTION),
        lambda r, t: check_number(r),
    ),
    "parse_choice": (lambda t: parse_choice(t, "ABCDE"), lambda r, t: check_choice(r)),
    "parse_text_answer": (parse_text_answer, lambda r, t: check_text(r)),
    "normalize_number": (normalize_number, lambda r, t: check_number(r)),
    "canonical_number": (canonical_number, lambda r, t: check_number(r)),
    "extract_numbers": (extract_numbers, lambda r, t: check_numbers(r)),
    "last_number": (last_number, lambda r, t: check_number(r)),
    "boxed_contents": (boxed_contents, lambda r, t: check_strings(r)),
    "reply_tail": (reply_tail, lambda r, t: t.endswith(r)),
    "split_sentences": (split_sentences, check_split),
    "parse_keyed": (
        lambda t: parse_keyed(t, [1, 2, 3]),
        lambda r, t: set(r) <= {1, 2, 3} and all(isinstance(v, str) for v in r.values()),
    ),
    "clean_profile": (clean_profile, lambda r, t: isinstance(r, str)),
    "clean_rewrite": (clean_rewrite, lambda r, t: isinstance(r, str)),
    "builtin_corruption": (
        lambda t: builtin_corruption(t, random.Random(0)),
        lambda r, t: isinstance(r, str) and r != t,
    ),
}
#: repeated to 1 MB: each a pattern that made some parser quadratic, or that it has to scan
UNITS = [
    "1,",
    "1",
    "1,111",
    "1.",
    "1/",
    "-",
    "$ ",
    "\\boxed{",
    "\\boxed{1}",
    "{",
    "}",
    "\\frac{1}{",
    "\\text{",
    "(A)",
    "C)\n",
    "answer is ",
    "Answer: ",
    "**",
    "a ",
    " ",
    "\n",
    "!",
    "a. ",
    "! ",
    "[1] ",
    "[1]",
    "```x\n",
    "sure:",
    "#",
    "\u2212",
    "x2",
    "1 + ",
    "12 \\times ",
    "2 divided by ",
]
#: characters the parsers give meaning to, for random texts
ALPHABET = "0123456789,.-+$%/\\{}()[]:*#`!?'\" \n\tABCDEabxfrcboxedtansw\u2212\u00f7\u00d7"


def best_of_three(call, text) -> tuple[float, object]:
    times, result = [], None
    for _ in range(3):
        start = time.perf_counter()
        result = call(text)
        times.append(time.perf_counter() - start)
    return min(times), result


def megabyte_of(unit: str, head: str = "", tail: str = "") -> str:
    return head + unit * (MEGABYTE // len(unit) + 1) + tail


@pytest.mark.parametrize("unit", UNITS)
def test_every_parser_is_fast_on_a_megabyte_of_degenerate_output(unit):
    text = megabyte_of(unit)
    assert len(text) >= MEGABYTE
    for name, (call, check) in PARSERS.items():
        seconds, result = best_of_three(call, text)
        check(result, text)
        assert seconds < LIMIT_S, (
            f"{name} took {seconds * 1000:.0f} ms on {unit!r} x {len(text) // len(unit)}"
        )


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    unit=st.text(alphabet=ALPHABET, min_size=1, max_size=8),
    head=st.text(alphabet=ALPHABET, max_size=40),
    tail=st.text(alphabet=ALPHABET, max_size=40),
)
def test_random_megabyte_outputs_stay_under_the_bound(unit, head, tail):
    text = megabyte_of(unit, head, tail)
    for name, (call, check) in PARSERS.items():
        seconds, result = best_of_three(call, text)
        check(result, text)
        assert seconds < LIMIT_S, f"{name} took {seconds * 1000:.0f} ms on {head!r} + {unit!r} x n + {tail!r}"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=300) | st.text(max_size=300))
def test_any_short_text_parses_without_error(text):
    for call, check in PARSERS.values():
        check(call(text), text)


def test_the_tail_keeps_the_final_answer_and_splits_no_number():
    filler = "word " * 10_000  # 50,000 characters before the answer
    assert parse_number_answer(filler + "so the answer is \\boxed{42}.") == "42"
    assert parse_choice(filler + "Answer: (C)", LETTERS[:5]) == "C"
    assert parse_text_answer(filler + "The answer is green.") == "green"
    # the cut lands inside a number: the cut moves past it, so no partial number is read
    assert reply_tail("7" * 30_000 + " then 5 words") == "then 5 words"
    assert last_number("z" * 20_000 + "123456789" + "q" * 8_187) is None  # not "56789"
    assert last_number("z" * 20_000 + "123456789 " + "q" * 8_186) is None
    assert last_number("z 123456789 " + "q" * 8_000) == "123456789"  # all within the tail: read whole


# --- the bound does not change what is read ---------------------------------------------------------
@pytest.mark.parametrize(
    "unit", ["1,", "1/1/", "1,111,", "1/2 ", "- ", "$ ", "\\boxed{", "\\boxed{} ", "x/0 "]
)
@pytest.mark.parametrize("count", [1, 100, 2048, 5000, 250_000])
def test_a_reply_ending_in_7_reads_7_at_every_length(unit, count):
    """Issue 26: ``"1," * 5000 + "7"`` gave None and ``"1/1/" * 2048 + "7"`` gave 0.142857 (the cut fell
    inside a run of numbers and read it out of step), where shorter forms of the same reply give 7."""
    assert parse_number_answer(unit * count + "7") == "7"


#: pieces of replies whose reading depends on their neighbours: runs of numbers, LaTeX, boxes, markers
PIECES = [
    *ALPHABET,
    "1,234",
    "1/2",
    " / ",
    "$ ",
    "\\boxed{",
    "\\frac{",
    "\\text{",
    "{,}",
    "\\,",
    "answer is ",
    "Answer: ",
    "**",
    "\n  C)",
    "(C)",
    " " * 17,
]
replies = st.lists(st.sampled_from(PIECES), max_size=60).map("".join)


def read_whole(call, text):
    """``call(text)`` with no bound: the whole reply read."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parsing, "MAX_REPLY_CHARS", 10**9)
        return call(text)


def read_bounded(call, text, bound):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(parsing, "MAX_REPLY_CHARS", bound)
        mp.setattr(parsing, "_EXTEND_CHARS", bound)
        return call(text)


def is_suffix(part: list, whole: list) -> bool:
    return whole[len(whole) - len(part) :] == part if part else True


@settings(max_examples=400, deadline=None)
@given(text=replies, bound=st.integers(1, 40))
def test_what_the_tail_reads_the_whole_reply_reads_the_same_way(text, bound):
    """Cutting at a boundary never splits a number, pairs a run of numbers out of step, opens a box or a
    wrapper half-way or cuts an answer marker: the numbers and boxes read in the tail are the last
    ones the whole reply reads, and when the tail holds what decides the answer, the answers agree."""
    numbers = read_bounded(extract_numbers, text, bound)
    boxes = read_bounded(boxed_contents, text, bound)
    all_numbers, all_boxes = read_whole(extract_numbers, text), read_whole(boxed_contents, text)
    assert is_suffix(numbers, all_numbers), (numbers, all_numbers)
    assert is_suffix(boxes, all_boxes), (boxes, all_boxes)
    decided_in_tail = any(last_number(b) for b in boxes) or (boxes == all_boxes and numbers)
    if decided_in_tail or not (all_numbers or all_boxes):
        assert read_bounded(parse_number_answer, text, bound) == read_whole(parse_number_answer, text)


@settings(max_examples=300, deadline=None)
@given(head=replies.filter(lambda t: "boxed" not in t), tail=replies, bound=st.integers(12, 40))
def test_a_marked_letter_at_the_end_is_read_whatever_came_before(head, tail, bound):
    """The letter a reply ends on ("Answer: (C)", inside the bound) is read from the tail as from the
    whole reply, however the text before it would have been cut."""
    text = head + tail + "\nAnswer: (C)"
    if "boxed" in tail:
        return  # a boxed letter outranks the marker: not what this checks
    assert read_bounded(lambda t: parse_choice(t, "ABCDE"), text, bound) == "C"


def test_a_reply_with_no_boundary_near_its_end_has_no_answer():
    """One unbroken run (a million digits, a wall of "\\boxed") longer than the bound and its extension
    is not read: no answer rather than a part of it."""
    for text in ("5 " + "1" * 20_000, "\\boxed\\boxed" * 2_000 + "7"):
        assert reply_tail(text) == "" and parse_number_answer(text) is None
