"""From model text to normalized answers: numbers, ``\\boxed{...}`` contents, option letters, short texts.

Every parser returns a normalized string or ``None`` (docs/tasks.md, "Answers"; docs/metrics.md, "The answer
matrix"):

- numbers are canonical decimals, ``canonical_number``: rounded to 6 decimal places, no trailing
  zeros, no ``.0``, no ``+``, never ``-0`` ("1000", "-3", "12.5", "0.333333"). Two numbers that
  agree to 6 decimals therefore give the same string, so string equality is numeric comparison
  with a 1e-6 tolerance, and answers hash and serialize consistently.
- option letters are single upper-case letters "A".."Z".
- text answers (``parse_text_answer``) are short phrases through ``normalize_text``: NFKC, case-folded,
  spaces collapsed, the punctuation, quotes, brackets and markdown around them and a leading English
  article dropped ("The Answer: **Green**." and "green" give the same string).

Model output can be any length (a server behind the openai backend can send megabytes), so the time
of a parse is bounded: a reply is read from a *boundary* at or before its last ``MAX_REPLY_CHARS``
characters (where a final answer stands), every pattern scans in linear time, and only the numbers
that decide the answer are converted. A boundary is a point no number, fraction, LaTeX wrapper, box or
answer marker crosses (``reply_tail``), so everything after it is read exactly as in the whole reply:
the bound never splits a number or changes how a run of numbers pairs up.

Every parser has a ``read_*`` twin that returns a :class:`Reading`: the answer and the form it was read
in (``FORMS``), so a drift toward a form the grader favours is visible (docs/metrics.md, "Answer forms and
echo rate"); the ``parse_*`` function is its ``.answer``. Given the question's text, the number parser
refuses a restated question (:func:`read_number_answer`): the grader reads the answer a reply states, never
a computation it contains.
"""

from __future__ import annotations

import bisect
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

#: option letters in order; a multiple-choice question uses the first len(options) of them
LETTERS = string.ascii_uppercase
_SCALE = 10**6  # 6 decimal places
_MAX_DIGITS = 100  # longer numbers are not answers (see canonical_number)
_MAX_VALUE = 10**_MAX_DIGITS
#: a reply is parsed from a boundary at or before its last this many characters (about 2k tokens)
MAX_REPLY_CHARS = 8_192
#: how much further back than MAX_REPLY_CHARS the boundary is looked for (then forward from the cut)
_EXTEND_CHARS = 8_192
#: the most spaces a construct holds in one gap ("answer   is", "\\frac{ 1 }"); a longer run is a boundary
_GAP = 16
#: a ``\\boxed{}`` or ``\\text{}`` holding more characters is not read as one (an answer is short)
MAX_BOX_CHARS = 1_000
#: a text longer than this is not one number (normalize_number, canonical_number)
_MAX_NUMBER_CHARS = 1_000

