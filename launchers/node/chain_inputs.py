"""A chain step's check, on the node before Ray starts, that the earlier steps' outputs it uses exist.

``slime-submit chain`` filled each ``${runs.STEP.OUTPUT}`` with the earlier step's path and listed
them in the run's ``chain_refs.json``. Here, after the scheduler started this step, each
path must be there; what was found (path, exists, host, time) is written to the task's
``chain_inputs.json`` by node 0. A missing one is exit code 2 naming the field and the step.
"""

from __future__ import annotations

import json
import os
import socket
import time

from slime.core.paths import RunPaths, TaskPaths, atomic_write

__all__ = ["check_inputs"]


def check_inputs(paths: RunPaths, tp: TaskPaths, *, record: bool) -> str | None:
    """The problem with this step's chain inputs (None: none, or not a chain step)."""
    try:
        inputs = json.loads(paths.chain_refs.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(inputs, list):
        return f"{paths.chain_refs} is not a list of references; submit the chain again"
    found = [
        {**i, "exists": os.path.exists(str(i.get("path"))), "host": socket.gethostname(), "checked_at": time.time()}
        for i in inputs
        if isinstance(i, dict)
    ]
    if record and found:
        atomic_write(tp.chain_inputs, json.dumps(found, indent=2) + "\n")
    missing = [i for i in found if not i["exists"]]
    if not missing:
        return None
    return (
        "; ".join(
            f"{i.get('field')}: {i.get('ref')} is {i.get('path')}, which step {i.get('step')!r} did not write"
            for i in missing
        )
        + " (did that step finish? final_model needs train.checkpoint.save_hf: true)"
    )
