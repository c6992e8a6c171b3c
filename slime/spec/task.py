"""``load_task_spec``: the resolved spec of one task, read back from its run dir.

Every process started on a node (the bootstrap, the driver) reads its task's spec from
``tasks/<i>/resolved.json``, written by the launcher at submit time (``{"task", "overrides",
"spec"}``). Guaranteed: the returned ``Spec`` is the typed, validated object; any problem with the
file is a ``ValueError`` naming it (callers add what to do where they run).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from slime.spec.types import Spec

__all__ = ["load_task_spec"]


def load_task_spec(path: Path) -> Spec:
    """The ``spec`` of the task file at ``path`` (``TaskPaths.resolved``)."""
    try:
        doc = json.loads(path.read_text())
        return msgspec.convert(doc["spec"], type=Spec)
    except FileNotFoundError:
        raise ValueError(
            f"{path} does not exist: pass a run dir made by slime-submit and a task index that exists in it"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
        raise ValueError(f"cannot read the task's resolved spec {path}: {exc}") from None