# One number as people and models write it: thousands commas (1,234,567), decimals (12.50, .5).
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_RE = re.compile(
    rf"""
    (?<![\w.])                                  # not part of a word (x2) or of 1.2.3
    (?P<sign>[-+\u2212])?                       # ASCII or Unicode minus; "10-12" has no sign
    (?:\\?\$\s?)?                               # currency sign: $ or LaTeX \$
    (?:
        \\[dt]?frac\{{\s{{0,{_GAP}}}(?P<fn>{_NUM})\s{{0,{_GAP}}}\}}\{{\s{{0,{_GAP}}}(?P<fd>{_NUM})\s{{0,{_GAP}}}\}}
      | (?<!/)(?<!/\s)(?P<n>{_NUM})\s?/\s?(?P<d>{_NUM})(?!\s?/\s?\.?\d)   # a/b, not in a chain a/b/c
      | (?P<w>{_NUM})                                                   # a number alone
    )
    (?!\d|\.\d)                                 # nor the head of 1.2.3
    """,
    re.VERBOSE,
)
# LaTeX that wraps or spaces numbers: \text{...} and friends keep their content; thin spaces go.
_LATEX_WRAPPER_RE = re.compile(
    rf"\\(?:text|textbf|mathrm|mathbf|mbox)\s{{0,{_GAP}}}\{{([^{{}}]{{0,{MAX_BOX_CHARS}}})\}}"
)
_LATEX_SPACE_RE = re.compile(r"\\[,!;: ]")
# what _clean_latex rewrites, and how each such piece opens
_REWRITTEN_RE = re.compile(f"{_LATEX_WRAPPER_RE.pattern}|{_LATEX_SPACE_RE.pattern}|\\{{,\\}}")
_REWRITE_HEAD_RE = re.compile(r"\\(?:[,!;: ]|text|textbf|mathrm|mathbf|mbox)|\{,\}")
#: what a number or LaTeX head can hold after a gap of spaces (see _joined_across)
_JOINS_LEFT = tuple("0123456789./{}\\")
_BRACE_RE = re.compile(r"[{}]")
_BOX_HEAD_RE = re.compile(rf"\\boxed\s{{0,{_GAP}}}\{{")
# a character after which a reply may be cut (reply_tail checks the rest): not a word character,
# nor the backslash of a LaTeX command
_CUT_AFTER_RE = re.compile(r"[^\w\\]")
_SPACES_RE = re.compile(r"\s*")
_THOUSANDS_RE = re.compile(r"\d{3}")
_NUMERIC_RE = re.compile(r"\s?\.?\d")
_AFTER_CURRENCY_RE = re.compile(r"\s?[\d.\\]")
_AFTER_SIGN_RE = re.compile(r"[\d.$\\]")
# the number after a slash is followed by another slash: a chain (a/b/c), in which no fraction is read
_CHAINED_RE = re.compile(rf"\s?(?:{_NUM})\s?/\s?\.?\d")
_ANSWER_WORD_RE = re.compile(r"(?i:answer)")
#: the most characters an answer marker spans ("answer", gaps, "should be", the letter)
_MARKER_REACH = 4 * _GAP + 16
# An operator between two operands, as a reply may write one: ASCII, Unicode, LaTeX or in words.
_OPERATOR = (
    r"(?://|\*\*|[-+*/:xX\u00d7\u00f7\u00b7\u2212\u2217\u22c5]|\\(?:times|div|cdot|ast)(?![a-zA-Z])"
    rf"|(?i:plus|minus|times|over|(?:divided|multiplied)\s{{1,{_GAP}}}by))"
)
# what may stand between an operand and its operator: spaces and brackets ("(252) / (6)")
_OPERATION_GAP = rf"[\s(){{}}\[\]]{{0,{_GAP}}}"
#: how far before a number an operation's first operand is looked for (operator, gaps, currency sign)
_OPERATION_REACH = 2 * _MAX_DIGITS + 4 * _GAP + 32
# "a op " right before the last number (its sign, if it has one, is the operator: "12 -45"); a may be glued
# to an operator before it ("2x17-17")
_OPERATION_BEFORE_RE = re.compile(
    rf"(?<![\d.,])(?:\\?\$\s?)?({_NUM}){_OPERATION_GAP}(?:{_OPERATOR}){_OPERATION_GAP}(?:\\?\$\s?)?\Z"
)
# " op b" right after it, b glued to what it follows and so not read as a number ("7x1", "7\times1")
_OPERATION_AFTER_RE = re.compile(
    rf"{_OPERATION_GAP}(?:{_OPERATOR}){_OPERATION_GAP}(?:\\?\$\s?)?({_NUM})(?!\d|\.\d)"
)
# a number as a question writes it: numerators and denominators count one by one
_OPERAND_RE = re.compile(rf"(?<![\w.])(?:{_NUM})(?!\d|\.\d)")
# Characters a human writes around a number that carry no value (normalize_number only).
_NUMBER_NOISE_RE = re.compile(r"[\s,$%]|\\\$|\\%")


#: the forms a reply's answer is read in (:class:`Reading`); docs/metrics.md, "Answer forms and echo rate"
FORM_BOX = "box"  # inside a \\boxed{} (a number, a letter or a text)
FORM_STATED = "stated"  # stated outside a box: the last number, a marked text or the last line, a verdict
FORM_LETTER = "letter"  # an option letter outside a box: "Answer: (C)", "(C)", "C) mall", a lone "C"
FORM_RESTATEMENT = "restatement"  # refused: the question's own operation without a result ("252 / 6")
FORM_ALL_OPTIONS = "all_options"  # refused: every offered option named at once ("(A) (B) (C) (D)")
FORM_NONE = "none"  # nothing the parser reads as an answer
FORM_CUSTOM = "custom"  # read by a parse function a user gave (a DatasetTask's parse=); its form is not known
FORM_UNKNOWN = "unknown"  # not recorded (a trajectory written before forms were)
FORMS = (
    FORM_BOX,
    FORM_STATED,
    FORM_LETTER,
    FORM_RESTATEMENT,
    FORM_ALL_OPTIONS,
    FORM_NONE,
    FORM_CUSTOM,
    FORM_UNKNOWN,
)
#: the forms that are a refused answer: the reply restated the question instead of answering it
REFUSED_FORMS = (FORM_RESTATEMENT, FORM_ALL_OPTIONS)


@dataclass(frozen=True)
class Reading:
    """An answer (a normalized string, None when none was read) and the form it was read in (``FORMS``)."""

    answer: str | None
    form: str

    @classmethod
    def of(cls, answer: str | None, form: str) -> Reading:
        """``Reading(answer, form)``, or ``Reading(None, "none")`` when ``answer`` is None."""
        return cls(answer, form) if answer is not None else cls(None, FORM_NONE)


