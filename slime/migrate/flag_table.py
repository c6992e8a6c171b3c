"""The generated table of slime's own flags (``slime_flags.json``) and the one class each flag is in.

``classify(flag)`` says how the importer treats each flag of slime's parser at the pinned commit:
``mapped`` (to a spec field), ``implied`` (by config.json, compared with it), ``refused`` (changes what
is trained; the import fails unless --drop-unmapped), ``droppable`` (speed, memory, logging or
evaluation only) or ``removed`` (gone from slime; recognised from its history). The table is data
written by ``gen_slime_flags``; nothing here reads slime's source.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from slime.migrate.slime_flags import ARCHITECTURE, DIRECT, DROPPABLE, REFUSED, SPECIAL_FIELDS

__all__ = ["CLASSES", "REMOVED", "classify", "removed_reason", "slime_table"]

CLASSES = ("mapped", "implied", "refused", "droppable", "removed")
TABLE = Path(__file__).with_name("slime_flags.json")


@cache
def slime_table() -> dict[str, Any]:
    """{"slime_commit", "sources", "flags": {flag: info}, "removed": {flag: {"last_seen": commit}}}."""
    return json.loads(TABLE.read_text())


REMOVED: frozenset[str] = frozenset(slime_table()["removed"])


def removed_reason(flag: str) -> str:
    last = slime_table()["removed"][flag]["last_seen"]
    commit = slime_table()["slime_commit"]
    return (
        f"removed from slime (last in its parser at commit {last[:9]}; slime {commit[:9]} refuses it too): "
        "delete it from the script"
    )


def classify(flag: str) -> tuple[str, str]:
    """(class, the spec path or the reason) for one of slime's own flags; ("", "") if it is in no class."""
    if flag in DIRECT:
        return "mapped", DIRECT[flag][0]
    if flag in SPECIAL_FIELDS:
        return "mapped", SPECIAL_FIELDS[flag]
    if flag in ARCHITECTURE:
        return "implied", "model.path's config.json"
    if flag in REFUSED:
        return "refused", REFUSED[flag]
    if flag in DROPPABLE:
        return "droppable", DROPPABLE[flag]
    if flag in REMOVED:
        return "removed", removed_reason(flag)
    return "", ""


def reference_markdown() -> str:
    """The docs page listing every flag of the table with its class and what the import does with it."""
    table = slime_table()
    commit = table["slime_commit"]
    lines = [
        "# slime flags",
        "",
        f"Every flag of THUDM/slime's own parser at commit `{commit[:9]}` ({', '.join(table['sources'])}), "
        "and the flags removed from it since (from its history), with what `slime-submit import-slime-args` "
        "does with each. Generated from `slime/migrate/slime_flags.json` "
        "(`python -m slime.migrate.gen_slime_flags SLIME_CHECKOUT`).",
        "",
    ]
    rows = sorted((classify(f) + (f,) for f in [*table["flags"], *REMOVED]), key=lambda r: (CLASSES.index(r[0]), r[2]))
    counts = {c: sum(1 for r in rows if r[0] == c) for c in CLASSES}
    lines += ["| class | flags |", "|---|---|"] + [f"| {c} | {n} |" for c, n in counts.items()] + [""]
    lines += [
        "A mapped flag's landing is shown by `tests/unit/test_migrate_flags.py` "
        "(`test_each_flag_is_treated_as_its_class_says`, and `test_each_direct_flag_lands_on_its_field` "
        "for the value); refused and removed flags fail the import (exit 2) unless `--drop-unmapped`.",
        "",
        "| flag | class | spec field, or why |",
        "|---|---|---|",
    ]
    lines += [f"| `{flag}` | {cls} | {detail.replace('|', '/')} |" for cls, detail, flag in rows]
    return "\n".join(lines) + "\n"
