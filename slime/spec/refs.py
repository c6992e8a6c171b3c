"""``${runs.STEP.OUTPUT}``: a chain step's reference to an earlier step's output, in any string value.

:func:`find_refs` lists the references of a spec's data (after ``--set``); :func:`substitute` fills
them in. Guaranteed: a malformed ``${runs...}`` or an unknown output is a :class:`Problem` naming the
field, never left in a value. Only ``slime-submit chain`` resolves them (to the earlier step's
path, known once it is submitted); a spec submitted alone that holds one is refused. What each
output is on disk: ``slime.core.paths`` (a single-task step's task 0).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from slime.spec.errors import Problem
from slime.spec.schema import dotted
from slime.spec.yamlmarks import Path

__all__ = ["OUTPUTS", "FieldRefs", "Ref", "find_refs", "string_leaves", "substitute"]

#: output name -> what it is (the earlier step's path; ``final_model`` needs ``train.checkpoint.save_hf``)
OUTPUTS = {
    "final_model": "HF copy of its final policy (tasks/0/final_model; needs train.checkpoint.save_hf: true)",
    "checkpoints": "its checkpoint dir (tasks/0/checkpoints)",
    "run_dir": "its run dir",
}
_ANY = re.compile(r"\$\{runs\b[^}]*\}?")
_REF = re.compile(r"\$\{runs\.([A-Za-z0-9][A-Za-z0-9._-]*?)\.([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Ref:
    """One ``${runs.STEP.OUTPUT}`` inside a value."""

    text: str
    step: str
    output: str


@dataclass(frozen=True, slots=True)
class FieldRefs:
    """A string field holding references: its path, its value as written, the references in it."""

    path: Path
    value: str
    refs: tuple[Ref, ...]

    @property
    def field(self) -> str:
        return dotted(self.path)


def string_leaves(node: Any, path: Path = ()) -> Iterator[tuple[Path, str]]:
    """Every string in a YAML-shaped tree, with its field path."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            yield from string_leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from string_leaves(v, (*path, i))
    elif isinstance(node, str):
        yield path, node


def find_refs(data: Any) -> tuple[list[FieldRefs], list[Problem]]:
    """Every string field of ``data`` holding ``${runs...}``, and a problem per malformed one."""
    found, problems = [], []
    for path, value in string_leaves(data):
        if "${runs" not in value:
            continue
        refs = tuple(Ref(m.group(0), m.group(1), m.group(2)) for m in _REF.finditer(value))
        bad = [m.group(0) for m in _ANY.finditer(value) if not _REF.fullmatch(m.group(0))]
        bad += [r.text for r in refs if r.output not in OUTPUTS]
        for text in bad:
            problems.append(
                Problem(
                    path=dotted(path),
                    message=f"bad reference {text!r}: expected ${{runs.STEP.OUTPUT}}",
                    hint=f"STEP is an earlier chain step's spec name; OUTPUT one of: {', '.join(OUTPUTS)}",
                )
            )
        if refs and not bad:
            found.append(FieldRefs(path, value, refs))
    return found, problems


def substitute(value: str, outputs: Mapping[tuple[str, str], str]) -> str:
    """``value`` with each reference replaced by ``outputs[(step, output)]``."""
    return _REF.sub(lambda m: outputs[(m.group(1), m.group(2))], value)