def canonical_number(value: int | float | Fraction | Decimal | str) -> str | None:
    """The canonical string of a numeric value or decimal literal ("12.50", "-3", "1e3").

    Rounds half-to-even at 6 decimals. Returns None for anything that is not a finite number, and
    for numbers of more than 100 integer digits (degenerate output such as "1111...", which no
    answer needs and which would be slow to handle exactly).
    """
    frac = _exact(value)
    if frac is None:
        return None
    return _scaled_string(round(frac * _SCALE))


def _scaled_string(scaled: int) -> str:
    """The canonical string of ``scaled / 10**6``."""
    digits = str(abs(scaled)).rjust(7, "0")
    whole, decimals = digits[:-6], digits[-6:].rstrip("0")
    sign = "-" if scaled < 0 else ""
    return f"{sign}{whole}.{decimals}" if decimals else f"{sign}{whole}"


def normalize_number(text: str) -> str | None:
    """The canonical form of ``text`` when all of it is one number, else None.

    Drops what carries no value: spaces, commas, ``$``, ``%``, a trailing period, a leading ``+``;
    reads the Unicode minus and fractions ``a/b`` or ``\\frac{a}{b}``. Used for gold answers
    ("1,234" -> "1234") and for whole-answer checks; ``extract_numbers`` finds numbers in prose.
    """
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    cleaned = _NUMBER_NOISE_RE.sub("", _clean_latex(text)).replace("\u2212", "-").rstrip(".")
    frac = re.fullmatch(r"([-+]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}", cleaned)
    if frac:
        cleaned = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}"
    if not re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/(?:\d+(?:\.\d*)?|\.\d+))?", cleaned):
        return None
    num, _, den = cleaned.partition("/")
    return _canonical_ratio(num, den or None)


def extract_numbers(text: str) -> list[str]:
    """Canonical forms of the numbers written in ``text``, in order of appearance.

    Recognized: integers, decimals, thousands commas ("1,234,567"), a sign directly before the
    digits (not a hyphen after a word or number: "10-12" gives 10 and 12), ``$`` and ``\\$``
    prefixes, fractions ``a/b`` and ``\\frac{a}{b}`` (read as their value; ``x/0`` is skipped). A
    chain of slashes is no fraction: "1/2/3" and the date "3/4/2024" are read number by number.
    A percent sign is ignored ("50%" gives 50). Digits glued after letters ("x2") do not count.
    Only the reply's tail is read (``reply_tail``).
    """
    window, start = _window(text)
    numbers = (_match_number(m) for m in _NUMBER_RE.finditer(_clean_latex(window), start))
    return [n for n in numbers if n is not None]


def _match_number(m: re.Match) -> str | None:
    """The canonical number of one ``_NUMBER_RE`` match (None for ``x/0``)."""
    num, den = (m["fn"], m["fd"]) if m["fn"] is not None else (m["n"] or m["w"], m["d"])
    sign = "-" if m["sign"] in ("-", "\u2212") else ""
    return _canonical_ratio(sign + num.replace(",", ""), den and den.replace(",", ""))


def _canonical_ratio(num: str, den: str | None) -> str | None:
    """canonical_number of num / den (of num when den is None); None if either is no number or den is 0."""
    if num.lstrip("-").isdecimal() and (den is None or den.isdecimal()):  # integers (most answers): exact
        if (
            len(num.lstrip("-").lstrip("0")) > _MAX_DIGITS
            or den is not None
            and len(den.lstrip("0")) > _MAX_DIGITS
        ):
            return None
        if den is None:
            return str(int(num))
        top, bottom = int(num), int(den)
        if bottom == 0 or abs(top) >= _MAX_VALUE * bottom:
            return None
        whole, rest = divmod(abs(top) * _SCALE, bottom)  # round half to even, as round() on a Fraction
        whole += 2 * rest > bottom or (2 * rest == bottom and whole % 2 == 1)
        return _scaled_string(whole if top >= 0 else -whole)
    top = _exact(num)
    bottom = Fraction(1) if den is None else _exact(den)
    return canonical_number(top / bottom) if top is not None and bottom else None


def _exact(value: int | float | Fraction | Decimal | str) -> Fraction | None:
    """``value`` as an exact Fraction; None if not a finite number of at most _MAX_DIGITS integer
    digits (and, for decimal strings, 2 * _MAX_DIGITS significant digits and _MAX_NUMBER_CHARS characters).

    Strings go through Decimal, which reads "1e999999999" without building the integer, so the
    size check comes before any expensive conversion.
    """
    if isinstance(value, str):
        if len(value) > _MAX_NUMBER_CHARS:
            return None
        try:
            value = Decimal(value.strip())
        except InvalidOperation:
            return None
    if isinstance(value, Decimal):
        if not value.is_finite():
            return None
        if value.is_zero() or value.adjusted() < -_MAX_DIGITS:  # far below the 6-decimal rounding
            return Fraction(0)
        if value.adjusted() >= _MAX_DIGITS or len(value.as_tuple().digits) > 2 * _MAX_DIGITS:
            return None
    try:
        frac = Fraction(value)  # floats convert exactly; nan and inf fail here
    except (TypeError, ValueError, OverflowError):
        return None
    return frac if abs(frac) < _MAX_VALUE else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (see ``extract_numbers``), or None; only that one is converted, and
    only the reply's tail is read (``reply_tail``)."""
    return _last_number(*_window(text))


