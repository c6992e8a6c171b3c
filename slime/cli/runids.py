"""Short run ids: the hash a run dir's name ends with (``<name>-<YYYYmmdd>-<HHMMSS>-<hash>``).

``list`` and ``status`` show them; every command that takes a run dir takes one (or a unique
prefix of one, or the run dir's name) and finds the run under ``--dir``. Standard library only:
shell completion imports this on every TAB.
"""

from __future__ import annotations

import re

__all__ = ["RUN_NAME", "short_id"]

#: the run dir names the launchers make (``slime.core.paths.new_run_name``)
RUN_NAME = re.compile(r"^(?P<name>.+)-\d{8}-\d{6}-(?P<id>[0-9a-f]+)$")


def short_id(run_dir_name: str) -> str:
    """The run's short id: the hash suffix of its dir name (the whole name for other names)."""
    m = RUN_NAME.match(run_dir_name)
    return m.group("id") if m else run_dir_name
