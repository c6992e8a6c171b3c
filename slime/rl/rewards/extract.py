"""Pulling the final answer out of a model response (pure string code, no deps).

:func:`extract_boxed` (the last ``\\boxed{...}``/``\\fbox{...}``, nested braces; ``None`` when absent
or unclosed), :func:`extract_last_number` (sign and commas kept for the normaliser),
:func:`final_answer` (boxed, else after the last ``####``, else after ``answer is``/``answer:``,
else the whole response, stripped) and :func:`read_group` (one TeX argument).
"""

from __future__ import annotations

import re

__all__ = ["extract_boxed", "extract_last_number", "final_answer", "labels_of", "read_group"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?", re.IGNORECASE)


def read_group(text: str, i: int) -> tuple[str, int] | None:
    """Read one TeX argument at ``text[i]`` (after spaces): ``(content, index after it)``."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        return text[i], i + 1
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j], j + 1
    return None  # unbalanced


def extract_boxed(text: str) -> str | None:
    start, cmd = max((text.rfind(cmd), cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(cmd)
    j = i
    while j < len(text) and text[j] == " ":
        j += 1
    if j < len(text) and text[j] == "{":
        group = read_group(text, j)
        return None if group is None else group[0].strip()
    if j > i:  # "\boxed 5": the argument runs to the next space or '$'
        m = re.match(r"[^\s$]+", text[j:])
        return m.group(0) if m else None
    return None


def extract_last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def final_answer(response: str) -> str:
    boxed = extract_boxed(response)
    if boxed is not None:
        return boxed
    if "####" in response:
        return response.rsplit("####", 1)[1].strip()
    matches = list(_ANSWER_IS.finditer(response))
    if matches:
        tail = response[matches[-1].end() :].strip()
        return tail.splitlines()[0].strip() if tail else ""
    return response.strip()


def labels_of(label: object, reward_name: str) -> list[str]:
    """The label as a list of acceptable answers (a list/tuple label means "any of these")."""
    if label is None:
        raise ValueError(
            f"the {reward_name!r} reward needs sample.label (the reference answer), but it is None;"
            " "
            "set the dataset's label key or use a reward type that needs no label"
        )
    items = label if isinstance(label, (list, tuple)) else [label]
    if not items:
        raise ValueError(f"the {reward_name!r} reward got an empty list as sample.label; give at least one answer")
    return [str(x) for x in items]