def _last_number(text: str, start: int = 0) -> str | None:
    """:func:`last_number` of all of ``text`` from ``start`` (the characters before it are context)."""
    found = _last_number_match(text, start)
    return found[2] if found else None


def _last_number_match(text: str, start: int = 0) -> tuple[str, re.Match, str] | None:
    """``(the text as read, the last number's match, its canonical number)``, or None without a number."""
    cleaned = _clean_latex(text)
    for m in reversed(list(_NUMBER_RE.finditer(cleaned, start))):
        number = _match_number(m)
        if number is not None:
            return cleaned, m, number
    return None


def question_operands(question: str) -> frozenset[str]:
    """The canonical absolute values of the numbers written in ``question``, each numerator and
    denominator on its own ("What is 252 / 6?" gives 252 and 6): what a restatement is built from."""
    numbers = (
        _canonical_ratio(m.group().replace(",", ""), None)
        for m in _OPERAND_RE.finditer(_clean_latex(question))
    )
    return frozenset(n for n in numbers if n is not None)


def _restates(cleaned: str, m: re.Match, operands: frozenset[str]) -> bool:
    """Whether the number of match ``m`` (the last one read in ``cleaned``) is an operation on the
    question's ``operands`` with no result after it: a fraction of two operands (``252 / 6``,
    ``\\frac{252}{6}``), or an operand joined by an operator to an operand before it (``252 \\div 6``,
    ``2 + 3 * 4``, ``12 -45``) or glued after it (``7x1``, where the 1 is no number of its own)."""

    def operand(digits: str | None) -> bool:
        return digits is not None and _canonical_ratio(digits.replace(",", ""), None) in operands

    if not operands:
        return False
    if m["fn"] is not None or m["d"] is not None:
        return operand(m["fn"] or m["n"]) and operand(m["fd"] or m["d"])
    if not operand(m["w"]):
        return False
    digits = m.start("w")
    before = _OPERATION_BEFORE_RE.search(cleaned, max(0, digits - _OPERATION_REACH), digits)
    after = _OPERATION_AFTER_RE.match(cleaned, m.end())
    return bool(before and operand(before.group(1)) or after and operand(after.group(1)))


def _read_number(text: str, start: int, operands: frozenset[str], form: str) -> Reading | None:
    """The last number of ``text`` from ``start`` read in ``form``, refused as a restatement of the
    question (:func:`_restates`); None when ``text`` holds no number."""
    found = _last_number_match(text, start)
    if found is None:
        return None
    cleaned, m, number = found
    return Reading(None, FORM_RESTATEMENT) if _restates(cleaned, m, operands) else Reading(number, form)


def reply_tail(text: str) -> str:
    """The part of a reply the parsers read: all of it up to ``MAX_REPLY_CHARS`` characters, else from
    the last boundary at or before its last ``MAX_REPLY_CHARS`` (looked for up to ``_EXTEND_CHARS``
    further back, then forward from there): a point that no construct crosses, so the tail reads as
    the same characters do in the whole reply (the same numbers, paired the same way, the same boxes
    and markers). A reply with no boundary there ends in one unbroken run (a million digits, say) and
    gives the empty tail: no answer.

    A boundary follows a character that belongs to no construct there: punctuation such as ``!?;)``, a
    period or comma that no digits continue (``1,1,...``), the slash of a chain (``1/1/1``), a sign or
    ``$`` before no number, a space that no number, LaTeX head or answer marker spans (``$ 5``,
    ``1 / 2``, ``answer is C``) and that does not indent a line; never inside a complete ``\\boxed{}``
    or LaTeX that reading rewrites (``\\text{}``, ``\\,``)."""
    window, start = _window(text)
    return window[start:]


def _window(text: str) -> tuple[str, int]:
    """``(part, start)``: the parsers read ``part[start:]``; ``part[:start]`` is the one character
    before the boundary, kept so that look-behinds see what they see in the whole reply."""
    if len(text) <= MAX_REPLY_CHARS:
        return text, 0
    at = _boundary(text)
    if at is None:
        return "", 0
    return (text, 0) if at == 0 else (text[at - 1 :], 1)


def _boundary(text: str) -> int | None:
    """The last boundary (see ``reply_tail``) at or before the cut, else the first after it, else None."""
    cut = len(text) - MAX_REPLY_CHARS
    low = max(0, cut - _EXTEND_CHARS)
    spans = _construct_spans(text, max(0, low - MAX_BOX_CHARS - 2 * _GAP - 16))
    before = [m.end() for m in _CUT_AFTER_RE.finditer(text, max(0, low - 1), cut)]
    for at in reversed(before):
        if _is_boundary(text, at, spans):
            return at
    if low == 0:
        return 0
    after = (m.end() for m in _CUT_AFTER_RE.finditer(text, cut))
    return next((at for at in after if _is_boundary(text, at, spans)), None)


