"""Spec versions: one upgrade function per version step, applied to a document before it is validated.

``upgrade`` rewrites a mapping in place from its ``apiVersion`` to the current one, step by step
(``UPGRADES``), and returns what moved, so the loader can move the line marks and ``--set`` paths
with it and ``slime-submit upgrade`` can rewrite a file keeping its comments and order (it passes
ruamel's round-trip mappings). slime/v1 → v2: the fields each plug-in now owns move into its
section (``Profile.v1_moves``), so this module names no plug-in. It never validates: the loader does.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from slime.spec.plugin import KINDS, default_profile, profiles
from slime.spec.sections import API_VERSION

Path = tuple[str, ...]
Move = tuple[Path, Path]  # (old path, new path)

__all__ = ["CURRENT", "UPGRADES", "Move", "move_path", "upgrade", "v1_moves"]

CURRENT = API_VERSION


def v1_moves(data: MutableMapping) -> list[Move]:
    """slime/v1 → v2: each plug-in's fields into its section (a shared field only for the selected one)."""
    out: list[Move] = []
    for kind, (_, section, attr) in KINDS.items():
        part = data.get(section)
        chosen = part.get(attr) if isinstance(part, MutableMapping) else None
        chosen = chosen if isinstance(chosen, str) else default_profile(kind).name
        for name, p in profiles(kind).items():
            for m in p.v1_moves:
                if not m.when_selected or name == chosen:
                    out.append((tuple(m.old.split(".")), (section, name, *m.new.split("."))))
    return out


# version -> (next version, the moves of that step for a document)
UPGRADES: dict[str, tuple[str, Callable[[MutableMapping], list[Move]]]] = {"slime/v1": ("slime/v2", v1_moves)}


def move_path(path: Path, moves: list[Move]) -> Path:
    """``path`` (or a path below one) after ``moves``."""
    for old, new in moves:
        if path[: len(old)] == old:
            return new + path[len(old) :]
    return path


def _child(parent: MutableMapping, key: str, before: str | None) -> MutableMapping:
    """``parent[key]``, created as an empty mapping of the parent's type (before ``before``) if missing."""
    if not isinstance(parent.get(key), MutableMapping):
        new = type(parent)()
        if before is not None and hasattr(parent, "insert") and before in parent:
            parent.insert(list(parent).index(before), key, new)  # ruamel: keep the file's order
        else:
            parent[key] = new
    return parent[key]


def _move(data: MutableMapping, old: Path, new: Path) -> bool:
    parent: Any = data
    for part in old[:-1]:
        parent = parent.get(part) if isinstance(parent, MutableMapping) else None
    if not isinstance(parent, MutableMapping) or old[-1] not in parent:
        return False
    target: Any = data
    for i, part in enumerate(new[:-1]):
        target = _child(target, part, old[-1] if i == len(new) - 2 and new[:-2] == old[:-1] else None)
    comment = getattr(parent, "ca", None) and parent.ca.items.pop(old[-1], None)
    target[new[-1]] = parent.pop(old[-1])
    if comment:
        target.ca.items[new[-1]] = comment
    return True


def _position(data: MutableMapping, path: Path) -> tuple[Path, int]:
    parent: Any = data
    for part in path[:-1]:
        parent = parent.get(part) if isinstance(parent, MutableMapping) else None
    keys = list(parent) if isinstance(parent, MutableMapping) else []
    return path[:-1], keys.index(path[-1]) if path[-1] in keys else len(keys)


def _rename_keys(grid: Any, moves: list[Move]) -> None:
    """Sweep grid keys are dotted field paths: move them too, keeping their order."""
    if not isinstance(grid, MutableMapping):
        return
    for key in list(grid):
        if isinstance(key, str) and (moved := ".".join(move_path(tuple(key.split(".")), moves))) != key:
            if hasattr(grid, "insert"):
                grid.insert(list(grid).index(key), moved, grid.pop(key))
            else:
                grid[moved] = grid.pop(key)


def upgrade(data: MutableMapping) -> tuple[str | None, list[Move]]:
    """Upgrade ``data`` in place to ``CURRENT``; returns (the version it had, the moves applied)."""
    first = data.get("apiVersion")
    version, applied = first, []
    while version in UPGRADES:
        version, moves_of = UPGRADES[version]
        moves = sorted(moves_of(data), key=lambda m: _position(data, m[0]))  # keep the file's order
        applied += [(old, new) for old, new in moves if _move(data, old, new)]
        sweep = data.get("sweep")
        _rename_keys(sweep.get("grid") if isinstance(sweep, MutableMapping) else None, moves)
        data["apiVersion"] = version
    return (first if first != version else None), applied
