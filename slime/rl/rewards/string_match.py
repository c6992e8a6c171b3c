"""The ``exact`` and ``f1`` rewards, both on the response's final answer.

The answer is ``slime.rl.rewards.extract.final_answer``; a list/tuple label means "any of these"
(best score wins). ``exact``: 1.0 when equal after strip, lowercase, collapsed whitespace, no ``$``
and no trailing period. ``f1``: SQuAD token F1 (lowercase, no punctuation or articles, whitespace
split, multiset F1); two empty answers score 1.0, one empty answer 0.0.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from slime.rl.rewards.extract import final_answer, labels_of
from slime.rl.sample import Sample

__all__ = ["exact_reward", "f1_reward", "f1_score", "normalize_squad", "normalize_text"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_text(text: str) -> str:
    s = " ".join(text.replace("$", "").split()).lower()
    return s.rstrip(".").strip()


def normalize_squad(text: str) -> str:
    s = text.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def f1_score(prediction: str, reference: str) -> float:
    pred = normalize_squad(prediction).split()
    gold = normalize_squad(reference).split()
    if not pred or not gold:
        return float(pred == gold)
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


async def exact_reward(sample: Sample) -> float:
    answer = normalize_text(final_answer(sample.response))
    return float(any(answer == normalize_text(g) for g in labels_of(sample.label, "exact")))


async def f1_reward(sample: Sample) -> float:
    answer = final_answer(sample.response)
    return max(f1_score(answer, g) for g in labels_of(sample.label, "f1"))
