"""From model text to normalized answers: numbers, ``\\boxed{...}`` contents, option letters.

Every parser returns a normalized string or ``None`` (SPEC sections 1 and 6):

- numbers are canonical decimals, ``canonical_number``: rounded to 6 decimal places, no trailing
  zeros, no ``.0``, no ``+``, never ``-0`` ("1000", "-3", "12.5", "0.333333"). Two numbers that
  agree to 6 decimals therefore give the same string, so string equality is numeric comparison
  with a 1e-6 tolerance, and answers hash and serialize consistently.
- option letters are single upper-case letters "A".."Z".

Model output can be any length (a server behind the openai backend can send megabytes), so the time
of a parse is bounded: a reply is read from its last ``MAX_REPLY_CHARS`` characters (where a final
answer stands; the cut moves forward to a space so no word or number is split), every pattern scans
in linear time, and only the numbers that decide the answer are converted.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from fractions import Fraction

#: option letters in order; a multiple-choice question uses the first len(options) of them
LETTERS = string.ascii_uppercase
_SCALE = 10**6  # 6 decimal places
_MAX_DIGITS = 100  # longer numbers are not answers (see canonical_number)
_MAX_VALUE = 10**_MAX_DIGITS
#: a reply is parsed from its last this many characters (about 2k tokens; see the module docstring)
MAX_REPLY_CHARS = 8_192
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
        \\[dt]?frac\{{\s*(?P<fn>{_NUM})\s*\}}\{{\s*(?P<fd>{_NUM})\s*\}}   # \frac{{a}}{{b}}
      | (?P<n>{_NUM})(?:\s?/\s?(?P<d>{_NUM}))?                          # a or a/b
    )
    (?!\d|\.\d)                                 # nor the head of 1.2.3
    """,
    re.VERBOSE,
)
# LaTeX that wraps or spaces numbers: \text{...} and friends keep their content; thin spaces go.
_LATEX_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LATEX_SPACE_RE = re.compile(r"\\[,!;: ]")
_SPACE_RE = re.compile(r"\s")
_DIGITS_RE = re.compile(r"[\d.,]*")
_BRACE_RE = re.compile(r"[{}]")
# Characters a human writes around a number that carry no value (normalize_number only).
_NUMBER_NOISE_RE = re.compile(r"[\s,$%]|\\\$|\\%")


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
    prefixes, fractions ``a/b`` and ``\\frac{a}{b}`` (read as their value; ``x/0`` is skipped).
    A percent sign is ignored ("50%" gives 50). Digits glued after letters ("x2") do not count.
    Only the reply's tail is read (``reply_tail``).
    """
    numbers = (_match_number(m) for m in _NUMBER_RE.finditer(_clean_latex(reply_tail(text))))
    return [n for n in numbers if n is not None]


def _match_number(m: re.Match) -> str | None:
    """The canonical number of one ``_NUMBER_RE`` match (None for ``x/0``)."""
    num, den = (m["fn"], m["fd"]) if m["fn"] is not None else (m["n"], m["d"])
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
    for m in reversed(list(_NUMBER_RE.finditer(_clean_latex(reply_tail(text))))):
        number = _match_number(m)
        if number is not None:
            return number
    return None


def reply_tail(text: str) -> str:
    """The part of a reply the parsers read: all of it, or its last ``MAX_REPLY_CHARS`` characters. The
    cut moves forward to just after a whitespace character near it (so no word or number is split),
    else past the digits it falls in (so a number it splits is not read as a shorter one)."""
    if len(text) <= MAX_REPLY_CHARS:
        return text
    cut = len(text) - MAX_REPLY_CHARS
    space = _SPACE_RE.search(text, cut, cut + 256)
    return text[space.end() if space else _DIGITS_RE.match(text, cut).end() :]


def boxed_contents(text: str) -> list[str]:
    """Contents of the complete ``\\boxed{...}`` in ``text``, in order, nested braces matched.

    ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``. A box whose closing brace never comes (a
    truncated output such as ``\\boxed{12``) is not a box and is left out, and a box holding
    another box counts through the inner one (``\\boxed{x = \\boxed{5}}`` gives ``5``). One pass
    over the braces, so degenerate outputs ("\\boxed{\\boxed{\\boxed{...") stay linear; only the
    reply's tail is read (``reply_tail``).
    """
    text = reply_tail(text)
    box_braces = {m.end() - 1 for m in re.finditer(r"\\boxed\s*\{", text)}  # where each box opens
    if not box_braces:
        return []
    found: list[str] = []
    stack: list[list] = []  # [position of "{", whether a box closed inside it]
    # a brace's partner lies after it, so braces before the first box cannot change the result
    for m in _BRACE_RE.finditer(text, min(box_braces)):
        if m.group() == "{":
            stack.append([m.start(), False])
        elif stack:
            opened, holds_box = stack.pop()
            is_box = opened in box_braces
            if is_box and not holds_box:
                found.append(text[opened + 1 : m.start()])
            if (is_box or holds_box) and stack:
                stack[-1][1] = True
    return found


def parse_number_answer(text: str) -> str | None:
    """The numeric answer stated in ``text`` (GSM8K and arithmetic rule).

    1. The last ``\\boxed{...}`` that contains a number wins; inside it the last number counts
       (``\\boxed{x = 5}`` -> 5, ``\\boxed{18 \\text{ dollars}}`` -> 18). Empty or non-numeric boxes
       (a model echoing "\\boxed{}") are skipped; unclosed boxes do not count.
    2. Otherwise the last number anywhere in the text. No number at all gives None.

    Only the reply's tail is read (``reply_tail``).
    """
    text = reply_tail(text)
    for content in reversed(boxed_contents(text)):
        number = last_number(content)
        if number is not None:
            return number
    return last_number(text)


# "answer is C", "Answer: (C)", "**Final answer:** C", "the answer would be C."
_MARKED_LETTER_RE = re.compile(  # one quantifier per gap, so long runs of spaces cannot backtrack badly
    r"(?i:\banswer)[*\s]*(?:(?i:is|would\s+be|should\s+be|must\s+be)|:|=)[*\s:]*\(?([A-Z])\)?(?![\w'])"
)
# "(C)" not glued to a word, or "C)" opening a line (how small models often answer: "C) mall")
_PAREN_LETTER_RE = re.compile(r"(?<!\w)\(([A-Z])\)|^[ \t*]*([A-Z])\)", re.MULTILINE)
_LONE_LETTER_RE = re.compile(r"[\s*]*\(?([A-Z])\)?[.)]?[\s*]*")  # the whole reply is one letter
_BOXED_LETTER_RE = re.compile(r"\(?([A-Za-z])\)?\.?")


def parse_choice(text: str, letters: Sequence[str] | str) -> str | None:
    """The option letter chosen in ``text``, among ``letters`` (e.g. "ABCDE"), or None.

    Tiers, first that yields an offered letter wins; within a tier the last occurrence wins:

    1. ``\\boxed{C}`` (also ``\\boxed{(C)}``, ``\\boxed{\\text{C}}``, lower case accepted);
    2. a marked answer: "answer is C", "Answer: (C)", "final answer: **C**" (upper case), or a
       reply that is nothing but one letter ("C", "C.", "(C)");
    3. a parenthesized upper-case letter ``(C)`` not glued to a word ("option(s)" is no letter),
       or an upper-case letter with a closing parenthesis opening a line ("C) mall").

    Bare letters in prose ("I think", "A good point") never count, and letters outside
    ``letters`` are ignored, so "(F)" on a five-option question is not an answer. Only the reply's
    tail is read (``reply_tail``).
    """
    text = reply_tail(text)
    offered = set(letters)
    tiers = (
        [
            m.group(1).upper()
            for c in boxed_contents(text)
            if (m := _BOXED_LETTER_RE.fullmatch(_strip_box(c)))
        ],
        _MARKED_LETTER_RE.findall(text) + [m.group(1) for m in [_LONE_LETTER_RE.fullmatch(text)] if m],
        [m.group(1) or m.group(2) for m in _PAREN_LETTER_RE.finditer(text)],
    )
    for found in tiers:
        valid = [x for x in found if x in offered]
        if valid:
            return valid[-1]
    return None


def _strip_box(content: str) -> str:
    return _clean_latex(content).replace(" ", "").strip()


def _clean_latex(text: str) -> str:
    text = _LATEX_WRAPPER_RE.sub(r"\1", text)
    return _LATEX_SPACE_RE.sub("", text.replace("{,}", ","))
