"""The ``exact`` and ``f1`` rewards; a list/tuple label means "any of these" (best score wins).

``exact`` reads the final answer (``slime.rl.rewards.extract.final_answer``): 1.0 when equal after
strip, lowercase, collapsed whitespace, no ``$`` and no trailing period. ``f1`` scores as THUDM/slime's
``--rm-type f1`` (``rm_hub/f1.py`` at 624b824): SQuAD token F1 of the *whole* response and the label
(lowercase, no punctuation or articles, whitespace split, multiset F1); 0.0 when no token is shared
(two empty sides included) and when either side is ``yes``/``no``/``noanswer`` and they differ.
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


_CLOSED = frozenset({"yes", "no", "noanswer"})  # a closed answer earns nothing for partial overlap


def f1_score(prediction: str, reference: str) -> float:
    p, g = normalize_squad(prediction), normalize_squad(reference)
    if (p in _CLOSED or g in _CLOSED) and p != g:
        return 0.0
    pred, gold = p.split(), g.split()
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


async def exact_reward(sample: Sample) -> float:
    answer = normalize_text(final_answer(sample.response))
    return float(any(answer == normalize_text(g) for g in labels_of(sample.label, "exact")))


async def f1_reward(sample: Sample) -> float:
    return max(f1_score(sample.response, g) for g in labels_of(sample.label, "f1"))
