"""The ``math`` reward: 1.0 when the final answer matches the label, else 0.0.

The answer is the last ``\\boxed{...}``, else the last number; a boxed label is read by its box
and an empty label matches nothing (as slime). Both sides are normalised, then compared as strings
and as exact :class:`fractions.Fraction` values (``0.5 == \\frac{1}{2}``; no float tolerance).
Deliberately unlike slime's ``--rm-type math`` (``rm_hub/math_utils.py`` at 624b824): a response
without a box is read by its last number (slime: 0), and there is no sympy step, so answers equal
only symbolically (``2\\sqrt{2}`` vs ``\\sqrt{8}``) score 0 -- sympy can hang on model output; the
importer prints this difference. Use a ``custom`` reward for symbolic grading.
"""

from __future__ import annotations

import re
from fractions import Fraction

from slime.rl.rewards.extract import extract_boxed, extract_last_number, labels_of, read_group
from slime.rl.sample import Sample

__all__ = ["extract_math_answer", "math_equal", "math_reward", "normalize_math", "to_fraction", "unbox_label"]

_DROP = (
    "\\left",
    "\\right",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\displaystyle",
    "$",
    "^\\circ",
    "^{\\circ}",
    "\\%",
    "%",
)
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SIMPLE_PARENS = re.compile(r"\((-?[^()+\-*/^,=]+)\)")
_NUMERIC = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")


def _fracs_to_slash(s: str) -> str:
    out: list[str] = []
    i = 0
    while True:
        k = s.find("\\frac", i)
        if k < 0:
            out.append(s[i:])
            return "".join(out)
        out.append(s[i:k])
        num = read_group(s, k + len("\\frac"))
        den = read_group(s, num[1]) if num else None
        if num is None or den is None:  # malformed: leave the rest as written
            out.append(s[k:])
            return "".join(out)
        out.append(f"({num[0]})/({den[0]})")
        i = den[1]


def normalize_math(answer: str) -> str:
    s = answer.strip()
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    for token in _DROP:
        s = s.replace(token, "")
    s = _WRAPPERS.sub(r"\1", s)
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5"
    s = _fracs_to_slash(s)
    s = re.sub(r"\s+", "", s)
    s = _THOUSANDS.sub("", s)
    s = _SIMPLE_PARENS.sub(r"\1", s)  # (3)/(4) -> 3/4
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    s = re.sub(r"(\d+)\.0+(?!\d)", r"\1", s)  # 2.0 -> 2
    return s


def to_fraction(s: str) -> Fraction | None:
    """``"3"``, ``"-0.25"``, ``"3/4"``, ``"1.5/3"`` -> Fraction; anything else -> None."""
    num, sep, den = s.partition("/")
    if not _NUMERIC.fullmatch(num) or (sep and not _NUMERIC.fullmatch(den)):
        return None
    value = Fraction(num)
    if sep:
        d = Fraction(den)
        if d == 0:
            return None
        value /= d
    return value


def math_equal(prediction: str, reference: str) -> bool:
    p, r = normalize_math(prediction), normalize_math(reference)
    if p == r:
        return bool(p)
    fp, fr = to_fraction(p), to_fraction(r)
    return fp is not None and fp == fr


def extract_math_answer(response: str) -> str | None:
    boxed = extract_boxed(response)
    return boxed if boxed is not None else extract_last_number(response)


async def math_reward(sample: Sample) -> float:
    answer = extract_math_answer(sample.response)
    if answer is None:
        return 0.0
    return float(any(math_equal(answer, gold) for gold in map(unbox_label, labels_of(sample.label, "math"))))


def unbox_label(gold: str) -> str:
    """A label written as ``\\boxed{42}`` means ``42`` (slime unwraps it too); an unreadable box, ``""``."""
    if "\\boxed" not in gold:
        return gold
    return extract_boxed(gold) or ""
