"""One task's resolved spec, read back from its run dir (``tasks/<i>/resolved.json``).

``slime-submit`` writes ``{"task": i, "spec": <resolved spec>, ...}`` there; the node side (bootstrap,
preflight) and the runtime read it back with :func:`load_task_spec` into the same frozen ``Spec``.
It is not validated again (it was, when the run dir was made): only decoded into its types, so a
hand-edited or truncated file fails here with one :class:`TaskSpecError` naming the file, never a
traceback. Callers decide what a failure means (bad input for ``slime.train``, an infrastructure
fault for a node that cannot see the shared run dir).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec

from slime.core.paths import TaskPaths
from slime.spec.types import Spec

__all__ = ["TaskSpecError", "load_task_spec"]


class TaskSpecError(ValueError):
    """The task's resolved spec is missing or unreadable; the message names the file."""


def load_task_spec(task: TaskPaths | str | os.PathLike) -> Spec:
    """The ``Spec`` in ``task``'s ``resolved.json`` (``task``: its ``TaskPaths`` or the file's path)."""
    path = task.resolved if isinstance(task, TaskPaths) else Path(task)
    try:
        doc = json.loads(path.read_text())
        return msgspec.convert(doc["spec"], type=Spec)
    except FileNotFoundError:
        raise TaskSpecError(
            f"{path} does not exist: pass a run dir made by slime-submit and a task index that exists in it"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
        raise TaskSpecError(f"cannot read the task's resolved spec {path}: {exc}") from None
