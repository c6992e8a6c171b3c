"""One lazy registry for every plug-in point.

A plug-in is named in the spec (``reward.type: math``) or given as a dotted
``"package.module:attribute"`` path. Built-in names map to import paths that are
only imported when asked for, so the control plane never pulls in torch or ray
by looking a name up. An unknown name raises :class:`UnknownPlugin`, whose
message lists the valid names (and the closest one).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["Registry", "UnknownPlugin", "load_object"]


class UnknownPlugin(LookupError):
    """A plug-in name that no registry knows, or a dotted path that does not import."""


def load_object(path: str) -> Any:
    """Import ``"pkg.module:attr"`` (``attr`` may be dotted) and return the object."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UnknownPlugin(f"{path!r} is not of the form 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownPlugin(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownPlugin(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


class Registry:
    """Maps short names to ``"module:attr"`` import paths, imported on first use."""

    def __init__(self, kind: str, entries: Mapping[str, str]) -> None:
        self.kind = kind
        self._entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def register(self, name: str, path: str) -> None:
        self._entries[name] = path

    def get(self, name: str) -> Any:
        """The object behind ``name``; a ``module:attr`` path is accepted too."""
        if name in self._entries:
            return load_object(self._entries[name])
        if ":" in name:
            return load_object(name)
        close = difflib.get_close_matches(name, self._entries, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownPlugin(
            f"unknown {self.kind} {name!r}{hint}; valid: {', '.join(self.names())} or a 'package.module:function' path"
        )