def _is_boundary(text: str, at: int, spans: list[tuple[int, int]]) -> bool:
    """Whether ``text`` can be cut at ``at``, after ``text[at - 1]``, without cutting a construct;
    ``spans``: the boxes and rewritten LaTeX around it (:func:`_construct_spans`)."""
    return _free_after(text, at, text[at - 1]) and not _inside(spans, at)


def _free_after(text: str, at: int, char: str) -> bool:
    """Whether no number, fraction, answer marker or line-opening letter holds both ``char``
    (``text[at - 1]``, neither a word character nor a backslash: ``_CUT_AFTER_RE``) and ``text[at]``."""
    if char.isspace():
        return _gap_is_free(text, at)
    if char in ".,/$+-\u2212{}" and _REWRITE_HEAD_RE.search(text, at, at + 6):
        return False  # what follows is read rewritten (1,1\\,00 as 1,100): judged on the raw text, unsure
    if char in ".,/$+-\u2212":
        return _number_free_after(text, at, char)
    if char in ":=*":  # in an answer marker ("**Answer:** C") or before a line's letter ("* C)")
        return not _in_marker(text, at) and not _in_indent(text, at)
    if char == "(":  # (C)
        return not ("A" <= text[at : at + 1] <= "Z")
    if char == "{":  # \frac{1}{2}
        return text[at - 2 : at - 1] != "}" and text[max(0, at - 5) : at] != "frac{"
    if char == "}":  # \frac{1}{2}
        return text[at : at + 1] != "{"
    return True


def _number_free_after(text: str, at: int, char: str) -> bool:
    """:func:`_free_after` of the characters numbers are written with besides digits."""
    if char == ".":  # a decimal point when a digit follows
        return not text[at : at + 1].isdigit()
    if char == ",":  # a thousands comma when three digits follow
        return not _THOUSANDS_RE.match(text, at)
    if char == "/":  # the slash of a fraction unless the number after it goes on to another
        return not _NUMERIC_RE.match(text, at) or bool(_CHAINED_RE.match(text, at))
    if char == "$":  # $5, $ 5, $\frac{1}{2}
        return not _AFTER_CURRENCY_RE.match(text, at)
    return not _AFTER_SIGN_RE.match(text, at)  # -5, -$5, -.5, -\frac{1}{2}


def _gap_is_free(text: str, at: int) -> bool:
    """Whether the run of spaces around ``text[at - 1]`` can be cut at ``at``: it is longer than any gap a
    construct spans, or no number or LaTeX head joins the characters on its two sides
    (:func:`_joined_across`); and no answer marker spans it, nor is it a line's indentation."""
    if _in_marker(text, at) or _in_indent(text, at):
        return False
    first = at - 1
    while first > 0 and at - first <= _GAP + 1 and text[first - 1].isspace():
        first -= 1
    end = _SPACES_RE.match(text, at, at + _GAP + 2).end()
    left, right = text[first - 1 : first], text[end : end + 1]
    if _REWRITE_HEAD_RE.match(text, end) or _rewritten_before(text, first) and right in _JOINS_LEFT:
        return False  # a side is read rewritten (\\text{5} / 3 as 5 / 3): judged on the raw text, unsure
    return end - first > _GAP or not _joined_across(left, right)


def _rewritten_before(text: str, at: int) -> bool:
    """Whether ``text[at - 1]`` may end LaTeX that reading rewrites (``\\,``, ``{,}``, ``\\text{5}``)."""
    return text[at - 2 : at - 1] == "\\" or text[at - 1 : at] == "}"


def _joined_across(left: str, right: str) -> bool:
    """Whether a number or a LaTeX head can hold ``left``, spaces, then ``right`` (either may be
    empty: the reply's edge)."""
    number = right[:1].isdigit() or right == "."
    joins = (
        left == "$" and (number or right == "\\"),  # $ 5, $ \frac{1}{2}
        left in ("/", "{") and number,  # 1 / 2, \frac{ 1 }{ 2 }
        right in ("/", "}") and left[:1].isdigit(),  # 1 / 2, \frac{1 }{2 }
        right == "{" and left[:1].isalpha(),  # \boxed {, \text {
    )
    return any(joins)


def _in_marker(text: str, at: int) -> bool:
    """Whether an answer marker ("answer is C", "**Answer:** (C)") that starts before ``at`` goes past it."""
    for word in _ANSWER_WORD_RE.finditer(text, max(0, at - _MARKER_REACH), at):
        marker = _MARKED_LETTER_RE.match(text, word.start())
        if marker and marker.end() > at:
            return True
    return False


