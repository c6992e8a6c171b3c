"""Plug-ins (launchers, train and rollout backends) as the spec core sees them: ``Profile`` objects.

A plug-in registers a ``Profile`` under a Python entry point (``slime_submit.launchers``,
``slime_submit.train_backends``, ``slime_submit.rollout_backends``); its name is the entry point's.
The profile owns its spec section (``cluster.<name>``, ``train.<name>``, ``rollout.<name>``), its
rules, derived values, smoke edits, preview and (launchers) node environment, so the spec core
names no plug-in. A profile module imports only ``slime.spec.sections`` and this module at import
time (the spec types are composed from the profiles); its ``hooks`` module is imported when used.
Entry points (importlib.metadata) because they let a separately installed package add a plug-in.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal

Kind = Literal["launcher", "train_backend", "rollout_backend"]
Finding = tuple[str, str, str | None]
Rule = Callable[[Any], Iterator[Finding]]

# kind -> (entry-point group, the spec section that holds the name and the plug-in sections, its name field)
KINDS: dict[str, tuple[str, str, str]] = {
    "launcher": ("slime_submit.launchers", "cluster", "launcher"),
    "train_backend": ("slime_submit.train_backends", "train", "backend"),
    "rollout_backend": ("slime_submit.rollout_backends", "rollout", "backend"),
}

__all__ = [
    "KINDS",
    "Finding",
    "Kind",
    "PluginError",
    "Profile",
    "Rule",
    "V1Move",
    "default_profile",
    "group_entry_points",
    "hook",
    "profile",
    "profiles",
    "selected",
]


class PluginError(LookupError):
    """An unknown plug-in name (the message lists the installed ones), or a broken registration."""


@dataclass(frozen=True, kw_only=True)
class V1Move:
    """A slime/v1 field that spec v2 keeps under this plug-in's section (see ``slime.spec.versions``)."""

    old: str  # dotted v1 path, e.g. 'cluster.partition'
    new: str  # path inside the plug-in's section, e.g. 'partition'
    when_selected: bool = False  # move only when this plug-in is the one the spec selects


@dataclass(frozen=True, kw_only=True)
class Profile:
    """One plug-in: what the spec core needs to know about it, without importing its implementation."""

    summary: str  # one line: what it is (schema, docs, ``explain``)
    implementation: str  # 'module:attr' of the Launcher / TrainBackend / RolloutBackend class
    options: type | None = None  # its spec section (a ``slime.spec.sections.Section``), or None
    options_doc: str = ""  # one line for the section's field
    default: bool = False  # the embedded default of its kind (the spec's default, and smoke's target)
    cpu: bool = False  # runs without GPUs (CPU-only jobs, fake GPU slots, the smoke)
    streams: bool = False  # rollout backends: generation continues across weight updates (train.async fully)
    teacher: bool = False  # rollout backends: starts a teacher engine that scores samples (algorithm.opd engine)
    hooks: str | None = None  # module with optional RULES, WARNINGS, RAW_WARNINGS, resolve, smoke, site_check, ...
    node_env: str | None = None  # launchers: 'module:attr' of the node environment (who/where a node is)
    pool_option: str | None = None  # launchers: the option naming a node pool (a cluster profile's ``partitions``)
    v1_moves: tuple[V1Move, ...] = ()
    derived: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # resolve's inputs (DERIVED_FROM)
    name: str = ""  # filled from the entry point's name
    kind: str = ""


@functools.cache
def _installed() -> Any:
    """Every installed entry point, read once per process (each scan reads every distribution)."""
    return entry_points()


def group_entry_points(group: str) -> list:
    """The installed entry points of ``group``, by name."""
    return sorted(_installed().select(group=group), key=lambda e: e.name)


def _load(kind: str) -> dict[str, Profile]:
    group = KINDS[kind][0]
    out: dict[str, Profile] = {}
    for ep in group_entry_points(group):
        if ep.name in out:
            continue  # the same distribution seen twice on sys.path
        obj = ep.load()
        if not isinstance(obj, Profile):
            raise PluginError(f"entry point {ep.name!r} of {group} ({ep.value}) is not a slime.spec.plugin.Profile")
        out[ep.name] = _named(obj, ep.name, kind)
    if sum(p.default for p in out.values()) != 1 and out:
        raise PluginError(f"{group}: exactly one installed plug-in must be the default, got {sorted(out)}")
    return out


def _named(p: Profile, name: str, kind: str) -> Profile:
    from dataclasses import replace

    return replace(p, name=name, kind=kind)


@functools.cache
def profiles(kind: str) -> dict[str, Profile]:
    """The installed plug-ins of ``kind`` by name (sorted)."""
    return _load(kind)


def profile(kind: str, name: str) -> Profile:
    """The plug-in ``name`` of ``kind``; an unknown name lists the installed ones."""
    known = profiles(kind)
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise PluginError(f"unknown {kind.replace('_', ' ')} {name!r}{hint}; installed: {', '.join(known)}")


def default_profile(kind: str) -> Profile:
    return next(p for p in profiles(kind).values() if p.default)


def selected(spec: Any, kind: str) -> Profile:
    """The plug-in of ``kind`` that ``spec`` selects."""
    _, section, attr = KINDS[kind]
    return profile(kind, getattr(getattr(spec, section), attr))


def hook(p: Profile, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of the profile's hooks module (imported on first use), or ``default``."""
    if p.hooks is None:
        return default
    return getattr(importlib.import_module(p.hooks), name, default)
