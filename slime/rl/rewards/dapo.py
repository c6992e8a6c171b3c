"""The ``dapo`` reward: +1.0 when the last ``Answer: ...`` line matches the integer label, else -1.0.

Scores as THUDM/slime's ``--rm-type dapo`` (``rm_hub/math_dapo_utils.py`` at 624b824, with
``--reward-key score``), so imported DAPO recipes train on the same signal: only the response's
tail is read; the answer follows the last ``Answer:``; both sides are normalised the Minerva way
(:func:`normalize_final_answer`) and compared as integers. The score is **-1.0**, not 0.0, for a
wrong or missing answer; a list label means "any of these". A non-numeric label raises
``ValueError`` naming it (slime crashes there too).
"""

from __future__ import annotations

import re

from slime.rl.rewards.extract import labels_of
from slime.rl.sample import Sample

__all__ = ["dapo_reward", "dapo_score", "normalize_final_answer"]

_TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# The Minerva normalisation rules: plain substitutions in order, then words/units that are removed.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
    "<|im_end|>",
    "<|endoftext|>",
)
_UNWRAP = [re.compile(r"\\" + cmd + r"\{(.*?)\}") for cmd in ("text", "textbf", "overline")]


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (see the module docstring)."""
    s = str(answer).split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for word in _REMOVED:
        s = s.replace(word, "")
    s = re.sub(r"(.*?)\$(.*?)\$(.*)", r"$\2$", s)  # keep only the first $...$ of a line
    for pattern in _UNWRAP:
        s = pattern.sub(r"\1", s)
    s = re.sub(r"\\boxed\{(.*)\}", r"\1", s)  # greedy: the outermost box
    s = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", s)  # \frac12 -> \frac{1}{2}
    s = re.sub(r"sqrt([^{])", r"sqrt{\1}", s)  # \sqrt3 -> \sqrt{3}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _integer_label(label: str) -> str:
    text = normalize_final_answer(label)
    try:
        return str(int(float(text)))
    except (ValueError, OverflowError):
        raise ValueError(
            f"the 'dapo' reward compares integer answers, but the label {label!r} is not a number; "
            "use reward.type math (or a custom reward) for this data"
        ) from None


def dapo_score(response: str, label: object) -> float:
    """+1.0 if the response's last ``Answer:`` equals the integer label (any of a list), else -1.0."""
    found = _ANSWER.findall(response[-_TAIL_CHARS:])
    prediction = normalize_final_answer(found[-1] if found else "[INVALID]")
    golds = [_integer_label(g) for g in labels_of(label, "dapo")]
    return 1.0 if prediction in golds else -1.0


async def dapo_reward(sample: Sample) -> float:
    return dapo_score(sample.response, sample.label)