def _in_indent(text: str, at: int) -> bool:
    """Whether ``at`` lies in the indentation of a line (spaces, tabs and ``*`` after a line break), where
    a letter opening the line ("  C) mall") is read."""
    newline = text.rfind("\n", max(0, at - _GAP - 2), at - 1)
    return newline >= 0 and not text[newline + 1 : at].strip(" \t*")


def _construct_spans(text: str, start: int) -> list[tuple[int, int]]:
    """``(first, end)`` of every complete box (at most ``MAX_BOX_CHARS`` inside) and of the LaTeX that
    reading rewrites (``\\text{}``, ``\\,``, ``{,}``, with the character after it) from ``start`` on,
    overlapping ones merged, in order: a reply is not cut inside one."""
    # reading drops LaTeX (\\text{5} is read 5, 1\\,000 1000): no cut right after it either
    spans = [(m.start(), m.end() + 1) for m in _REWRITTEN_RE.finditer(text, start)]
    spans += [(head, close + 1) for head, _, close, _ in _boxes(text, start)]
    merged: list[tuple[int, int]] = []
    for first, end in sorted(spans):
        if merged and first < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((first, end))
    return merged


def _inside(spans: list[tuple[int, int]], at: int) -> bool:
    """Whether one of the (disjoint, ordered) ``spans`` holds both ``text[at - 1]`` and ``text[at]``."""
    k = bisect.bisect_left(spans, (at, at))
    return k > 0 and spans[k - 1][0] < at < spans[k - 1][1]


def boxed_contents(text: str) -> list[str]:
    """Contents of the complete ``\\boxed{...}`` in ``text``, in order, nested braces matched.

    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. A box whose closing brace never comes (a
    truncated output such as ``\\boxed{12``) or comes after more than ``MAX_BOX_CHARS`` characters is
    not a box and is left out, and a box holding another box counts through the inner one
    (``\\boxed{x = \\boxed{5}}`` gives ``5``). One pass over the braces, so degenerate outputs
    ("\\boxed{\\boxed{\\boxed{...") stay linear; only the reply's tail is read (``reply_tail``).
    """
    return _boxed_contents(*_window(text))


def _boxed_contents(text: str, start: int = 0) -> list[str]:
    return [text[opened + 1 : close] for _, opened, close, holds in _boxes(text, start) if not holds]


def _boxes(text: str, start: int) -> list[tuple[int, int, int, bool]]:
    """``(head, opening brace, closing brace, holds a box)`` of each complete box of ``text`` from
    ``start`` on (at most ``MAX_BOX_CHARS`` inside), in the order they close."""
    heads = {m.end() - 1: m.start() for m in _BOX_HEAD_RE.finditer(text, start)}  # brace -> head
    if not heads:
        return []
    found: list[tuple[int, int, int, bool]] = []
    stack: list[list] = []  # [position of "{", whether a box closed inside it]
    # a brace's partner lies after it, so braces before the first box cannot change the result
    for m in _BRACE_RE.finditer(text, min(heads)):
        if m.group() == "{":
            stack.append([m.start(), False])
        elif stack:
            opened, holds_box = stack.pop()
            is_box = opened in heads and m.start() - opened - 1 <= MAX_BOX_CHARS
            if is_box:
                found.append((heads[opened], opened, m.start(), holds_box))
            if (is_box or holds_box) and stack:
                stack[-1][1] = True
    return found


def parse_number_answer(text: str, question: str = "") -> str | None:
    """The numeric answer stated in ``text`` (GSM8K and arithmetic rule): :func:`read_number_answer`'s."""
    return read_number_answer(text, question).answer


def read_number_answer(text: str, question: str = "") -> Reading:
    """The numeric answer stated in ``text``, a reply to ``question`` (its text), and its form.

    1. The last ``\\boxed{...}`` that contains a number wins; inside it the last number counts
       (``\\boxed{x = 5}`` -> 5, ``\\boxed{18 \\text{ dollars}}`` -> 18): form ``box``. Empty or
       non-numeric boxes (a model echoing "\\boxed{}") are skipped; unclosed boxes do not count.
    2. Otherwise the last number anywhere in the text: form ``stated``. No number at all gives None
       (form ``none``).
    3. The number so found is refused (None, form ``restatement``) when it is an operation on the
       question's own numbers (:func:`question_operands`) with no result after it: the fraction
       ``252 / 6``, ``252/6``, ``\\frac{252}{6}``, ``\\boxed{252/6}``, or ``252 \\div 6``, ``7 x 1``,
       ``37 + 45``, ``2 + 3 * 4``, ``(36)/(6)`` (any of ``+ - * x / : ÷ × ·``, ``\\times \\div \\cdot``,
       "plus", "minus", "times", "over", "divided by", "multiplied by"; brackets around the operands)
       for "What is 252 / 6?" and the like, the question re-typed included. ``252 / 6 = 42`` states 42;
       a fraction whose parts are not both the question's numbers (a GSM8K answer of 3/4) reads as its
       value. Without ``question`` nothing is refused.

    Only the reply's tail is read (``reply_tail``); the restatement check looks at most
    ``_OPERATION_REACH`` characters around the one number that decides.
    """
    operands = question_operands(question) if question else frozenset()
    window, start = _window(text)
    for content in reversed(_boxed_contents(window, start)):
        reading = _read_number(content, 0, operands, FORM_BOX)
        if reading is not None:
            return reading
    return _read_number(window, start, operands, FORM_STATED) or Reading(None, FORM_NONE)


