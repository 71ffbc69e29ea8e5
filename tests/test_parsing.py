"""Answer parsing: canonical numbers, boxed answers, option letters, short texts (env/tasks/parsing.py)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from udpo.env.tasks.parsing import (
    boxed_contents,
    canonical_number,
    extract_numbers,
    normalize_number,
    normalize_text,
    parse_choice,
    parse_number_answer,
    parse_text_answer,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1000, "1000"),
        ("1000.000", "1000"),
        (12.50, "12.5"),
        ("12.50", "12.5"),
        (-3, "-3"),
        ("-0.0", "0"),
        ("+7", "7"),
        (Fraction(1, 3), "0.333333"),
        (Fraction(2, 3), "0.666667"),
        ("1/2", None),  # a literal, not an expression: normalize_number reads fractions
        (Decimal("1.0000004"), "1"),
        (Decimal("0.9999996"), "1"),
        (1e-7, "0"),
        (-1e-7, "0"),
        (0.1 + 0.2, "0.3"),
        ("1e3", "1000"),
        (10**30, "1" + "0" * 30),
        ("nan", None),
        (float("inf"), None),
        ("abc", None),
        ("", None),
        ("1/0", None),
        ("1e999999999", None),  # rejected without building the integer
        ("-1e-999999999", "0"),
        ("1" * 100, "1" * 100),
        ("1" * 101, None),  # degenerate output, not an answer
        (10**100, None),
        ("0." + "1" * 300, None),
    ],
)
def test_canonical_number(value, expected):
    assert canonical_number(value) == expected


def test_numbers_equal_within_tolerance_share_one_string():
    assert canonical_number(Fraction(1, 3)) == canonical_number("0.3333331") == canonical_number(0.33333333)
    assert canonical_number("2.0000001") == canonical_number(2) != canonical_number("2.000001")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,600", "1600"),
        (" 18 ", "18"),
        ("1,234,567", "1234567"),
        ("$12.50", "12.5"),
        ("\\$12.50", "12.5"),
        ("-3.", "-3"),
        ("\u22124", "-4"),
        ("25%", "25"),
        ("\\frac{3}{4}", "0.75"),
        ("-\\frac{1}{2}", "-0.5"),
        ("7/2", "3.5"),
        ("1{,}000", "1000"),
        ("five", None),
        ("12 apples", None),
        ("", None),
        ("1/0", None),
        ("1.2.3", None),
    ],
)
def test_normalize_number_reads_whole_strings(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{1,000}", "1000"),
        ("The total is \\boxed{-3}.", "-3"),
        ("She loses 7, so the change is -7.", "-7"),
        ("x = -5", "-5"),
        ("The result is \u22124", "-4"),
        ("It costs $12.50.", "12.5"),
        ("\\boxed{\\$12.50}", "12.5"),
        ("-$5 is the balance", "-5"),
        ("So the answer is 42.", "42"),
        ("The answer is 3.14.", "3.14"),
        ("We get 0.50", "0.5"),
        ("First \\boxed{3}, then I fixed it: \\boxed{5}", "5"),
        ("\\boxed{18} dollars, which is 2 times 9", "18"),
        ("", None),
        ("I am not sure.", None),
        ("So the total is 7. \\boxed{", "7"),
        ("So the total is 7. \\boxed{12", "12"),
        ("She has 3 apples and buys 4 more, so she has 7 apples.", "7"),
        ("The discount is 25%.", "25"),
        ("\\boxed{25\\%}", "25"),
        ("The population is 1,234,567 people.", "1234567"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{3/4}", "0.75"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{\\text{18}}", "18"),
        ("\\boxed{1{,}000}", "1000"),
        ("\\boxed{1\\,000}", "1000"),
        ("I will put the answer in \\boxed{}. It is 9", "9"),
        ("\\boxed{9} and then \\boxed{}", "9"),
        ("\\boxed{x} but the value is 4", "4"),
        ("Pages 10-12 were read.", "12"),
        ("16-3-4=9", "9"),
        ("Solve for x2 here", None),
        ("Version 1.2.3", None),
        ("Divide 1/0 then 6", "6"),
        ("**18**", "18"),
    ],
)
def test_parse_number_answer(text, expected):
    assert parse_number_answer(text) == expected


def test_extract_numbers_in_order():
    assert extract_numbers("From 1,000 take 250.5, add $3 and -2: 10-4") == [
        "1000",
        "250.5",
        "3",
        "-2",
        "10",
        "4",
    ]


def test_boxed_contents_match_nested_braces_and_skip_unclosed():
    text = "\\boxed{\\frac{1}{2}} and \\boxed {7} and \\boxed{\\text{a {b}}} then \\boxed{12"
    assert boxed_contents(text) == ["\\frac{1}{2}", "7", "\\text{a {b}}"]
    assert boxed_contents("no box") == []


def test_nested_boxes_count_through_the_inner_one():
    assert boxed_contents("\\boxed{x = \\boxed{5}} then \\boxed{6}") == ["5", "6"]
    assert boxed_contents("{\\boxed{1}} \\boxed{{2}}") == ["1", "{2}"]
    assert parse_number_answer("\\boxed{" * 3000 + "7" + "}" * 3000) == "7"


@pytest.mark.parametrize(
    "text",
    [
        "1" * 100_000,
        "answer is" + " " * 50_000 + "x",
        "answer" + "*" * 30_000 + " " * 30_000,
        "\\boxed{" * 20_000,
        "\\boxed{" * 3000 + "}" * 3000,
        "{" * 50_000 + "}" * 50_000,
        "(" * 50_000,
        "0." + "1" * 100_000,
    ],
)
def test_degenerate_outputs_parse_to_none(text):
    """Repetitive model outputs neither crash (Python's 4300-digit int limit) nor backtrack for long."""
    assert parse_number_answer(text) is None
    assert parse_choice(text, "ABCDE") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is (C).", "C"),
        ("The answer is C.", "C"),
        ("Answer: (B)", "B"),
        ("**Answer:** D", "D"),
        ("Final answer: **E**", "E"),
        ("I think A is tempting, but the answer is B because of the rest.", "B"),
        ("I believe so. A good point was made.", None),
        ("A", "A"),  # a reply that is only a letter
        ("  (D).\n", "D"),
        ("B) laughter", "B"),  # letter and parenthesis opening a line
        ("Thinking it over.\n**C)** mall", "C"),
        ("Plan B) fails", None),  # not at the start of a line
        ("A hospital, surely.", None),
        ("A good question. (B)", "B"),
        ("(A) looks right, though (C) is closer.", "C"),
        ("Answer: (B)\n(A) and (D) are wrong.", "B"),
        ("\\boxed{C}. Answer: (A)", "C"),
        ("\\boxed{(d)}", "D"),
        ("\\boxed{\\text{E}}", "E"),
        ("\\boxed{ b. }", "B"),
        ("(F)", None),
        ("(F) is not an option; (B) is.", "B"),
        ("The option(s) are unclear.", None),
        ("The answer is not (A); it is (B).", "B"),
        ("The answer isn't A", None),
        ("answer is I'm not sure", None),
        ("the answer is (c)", None),
        ("", None),
        ("\\boxed{", None),
    ],
)
def test_parse_choice_five_options(text, expected):
    assert parse_choice(text, "ABCDE") == expected


