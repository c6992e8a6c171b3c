"""The ``deepscaler`` reward: 1.0 for a correct ``\\boxed{}`` answer *after the thinking*, else 0.0.

The format rules are THUDM/slime's ``--rm-type deepscaler`` (``rm_hub/deepscaler.py``, read at 624b824):

1. the solution is the text after the last ``</think>``; without one, the text between the first and
   the second ``###Response``; with neither the score is 0 (an answer given while still thinking, or
   a response cut off before ``</think>``, earns nothing);
2. the answer is the content of the last ``\\boxed{...}`` of the solution (nested braces allowed);
   no box, an unclosed one, ``\\boxed 5`` without braces or only ``\\fbox`` -> 0. There is no
   fall-back to the last number (unlike ``math``);
3. an empty label scores 0; a label holding ``\\boxed{...}`` is compared by that box's content.
   A list label means "any of these".

Grading (not slime's): the answer and label are compared with :func:`slime.rl.rewards.math_answer.
math_equal` (normalised strings, exact fractions). slime also accepts answers that are equal only under
sympy simplification (``2\\sqrt{2}`` vs ``\\sqrt{8}``) or after its unit stripping; those score 0 here.
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
