"""The ``gpqa`` reward: 1.0 when the response picks the correct multiple-choice option, else 0.0.

Scores as THUDM/slime's ``--rm-type gpqa`` (``rm_hub/gpqa.py`` at 624b824): the text after the last
``</think>`` is read; the chosen letter is the first "answer/option/choice (is|:) X", "X is (the)
correct" or "final answer X" (case-insensitive), else the last standalone capital; the correct letter
comes from ``metadata`` (``correct_letter``, ``valid_letters``, ``choices``) or the label (a letter, an
index, or an option's text). Without both letters it falls back to finding the correct option's
normalised text in the response. Written from slime's rules, not its code; the tests pin the cases.
"""

from __future__ import annotations

import re
import string
from typing import Any

from slime.rl.sample import Sample

__all__ = ["chosen_letter", "gpqa_reward", "gpqa_score"]

_LETTER_PATTERNS = (
    re.compile(r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
    re.compile(r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)", re.IGNORECASE),
    re.compile(r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])", re.IGNORECASE),
)
_STANDALONE = re.compile(r"\b([A-Z])\b")


def _after_thinking(text: str) -> str:
    return text.rsplit("</think>", 1)[-1] if text else ""


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def chosen_letter(response: str, valid: list[str]) -> str | None:
    """The option letter the response picks, or None. A pattern whose letter is not valid is passed over."""
    text = _after_thinking(response)
    for pattern in _LETTER_PATTERNS:
        m = pattern.search(text)  # the first match of each pattern, in this order
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(_STANDALONE.findall(text)):
        if letter in valid:
            return letter
    return None


def _options(metadata: dict[str, Any]) -> tuple[list[Any] | None, list[str]]:
    choices = metadata.get("choices")
    if isinstance(choices, dict):
        choices = list(choices.values())
    elif choices is not None:
        choices = list(choices)
    if metadata.get("valid_letters"):
        valid = [str(x).upper() for x in metadata["valid_letters"]]
    else:
        valid = list(string.ascii_uppercase[: len(choices) if choices else 10])
    return choices, valid


def _correct_letter(label: Any, metadata: dict[str, Any], choices: list[Any] | None, valid: list[str]) -> str | None:
    given = metadata.get("correct_letter")
    correct = given.strip().upper() if isinstance(given, str) else None
    if isinstance(label, str):
        text = label.strip()
        if len(text) == 1 and text.upper() in valid and not correct:
            correct = text.upper()
        if not correct and choices and text:
            for i, choice in enumerate(choices):
                if _norm(str(choice)) == _norm(text):
                    return valid[i]
    elif isinstance(label, (int, float)) and 0 <= int(label) < len(valid):
        correct = valid[int(label)]  # an index label wins over metadata's letter, as in slime
    return correct


def gpqa_score(response: str | None, label: Any, metadata: dict[str, Any] | None = None) -> float:
    if response is None:
        return 0.0
    metadata = metadata or {}
    choices, valid = _options(metadata)
    correct = _correct_letter(label, metadata, choices, valid)
    label_text = label.strip() if isinstance(label, str) else None
    picked = chosen_letter(response, valid)
    if picked and correct:
        return float(picked == correct)
    targets: list[str] = []
    if correct and choices and correct in valid and valid.index(correct) < len(choices):
        targets.append(str(choices[valid.index(correct)]))
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    if label_text:
        targets.append(label_text)
    body = _norm(_after_thinking(response))
    if any(_norm(t) and _norm(t) in body for t in targets):
        return 1.0
    if picked and not correct and label_text:
        return float(picked == label_text.upper())
    return 0.0


async def gpqa_reward(sample: Sample) -> float:
    return gpqa_score(sample.response, sample.label, sample.metadata)