# "answer is", "Answer:", "**Final answer:**", "the answer would be": what precedes a marked answer
_ANSWER_IS = (  # one quantifier per gap, so long runs of spaces cannot backtrack badly
    rf"(?i:\banswer)[*\s]{{0,{_GAP}}}(?:(?i:is|would\s{{1,{_GAP}}}be|should\s{{1,{_GAP}}}be|must\s{{1,{_GAP}}}be)|:|=)"
    rf"[*\s:]{{0,{_GAP}}}"
)
# "answer is C", "Answer: (C)", "**Final answer:** C", "the answer would be C."
_MARKED_LETTER_RE = re.compile(_ANSWER_IS + r"\(?([A-Z])\)?(?![\w'])")
# "(C)" not glued to a word, or "C)" opening a line (how small models often answer: "C) mall")
_PAREN_LETTER_RE = re.compile(rf"(?<!\w)\(([A-Z])\)|^[ \t*]{{0,{_GAP}}}([A-Z])\)", re.MULTILINE)
_LONE_LETTER_RE = re.compile(r"\(?([A-Z])\)?[.)]?")  # the whole reply, padding aside, is one letter
#: what may surround a lone letter: "*" and every character ``\s`` matches
_PADDING = "*" + "".join(re.findall(r"\s", "".join(map(chr, range(0x3001)))))
_BOXED_LETTER_RE = re.compile(r"\(?([A-Za-z])\)?\.?")


def parse_choice(text: str, letters: Sequence[str] | str) -> str | None:
    """The option letter chosen in ``text``, among ``letters`` (e.g. "ABCDE"), or None: :func:`read_choice`'s."""
    return read_choice(text, letters).answer


def read_choice(text: str, letters: Sequence[str] | str) -> Reading:
    """The option letter chosen in ``text``, among ``letters`` (e.g. "ABCDE"), and its form.

    Tiers, first that yields an offered letter wins; within a tier the last occurrence wins:

    1. ``\\boxed{C}`` (also ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``, lower case accepted);
    2. a marked answer: "answer is C", "Answer: (C)", "final answer: **C**" (upper case), or a
       reply that is nothing but one letter ("C", "C.", "(C)");
    3. a parenthesized upper-case letter ``(C)`` not glued to a word ("option(s)" is no letter),
       or an upper-case letter with a closing parenthesis opening a line ("C) mall").

    Bare letters in prose ("I think", "A good point") never count, and letters outside
    ``letters`` are ignored, so "(F)" on a five-option question is not an answer. The form is ``box``
    for tier 1, ``letter`` otherwise; a tier that names every offered option (of two or more), as a
    reply listing "(A) (B) (C) (D)" or re-typing the question does, gives no letter (form
    ``all_options``); nothing found gives form ``none``. Only the reply's tail is read (``reply_tail``).
    """
    window, start = _window(text)
    offered = set(letters)
    # is the whole reply, padding aside, one letter? (not if its tail holds more: the cheap test first)
    core = _unpadded(text) if len(_unpadded(window)) <= 4 else ""
    tiers = (
        [
            m.group(1).upper()
            for c in _boxed_contents(window, start)
            if (m := _BOXED_LETTER_RE.fullmatch(_strip_box(c)))
        ],
        _MARKED_LETTER_RE.findall(window, start)
        + [m.group(1) for m in [_LONE_LETTER_RE.fullmatch(core)] if m],
        [m.group(1) or m.group(2) for m in _PAREN_LETTER_RE.finditer(window, start)],
    )
    for tier, found in enumerate(tiers):
        valid = [x for x in found if x in offered]
        if len(offered) > 1 and offered.issubset(valid):
            return Reading(None, FORM_ALL_OPTIONS)
        if valid:
            return Reading(valid[-1], FORM_BOX if tier == 0 else FORM_LETTER)
    return Reading(None, FORM_NONE)


def _unpadded(text: str) -> str:
    """``text`` without the spaces and ``*`` around it (plain spaces first: the fast case)."""
    text = text.strip()
    return text.strip(_PADDING) if text[:1] == "*" or text[-1:] == "*" else text


def _strip_box(content: str) -> str:
    return _clean_latex(content).replace(" ", "").strip()


def _clean_latex(text: str) -> str:
    text = _LATEX_WRAPPER_RE.sub(r"\1", text)
    return _LATEX_SPACE_RE.sub("", text.replace("{,}", ","))


