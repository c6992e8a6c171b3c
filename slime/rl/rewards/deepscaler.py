"""The ``deepscaler`` reward: 1.0 for a correct ``\\boxed{}`` answer *after the thinking*, else 0.0.

Format rules as THUDM/slime's ``--rm-type deepscaler`` (``rm_hub/deepscaler.py`` at 624b824): the
solution follows the last ``</think>`` (or sits between the first two ``###Response``), the answer
is its last ``\\boxed{...}``, with no fall-back to the last number; an empty label scores 0 and a
list label means "any of these". Grading is not slime's: :func:`slime.rl.rewards.math_answer.
math_equal` (normalised strings, exact fractions), so answers slime accepts only via sympy or unit
stripping (``2\\sqrt{2}`` vs ``\\sqrt{8}``) score 0 here.
"""

from __future__ import annotations

from slime.rl.rewards.extract import labels_of
from slime.rl.rewards.math_answer import math_equal
from slime.rl.sample import Sample

__all__ = ["deepscaler_reward", "deepscaler_score", "last_boxed"]

_BOX = "\\boxed{"


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (slime's strict reading: braces right after the command)."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                span = text[start : i + 1]
                return span[len(_BOX) : -1] if span.startswith(_BOX) else None
    return None  # never closed: a truncated response


def _solution(response: str) -> str | None:
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "###Response" in response:
        return response.split("###Response")[1]
    return None


def deepscaler_score(response: str, label: object) -> float:
    solution = _solution(response)
    answer = last_boxed(solution) if solution is not None else None
    if answer is None:
        return 0.0
    golds = []
    for gold in labels_of(label, "deepscaler"):
        if "\\boxed" in gold:
            gold = last_boxed(gold)
        if gold:  # an empty label, or a label whose box cannot be read, matches nothing
            golds.append(gold)
    return float(any(math_equal(answer, gold) for gold in golds))


async def deepscaler_reward(sample: Sample) -> float:
    return deepscaler_score(sample.response, sample.label)