def test_parse_choice_beyond_e():
    letters = "ABCDEFGHIJKLM"
    assert parse_choice("Answer: (K)", letters) == "K"
    assert parse_choice("\\boxed{M}", letters) == "M"
    assert parse_choice("(N) or (L)?", letters) == "L"
    assert parse_choice("(N)", letters) is None
    assert parse_choice("The answer is I.", letters) == "I"
    assert parse_choice("The answer is I.", "ABCDE") is None


# Property tests: canonical numbers round-trip through every way we read numbers.

_decimals = st.decimals(
    min_value=-(10**12), max_value=10**12, places=6, allow_nan=False, allow_infinity=False
)


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_integers_round_trip(n):
    assert canonical_number(n) == str(n)
    assert normalize_number(f"{n:,}") == str(n)
    assert parse_number_answer(f"so we get \\boxed{{{n:,}}}.") == str(n)
    assert parse_number_answer(f"The answer is {n:,}.") == str(n)


@given(_decimals)
def test_decimals_round_trip(d):
    c = canonical_number(d)
    assert Fraction(c) == Fraction(d)  # at most 6 places: exact
    assert canonical_number(c) == c
    assert canonical_number(f"{d:f}0") == c  # trailing zeros do not matter
    assert normalize_number(c) == c
    assert parse_number_answer(f"\\boxed{{{c}}}") == c
    assert parse_number_answer(f"That makes {c}.") == c
    assert "e" not in c.lower() and not c.startswith("+") and c != "-0"
    assert not (("." in c) and c.endswith("0")) and not c.endswith(".")