#: the most words of a marked or emphasized text answer ("the answer is ...", ``**...**``); more is prose
MAX_ANSWER_WORDS = 6
#: the most words of a final line read as the answer when nothing marks one ("Green.")
MAX_LINE_WORDS = 3
#: the most characters read after an answer marker or inside ``**...**``
_MAX_PHRASE_CHARS = 120
# the phrase after "answer is" (a look-ahead, so a marker inside it is found too); not "answer isn't"
_MARKED_TEXT_RE = re.compile(_ANSWER_IS + rf"(?<![\w'])(?=([^\n]{{1,{_MAX_PHRASE_CHARS}}}))")
# where a marked phrase ends: sentence punctuation before a space or the end, or closing bold
_PHRASE_END_RE = re.compile(r"[.!?;,:](?=\s|$)|\*\*")
_BOLD_RE = re.compile(rf"\*\*([^*\n]{{1,{_MAX_PHRASE_CHARS}}})\*\*")
_WORD_RE = re.compile(r"\w")
_ARTICLES = ("a", "an", "the")
#: what surrounds a text answer without being part of it: spaces, punctuation, quotes, brackets, markdown
_TEXT_EDGES = " .,;:!?*_`\"'()[]{}<>\u00ab\u00bb\u201c\u201d\u2018\u2019\u201e"


def normalize_text(text: str) -> str:
    """``text`` as a text answer is compared: NFKC-normalized (full-width letters, ligatures), case-folded,
    runs of spaces made one, the punctuation, quotes, brackets and markdown (``*``, ``_``, backticks)
    around it dropped, and leading articles (a, an, the) dropped while words follow them. "The **Green**."
    and "green" both give "green"; inner punctuation stays ("blue-green", "3.5")."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    words = " ".join(folded.split()).strip(_TEXT_EDGES).split(" ")
    first = 0
    while first < len(words) - 1 and words[first] in _ARTICLES:  # "the 'Green'", "a the green": "green"
        first += 1
    return " ".join(words[first:]).strip(_TEXT_EDGES)


def parse_text_answer(text: str) -> str | None:
    """The short text answer stated in ``text``, or None: :func:`read_text_answer`'s."""
    return read_text_answer(text).answer


def read_text_answer(text: str) -> Reading:
    """The short text answer stated in ``text``, through :func:`normalize_text`, and its form (``box``
    for tier 1, ``stated`` for the others, ``none`` without an answer).

    Tiers, the first that yields an answer wins; within a tier the last occurrence wins:

    1. the last ``\\boxed{...}`` with a word in it (``\\boxed{\\text{Green}}`` reads "green");
    2. a marked answer: "the answer is green", "Final answer: **green**", "answer = green", up to the
       end of its sentence or clause (".", ",", ";", "!", "?" or ":" before a space, closing ``**``, the
       line's end) and at most ``MAX_ANSWER_WORDS`` words;
    3. a bold phrase ``**green**`` of at most ``MAX_ANSWER_WORDS`` words in the reply's last line
       ("Mixing blue and yellow gives **green**.");
    4. the last line itself when it has at most ``MAX_LINE_WORDS`` words and does not end with ":"
       (a reply that ends "Green." or is just "green").

    An answer needs a letter or digit. Only the reply's tail is read (``reply_tail``), and every
    pattern reads at most a bounded phrase per marker, so a parse stays linear in the tail.
    """
    window, start = _window(text)
    for content in reversed(_boxed_contents(window, start)):
        answer = _text_answer(content, words=None)
        if answer is not None:
            return Reading(answer, FORM_BOX)
    for m in reversed(list(_MARKED_TEXT_RE.finditer(window, start))):
        phrase = m.group(1)
        end = _PHRASE_END_RE.search(phrase)
        answer = _text_answer(phrase[: end.start()] if end else phrase, words=MAX_ANSWER_WORDS)
        if answer is not None:
            return Reading(answer, FORM_STATED)
    tail = window[start:].rstrip()
    last_line = tail[tail.rfind("\n") + 1 :]
    for m in reversed(list(_BOLD_RE.finditer(last_line))):
        answer = _text_answer(m.group(1), words=MAX_ANSWER_WORDS)
        if answer is not None:
            return Reading(answer, FORM_STATED)
    if last_line.endswith(":"):
        return Reading(None, FORM_NONE)
    return Reading.of(_text_answer(last_line, words=MAX_LINE_WORDS), FORM_STATED)


def _text_answer(phrase: str, words: int | None) -> str | None:
    """``phrase`` normalized (LaTeX wrappers read first) when it holds a word character and, unless
    ``words`` is None, at most ``words`` words (as written, articles counted) and ``_MAX_PHRASE_CHARS``
    characters; else None."""
    if words is not None and (len(phrase) > _MAX_PHRASE_CHARS or len(phrase.split()) > words):
        return None
    answer = normalize_text(_clean_latex(phrase))
    return answer if _WORD_RE.search(answer) else None
