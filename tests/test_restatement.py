"""The grader reads the answer a reply states, never a computation it contains (SPEC section 6).

A reply built only from the question (the question re-typed, its operands with its operator, in any
notation) is no answer, so it is never graded right; a reply that names every option gives no letter.
Hand-written cases per task and form, and the property over the project's own arithmetic generator.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from udpo.env.tasks.arithmetic import LEVELS, Arithmetic
from udpo.env.tasks.base import Question
from udpo.env.tasks.custom import DatasetTask
from udpo.env.tasks.du_arithmetic import DuArithmetic
from udpo.env.tasks.formats import ChoiceTask
from udpo.env.tasks.gsm8k import GSM8K
from udpo.env.tasks.parsing import (
    FORM_ALL_OPTIONS,
    FORM_BOX,
    FORM_CUSTOM,
    FORM_LETTER,
    FORM_NONE,
    FORM_RESTATEMENT,
    FORM_STATED,
    FORMS,
    Reading,
    parse_number_answer,
    question_operands,
    read_choice,
    read_number_answer,
)
from udpo.env.tasks.realmistake import RealMistake

DIVISION = Question("q", "What is 252 / 6?", "42")


@pytest.mark.parametrize(
    "reply",
    [
        "252 / 6",
        "252/6",
        "252  /  6",
        "252 // 6",
        "The answer is 252 / 6.",
        "The answer is 252 / 6",
        "\\frac{252}{6}",
        "\\dfrac{252}{6}",
        "\\tfrac{252}{6}",
        "-\\frac{252}{6}",
        "\\boxed{252/6}",
        "\\boxed{252 / 6}",
        "$\\boxed{\\frac{252}{6}}$",
        "\\boxed{\\dfrac{252}{6}}",
        "252 \u00f7 6",
        "252\u00f76",
        "252 \\div 6",
        "252\\div6",
        "\\boxed{252 \\div 6}",
        "252 divided by 6",
        "252 over 6",
        "What is 252 / 6?",
        "What is 252 / 6",
        "What is 252 / 6.",
        "$252 / 6$",
        "252 / 6 = ?",
    ],
)
def test_a_restated_division_is_no_answer(reply):
    task = Arithmetic(6)
    assert task.read(reply, DIVISION) == Reading(None, FORM_RESTATEMENT)
    assert task.parse(reply, DIVISION) is None
    assert not task.is_correct(task.parse(reply, DIVISION), DIVISION)


@pytest.mark.parametrize(
    ("question", "reply"),
    [
        ("What is 7 * 1?", "7 * 1"),
        ("What is 7 * 1?", "7*1"),
        ("What is 7 * 1?", "7 x 1"),
        ("What is 7 * 1?", "7x1"),  # the 1 is glued to the x, so 7 is the last number read
        ("What is 7 * 1?", "7 \u00d7 1"),
        ("What is 7 * 1?", "7 \\times 1"),
        ("What is 7 * 1?", "7\\times1"),
        ("What is 7 * 1?", "\\boxed{7 \\cdot 1}"),
        ("What is 7 * 1?", "7 times 1."),
        ("What is 0 + 7?", "0 + 7"),
        ("What is 0 + 7?", "0 plus 7"),
        ("What is 0 + 7?", "The answer is 0+7."),
        ("What is 12 - 45?", "12 - 45"),
        ("What is 12 - 45?", "12 -45"),  # the minus read as 45's sign
        ("What is 12 - 45?", "12 \u2212 45"),
        ("What is 12 - 45?", "12 minus 45"),
        ("What is 2 + 3 * 4?", "2 + 3 * 4"),
        ("What is 2 + 3 * 4?", "\\boxed{2 + 3 \\times 4}"),
        ("What is 2 * 17 - 17?", "2x17-17"),  # the 17 after the x is glued to it; the last 17 decides
        ("What is 36 / 6?", "(36)/(6)"),  # the quotient is an operand: brackets must not hide the echo
        ("What is 36 / 6?", "[36] / [6]"),
        ("What is 36 / 6?", "36 : 6"),
    ],
)
def test_a_restated_operation_is_no_answer(question, reply):
    assert read_number_answer(reply, question) == Reading(None, FORM_RESTATEMENT)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("252 / 6 = 42", Reading("42", FORM_STATED)),
        ("252 / 6 = 42.", Reading("42", FORM_STATED)),
        ("\\boxed{42}", Reading("42", FORM_BOX)),
        ("252 / 6 is \\boxed{42}", Reading("42", FORM_BOX)),
        ("\\boxed{252 / 6 = 42}", Reading("42", FORM_BOX)),
        ("42", Reading("42", FORM_STATED)),
        ("The answer is 42.", Reading("42", FORM_STATED)),
        ("\\frac{84}{2}", Reading("42", FORM_STATED)),  # not the question's numbers: a value, read
        ("51 / 3 is not a number.", Reading("17", FORM_STATED)),  # nor here
        ("I cannot tell.", Reading(None, FORM_NONE)),
        ("\\boxed{}", Reading(None, FORM_NONE)),
    ],
)
def test_a_stated_answer_still_reads(reply, expected):
    assert Arithmetic(6).read(reply, DIVISION) == expected


def test_without_the_question_nothing_is_refused():
    """The bare parser knows no question: it reads fractions as their values, as before."""
    assert parse_number_answer("252 / 6") == "42"
    assert parse_number_answer("51 / 3 is not a number.") == "17"
    assert parse_number_answer("51 / 3 is not a number.", "What is 51 / 3?") is None


def test_question_operands_counts_each_number_of_a_fraction():
    assert question_operands("What is 252 / 6?") == {"252", "6"}
    assert question_operands("What is \\frac{3}{4} of 1,200 - 0.50?") == {"3", "4", "1200", "0.5"}
    assert question_operands("x2 and 12-45") == {"12", "45"}


def test_gsm8k_reads_a_genuine_fraction_and_refuses_its_own_numbers():
    question = Question("g", "A pizza has 8 slices. Tom eats 2 and Ann eats 4. What part is left?", "0.25")
    task = GSM8K()
    assert task.read("8 - 2 - 4 = 2 slices of 8, so \\boxed{1/4}", question) == Reading("0.25", FORM_BOX)
    assert task.read("\\boxed{\\frac{1}{4}}", question) == Reading("0.25", FORM_BOX)
    assert task.read("The part left is 2/8", question) == Reading(None, FORM_RESTATEMENT)
    assert task.read("\\boxed{8 - 2 - 4}", question) == Reading(None, FORM_RESTATEMENT)
    assert task.read("So 8 - 2 - 4 = 2, and 2 of 8 is \\boxed{0.25}.", question).answer == "0.25"


def test_du_arithmetic_refuses_the_expression_re_typed():
    task = DuArithmetic()
    question = task.load("test", limit=1)[0]
    assert question.text == "What is the result of 12+15*21+0-3*27?"
    for reply in (question.text, "12+15*21+0-3*27", "\\boxed{12+15*21+0-3*27}", "12 + 15 * 21 + 0 - 3 * 27."):
        assert task.read(reply, question) == Reading(None, FORM_RESTATEMENT), reply
    assert task.read("12+315+0-81 = \\boxed{246}", question) == Reading("246", FORM_BOX)


def test_user_data_with_numeric_answers_refuses_a_restatement():
    task = DatasetTask("sums", test=[{"id": "a", "question": "How much is 36 / 6?", "answer": "6"}])
    question = task.load("test")[0]
    assert task.read("36 / 6", question) == Reading(None, FORM_RESTATEMENT)
    assert task.read("\\boxed{6}", question) == Reading("6", FORM_BOX)


def test_a_users_parse_function_reads_in_form_custom():
    task = DatasetTask(
        "sums",
        test=[{"id": "a", "question": "How much is 36 / 6?", "answer": "6"}],
        parse=lambda text, q: "6" if "six" in text else None,
    )
    question = task.load("test")[0]
    assert task.read("six", question) == Reading("6", FORM_CUSTOM)
    assert task.read("36 / 6", question) == Reading(None, FORM_NONE)


FOUR = Question(
    "m", "Which?\n\n(A) red\n(B) blue\n(C) green\n(D) grey", "B", ("red", "blue", "green", "grey")
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("(A) (B) (C) (D)", Reading(None, FORM_ALL_OPTIONS)),
        ("(A) or (B) or (C) or (D)", Reading(None, FORM_ALL_OPTIONS)),
        (FOUR.text, Reading(None, FORM_ALL_OPTIONS)),  # the question re-typed
        ("A) red\nB) blue\nC) green\nD) grey", Reading(None, FORM_ALL_OPTIONS)),
        ("\\boxed{A} \\boxed{B} \\boxed{C} \\boxed{D}", Reading(None, FORM_ALL_OPTIONS)),
        ("(A) or (B)", Reading("B", FORM_LETTER)),  # not every option: the last one named
        ("Answer: (B)", Reading("B", FORM_LETTER)),
        ("B", Reading("B", FORM_LETTER)),
        (FOUR.text + "\nAnswer: (B)", Reading("B", FORM_LETTER)),  # a marked answer after the options
        ("\\boxed{B}", Reading("B", FORM_BOX)),
        ("I do not know.", Reading(None, FORM_NONE)),
    ],
)
def test_a_reply_naming_every_option_gives_no_letter(reply, expected):
    assert ChoiceTask.read(_Choice(), reply, FOUR) == expected
    assert read_choice(reply, "ABCD") == expected


class _Choice(ChoiceTask):
    """A lettered task with no data: what truthfulqa and commonsenseqa parse with."""

    name = "choice"

    def load(self, split="test", data_path=None, limit=None, seed=0):
        return [FOUR]


def test_one_offered_option_is_still_a_letter():
    assert read_choice("(A)", "A") == Reading("A", FORM_LETTER)


def test_realmistake_verdicts_are_stated():
    task, question = RealMistake(), Question("r", "Input ... Response ...", "error")
    assert task.read("Verdict: error", question) == Reading("error", FORM_STATED)
    assert task.read("hmm", question) == Reading(None, FORM_NONE)


def test_every_form_a_parser_gives_is_documented():
    assert len(set(FORMS)) == len(FORMS)
    assert Reading.of(None, FORM_BOX) == Reading(None, FORM_NONE)


# --- the property: no reply built only from the question's text is graded right ----------------------

#: how a reply may write each operator of the generator
NOTATIONS = {
    "+": ["+", " + ", " plus "],
    "-": ["-", " - ", " \u2212 ", " minus "],
    "*": ["*", " * ", "x", " x ", " \u00d7 ", "\\times", " \\times ", " \\cdot ", "\u00b7", " times "],
    "/": ["/", " / ", "  /  ", " // ", " \u00f7 ", "\u00f7", " \\div ", "\\div", " divided by ", " over "],
}
#: what may stand around an expression
WRAPPERS = [
    "{}",
    "{}.",
    "{} ",
    "The answer is {}.",
    "The answer is {}",
    "\\boxed{{{}}}",
    "$\\boxed{{{}}}$",
    "$ {} $",
    "{} = ?",
    "What is {}?",
    "What is {}",
    "So the result is {}.",
]


def restatements(question: Question, rng: random.Random) -> list[str]:
    """Replies made of ``question``'s text alone: the question itself, and its expression in the notations
    of its operators (every notation of a single operator; six drawn with ``rng`` for three terms), in
    every wrapper, and as fractions for a division."""
    tokens = question.meta["expression"].split(" ")
    operands, operators = tokens[::2], tokens[1::2]
    expressions = [question.meta["expression"]]
    if len(operators) == 1:
        expressions += [operands[0] + notation + operands[1] for notation in NOTATIONS[operators[0]]]
    for _ in range(6 if len(operators) > 1 else 0):
        written = operands[0]
        for op, b in zip(operators, operands[1:], strict=True):
            written += rng.choice(NOTATIONS[op]) + b
        expressions.append(written)
    if operators == ["/"]:
        a, b = operands
        expressions += [f"\\{kind}{{{a}}}{{{b}}}" for kind in ("frac", "dfrac", "tfrac")]
    replies = [question.text, question.text.rstrip("?"), question.text.rstrip("?") + "."]
    return replies + [wrapper.format(e) for e in expressions for wrapper in WRAPPERS]


def test_no_restatement_of_the_small_levels_is_graded_right():
    """Every problem of levels 1, 3 and 6 (one-digit sums and products, exact divisions), every notation:
    the cases where an operand is the answer (0 + 7, 7 * 1, 36 / 6) included."""
    task = Arithmetic(1)
    problems = [
        (a, op, b, a + b if op == "+" else a * b) for op in "+*" for a in range(10) for b in range(10)
    ]
    problems += [(b * q, "/", b, q) for b in range(2, 13) for q in range(2, 51)]
    rng = random.Random(0)
    for a, op, b, value in problems:
        expression = f"{a} {op} {b}"
        question = Question("q", f"What is {expression}?", str(value), meta={"expression": expression})
        for reply in restatements(question, rng):
            assert not task.is_correct(task.parse(reply, question), question), (question.text, reply)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), level=st.sampled_from(sorted(LEVELS)))
def test_no_reply_built_from_the_question_is_graded_right(seed, level):
    task = Arithmetic(level, n_questions=8)
    rng = random.Random(seed)
    for question in task.load("test", seed=seed) + task.load("train", seed=seed):
        for reply in restatements(question, rng):
            reading = task.read(reply, question)
            assert not task.is_correct(reading.answer, question), (question.text, reply, reading)
            assert reading.form in FORMS


@pytest.mark.parametrize("name", ["truthfulqa", "commonsenseqa"])
def test_a_letter_task_gives_no_letter_for_its_question_re_typed(name, shared_data):
    from udpo.env.tasks import get_task

    task = get_task(name)
    split = "all" if name == "truthfulqa" else "dev"
    for question in task.load(split, shared_data, limit=20):
        letters = task.letters(question)
        for reply in (question.text, " ".join(f"({x})" for x in letters), task.prompt(question)):
            assert task.read(reply, question) == Reading(None, FORM_ALL_OPTIONS), reply
        marked = f"{question.text}\n\nAnswer: ({question.gold})"
        assert task.read(marked, question) == Reading(question.gold, FORM_LETTER)
        assert task.read(f"\\boxed{{{question.gold}}}", question) == Reading(question.gold, FORM_BOX)


def test_no_gsm8k_reference_solution_is_refused(shared_data):
    """The rule refuses restatements only: each GSM8K test solution, its final line as a stated or a boxed
    answer, reads its gold answer, although its computations use the question's numbers throughout."""
    task = GSM8K()
    for question in task.load("test", shared_data):
        reasoning = question.meta["solution"].split("####")[0]
        for reply in (
            f"{reasoning} The answer is {question.gold}.",
            f"{reasoning} \\boxed{{{question.gold}}}",
        ):
            assert task.parse(reply, question) == question.gold, (question.text, reply)