@given(st.floats(min_value=-1e9, max_value=1e9, allow_nan=False))
def test_floats_round_to_six_places(x):
    c = canonical_number(x)
    assert abs(Fraction(c) - Fraction(x)) <= Fraction(1, 2 * 10**6)
    assert canonical_number(c) == c


@given(
    st.lists(st.sampled_from("ABCDEFGHIJ"), min_size=1, max_size=6), st.text(alphabet="xyz .,", max_size=20)
)
def test_last_parenthesized_letter_wins(letters, filler):
    text = f"{filler} ".join(f"({x})" for x in letters)  # "(s)" glued to a word is no letter
    assert parse_choice(text, "ABCDEFGHIJ") == letters[-1]


def test_a_chain_of_slashes_is_read_number_by_number():
    """A fraction is two numbers and one slash; in a chain (a date, "1/1/1") no pair is singled out, so
    how a run of slashes reads never depends on where it starts."""
    assert extract_numbers("on 3/4/2024, then 1/2 and 7 / 8") == ["3", "4", "2024", "0.5", "0.875"]
    assert extract_numbers("1/2/3") == extract_numbers("1 / 2 / 3") == ["1", "2", "3"]
    assert parse_number_answer("1/1/1/7") == parse_number_answer("1/1/7") == "7"
    assert parse_number_answer("so 1/7") == "0.142857"


# Text answers: the forms a number is read in (box, "the answer is", a final line), for words.


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is green.", "green"),
        ("Mixing blue and yellow gives **green**.", "green"),
        ("\\boxed{Green}", "green"),
        ("\\boxed{\\text{Light Green}}", "light green"),
        ("\\boxed{x = \\boxed{rouge}}", "rouge"),  # a box in a box counts through the inner one
        ("\\boxed{} and \\boxed{ . } so the answer is red.", "red"),  # boxes without a word are skipped
        ("\\boxed{red}. The answer is blue.", "red"),  # a box outranks a marker
        ("The answer is red. On reflection, the answer is **blue**.", "blue"),  # the last marker wins
        ("Final answer: **Orange**\nI hope this helps!", "orange"),  # a marker outranks the last line
        ("**Answer:** the Pacific Ocean", "pacific ocean"),
        ("The answer would be purple, since red and blue make it.", "purple"),
        ('The answer is "Green".', "green"),
        ("answer = teal", "teal"),
        ("The answer is 3.5 litres.", "3.5 litres"),
        ("The answer isn't obvious to me here.", None),  # no marker ("isn't"), and prose, not a line
        ("The answer is that it depends on the pigments you use.", None),  # more than six words
        ("Step 1: mix them.\n\nPurple", "purple"),
        ("Green.", "green"),
        ("Red and blue make a colour I cannot name right now.", None),
        ("**Step 1:** mix the paints\nthen look closely at what you get", None),
        ("Final answer:", None),
        ("---", None),
        ("", None),
        ("  \n\t ", None),
        ("\uff27\uff32\uff25\uff25\uff2e", "green"),  # full-width letters
        ("Die Farbe ist **Gr\u00fcn**.", "gr\u00fcn"),
        ("Answer: STRASSE", "strasse"),
        ("\u00bbStra\u00dfe\u00ab", "strasse"),  # German quotes; sharp s case-folds to ss
    ],
)
def test_parse_text_answer(text, expected):
    assert parse_text_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  New   York. ", "new york"),
        ("The Beatles", "beatles"),
        ("an apple", "apple"),
        ("a", "a"),  # an article alone is kept
        ("the the", "the"),
        ("'Green'!", "green"),
        ("**blue-green**", "blue-green"),
        ("3.5", "3.5"),
        ("\ufb01sh", "fish"),  # a ligature
        ("\u201cgreen\u201d", "green"),
        ("...", ""),
    ],
)
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 3000 + "green" + "}" * 3000,
        "{" * 50_000 + "}" * 50_000 + "\nThe answer is green.",
        "answer is " * 50_000 + "\n**green**",
        "word " * 20_000 + "so the answer is \\boxed{\\text{Green}}.",
        "**" * 50_000 + "\nThe answer is green.",
    ],
)
def test_text_answers_after_degenerate_output(text):
    """Long and nested inputs: the answer at the end is read, quickly (test_parser_bounds holds the time)."""
    assert parse_text_answer(text) == "green"


def test_normalize_text_is_linear():
    """Articles are dropped in one pass: a megabyte of "a a a ..." is not quadratic."""
    assert normalize_text("a " * 500_000 + "green") == "green"
    assert normalize_text("the " * 250_000) == "the"
