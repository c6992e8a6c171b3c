"""Cluster profiles: site settings kept outside job specs (``clusters.yaml``), chosen by ``cluster.profile``.

Files, first match wins: ``$SLIME_CLUSTERS``, the project's ``slime-clusters.yaml`` (the spec's directory
or an ancestor), ``$XDG_CONFIG_HOME/slime-submit/clusters.yaml``. A profile holds ``cluster.*`` fields of a
spec (the launcher's section typed by its plug-in) and ``partitions``: the nodes of each pool.
:func:`apply_profile` fills what the spec leaves unset, field by field: spec > the selected partition >
the profile > defaults, and returns the record ``lock.json`` keeps (a rerun needs no profile file).
Parsed like specs (ruamel marks, frozen msgspec types, file:line errors). Not here: asking the
cluster whether a profile is right (the launcher's ``site_check`` hook).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from slime.spec.errors import Origin, Problem, SpecError
from slime.spec.sections import NAME_PATTERN, D, Gpu, Section
from slime.spec.yamlmarks import Marks, load_yaml

__all__ = [
    "PROJECT_FILE",
    "ClusterProfile",
    "NodeShape",
    "Site",
    "SiteCheck",
    "SiteRecord",
    "apply_profile",
    "find_profile",
    "leaves",
    "load_profiles",
    "profile_files",
]

PROJECT_FILE = "slime-clusters.yaml"


class NodeShape(Section, kw_only=True):
    """The nodes of one partition (node pool): what a job there gets per node."""

    gpus_per_node: Annotated[int, D("GPUs per node of this partition (0: CPU nodes).", ge=0)]
    cpus_per_node: Annotated[Annotated[int, Meta(ge=1)] | None, D("CPUs per node of this partition.")] = None
    gpu: Annotated[Gpu | None, D("The GPU model of this partition's nodes (the fit check's memory).")] = None


class ClusterProfile(Section, kw_only=True):
    """One site: the ``cluster`` fields its jobs share and the shape of its partitions."""

    summary: Annotated[str, D("One line: what this cluster is.")] = ""
    cluster: Annotated[dict[str, Any], D("Any cluster.* field of a spec; the spec's own value wins.")] = {}
    partitions: Annotated[dict[str, NodeShape], D("Partition name -> what its nodes have.")] = {}


@dataclass(frozen=True, kw_only=True)
class Site:
    """A loaded profile: its typed parts, the raw mapping (what it sets) and where it was written."""

    name: str
    file: Path
    profile: ClusterProfile
    cluster: Any  # slime.spec.types.Cluster: the profile's fields, typed by the spec (defaults filled)
    raw: dict[str, Any]  # the ``cluster`` mapping as written (only the keys it sets)
    marks: Marks = field(repr=False, default_factory=dict)

    def at(self, *path: str | int) -> Origin:
        return self.marks.get(("clusters", self.name, *path)) or Origin(file=str(self.file))


@dataclass(frozen=True)
class SiteCheck:
    """One fact a launcher's ``site_check`` hook compared: the profile's value and the cluster's."""

    check: str
    field: str  # the profile field, e.g. clusters.ci.partitions.batch.gpus_per_node
    at: str  # its file:line
    want: str
    have: str
    ok: bool


@dataclass(frozen=True, kw_only=True)
class SiteRecord:
    """What ``lock.json`` records: the profile as it was, and where each ``cluster.*`` value came from."""

    name: str
    file: str
    sha256: str
    profile: dict[str, Any]
    sources: dict[str, str]  # dotted cluster path -> "spec (FILE:LINE)" / "profile NAME (...)" / "partition ..."

    def fields(self, spec: Any) -> list[tuple[str, Any, str]]:
        """(path, resolved value, source) of every ``cluster.*`` leaf; unlisted ones are defaults/derived."""
        found = leaves(msgspec.to_builtins(spec.cluster), ("cluster",))
        return [(p, v, self.sources.get(p, "default")) for p, v in found]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SiteRecord:
        """The record a lock.json kept (``to_json``), for a rerun that must not read the profile file."""
        fields = doc.get("fields") or {}
        sources = {p: f["from"] for p, f in fields.items() if isinstance(f, dict) and f.get("from") != "default"}
        return cls(name=doc["name"], file=doc["file"], sha256=doc["sha256"], profile=doc["profile"], sources=sources)

    def to_json(self, spec: Any) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "sha256": self.sha256,
            "profile": self.profile,
            "fields": {p: {"value": v, "from": s} for p, v, s in self.fields(spec)},
        }


def leaves(value: Any, path: tuple) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in leaves(v, (*path, str(k)))]
    return [(".".join(path), value)]


def profile_files(spec_dir: Path | None = None, environ: dict[str, str] | None = None) -> list[Path]:
    """The clusters files that exist, in the order their profiles take precedence (module doc)."""
    env = os.environ if environ is None else environ
    found: list[Path] = []
    if env.get("SLIME_CLUSTERS"):
        found.append(Path(env["SLIME_CLUSTERS"]).expanduser())
    if spec_dir is not None:
        for d in [Path(spec_dir).resolve(), *Path(spec_dir).resolve().parents]:
            if (d / PROJECT_FILE).is_file():
                found.append(d / PROJECT_FILE)
                break
    config = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    found.append(Path(config) / "slime-submit" / "clusters.yaml")
    explicit = found[0] if env.get("SLIME_CLUSTERS") else None  # named on purpose: a missing one is an error
    return [p for p in dict.fromkeys(found) if p == explicit or p.is_file()]


def _read(path: Path) -> tuple[dict[str, ClusterProfile], dict[str, Any], Marks]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        hint = "fix or unset SLIME_CLUSTERS" if not path.exists() else "check the file's permissions and encoding"
        problem = Problem(
            path="", message=f"cannot read clusters file: {exc}", origin=Origin(file=str(path)), hint=hint
        )
        raise SpecError([problem]) from None
    data, marks = load_yaml(text, str(path))
    entries = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(entries, dict) or set(data) != {"clusters"}:
        hint = "write `clusters:` and under it one mapping per profile name (see docs/guide/clusters.md)"
        raise SpecError(
            [
                Problem(
                    path="",
                    message="a clusters file is one `clusters:` mapping",
                    origin=Origin(file=str(path), line=1),
                    hint=hint,
                )
            ]
        )
    out = {}
    for name, entry in entries.items():
        where = ("clusters", name)
        # one convert per entry and per partition: msgspec's error paths hide mapping keys
        if not re.fullmatch(NAME_PATTERN, name):
            raise SpecError(
                [
                    Problem(
                        path=f"clusters.{name}",
                        message=f"profile name {name!r} is not lower-case letters, digits and '-'",
                        origin=marks.get(where),
                        hint="rename it, e.g. 'a100-site'",
                    )
                ]
            )
        parts = (entry or {}).get("partitions") if isinstance(entry, dict) else None
        shapes = {}
        for pool, shape in (parts or {}).items() if isinstance(parts, dict) else ():
            shapes[pool] = _convert(shape, NodeShape, marks, path, (*where, "partitions", str(pool)))
        rest = {k: v for k, v in entry.items() if k != "partitions"} if isinstance(entry, dict) else entry
        prof = _convert(rest if rest is not None else {}, ClusterProfile, marks, path, where)
        out[name] = msgspec.structs.replace(prof, partitions=shapes) if shapes else prof
    return out, data, marks


def _convert(value: Any, typ: type, marks: Marks, file: Path, where: tuple) -> Any:
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        raise SpecError([_problem(str(exc), marks, file, ".".join(where))]) from None


def _problem(text: str, marks: Marks, file: Path, prefix: str) -> Problem:
    message, _, where = text.partition(" - at `$")
    where = where.rstrip("`").lstrip(".")
    parts = tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", where) if p and p != "...")
    full = tuple(prefix.split(".")) + parts if prefix else parts
    origin = next((marks[full[:n]] for n in range(len(full), 0, -1) if full[:n] in marks), Origin(file=str(file)))
    return Problem(
        path=".".join(str(p) for p in full),
        message=message,
        origin=origin,
        hint="see `slime-submit explain cluster` for the fields a profile's cluster mapping takes",
    )


def load_profiles(files: list[Path]) -> dict[str, Site]:
    """Every profile of ``files`` by name (an earlier file's name hides a later one's); raises SpecError."""
    from slime.spec.types import Cluster

    sites: dict[str, Site] = {}
    for path in files:
        profiles, data, marks = _read(path)
        for name, prof in profiles.items():
            if name in sites:
                continue
            raw = data["clusters"][name].get("cluster") or {} if isinstance(data["clusters"][name], dict) else {}
            if "profile" in raw:
                at = marks.get(("clusters", name, "cluster", "profile"))
                problem = Problem(
                    path=f"clusters.{name}.cluster.profile",
                    message="a profile cannot select another profile",
                    origin=at,
                    hint="remove the key",
                )
                raise SpecError([problem])
            cluster = _convert(raw, Cluster, marks, path, ("clusters", name, "cluster"))
            sites[name] = Site(name=name, file=path, profile=prof, cluster=cluster, raw=raw, marks=marks)
    return sites


def find_profile(name: str, spec_dir: Path | None, origin: Origin | None = None) -> Site:
    """The profile ``name`` from the clusters files seen from ``spec_dir``; unknown: a SpecError listing them."""
    files = profile_files(spec_dir)
    sites = load_profiles(files)
    if name in sites:
        return sites[name]
    known = ", ".join(sorted(sites)) or "none"
    where = ", ".join(str(f) for f in files) or "no clusters file found"
    raise SpecError(
        [
            Problem(
                path="cluster.profile",
                message=f"unknown cluster profile {name!r} (profiles: {known}; read: {where})",
                origin=origin,
                hint=f"add it under `clusters:` in $XDG_CONFIG_HOME/slime-submit/clusters.yaml or {PROJECT_FILE}, "
                "or see `slime-submit clusters list`",
            )
        ]
    )


def _fill(
    dst: dict, src: dict, path: tuple, marks: Marks, src_marks: Marks, src_prefix: tuple, label: str, sources: dict
) -> None:
    """Copy into ``dst`` what it lacks from ``src`` (mappings merge key by key; the spec's value wins)."""
    for key, value in src.items():
        p = (*path, key)
        if key not in dst:
            dst[key] = copy.deepcopy(value)
            for sub, origin in src_marks.items():
                if sub[: len(src_prefix) + 1] == (*src_prefix, key):
                    marks.setdefault(p + sub[len(src_prefix) + 1 :], origin)
            for leaf, _ in leaves(value, p):
                sub = tuple(leaf.split("."))[len(path) :]
                sources[leaf] = f"{label} ({src_marks.get((*src_prefix, *sub)) or src_marks.get((*src_prefix, key))})"
        elif isinstance(dst[key], dict) and isinstance(value, dict):
            _fill(dst[key], value, p, marks, src_marks, (*src_prefix, key), label, sources)


def _shape_problems(site: Site, pool: str, shape: NodeShape, spec_cluster: dict, marks: Marks) -> list[Problem]:
    """The spec asks a node for more than the partition's nodes have (slime's default-8-GPUs bug class)."""
    out = []
    for key, have in (("gpus_per_node", shape.gpus_per_node), ("cpus_per_node", shape.cpus_per_node)):
        want = spec_cluster.get(key)
        if have is not None and isinstance(want, int) and want > have:
            out.append(
                Problem(
                    path=f"cluster.{key}",
                    message=f"{want} per node, but partition {pool!r} of cluster profile {site.name!r} has "
                    f"{have} per node ({site.at('partitions', pool, key)})",
                    origin=marks.get(("cluster", key)),
                    hint=f"lower cluster.{key} to at most {have}, or choose a partition whose nodes have {want}",
                )
            )
    return out


def _pool_shape(site: Site, cluster: dict, launcher: str) -> tuple[str | None, NodeShape | None]:
    """The partition (node pool) the spec or the profile picks, and its shape in the profile, if any."""
    from slime.spec.plugin import PluginError, profile

    try:
        key = profile("launcher", launcher).pool_option
    except PluginError:
        return None, None  # the schema names the unknown launcher
    if key is None:
        return None, None
    section = cluster.get(launcher) if isinstance(cluster.get(launcher), dict) else {}
    pool = section.get(key, (site.raw.get(launcher) or {}).get(key))
    return (pool, site.profile.partitions.get(pool)) if isinstance(pool, str) else (None, None)


def apply_profile(
    data: dict, marks: Marks, spec_dir: Path | None, file: str
) -> tuple[SiteRecord | None, list[Problem]]:
    """Fill ``data['cluster']`` from the profile it names (see the module doc); None when it names none."""
    from slime.spec.plugin import default_profile, profiles

    cluster = data.get("cluster")
    if not isinstance(cluster, dict) or not isinstance(cluster.get("profile"), str):
        return None, []
    try:
        site = find_profile(cluster["profile"], spec_dir, marks.get(("cluster", "profile")))
    except SpecError as exc:
        return None, list(exc.problems)
    sources = {p: f"spec ({marks.get(tuple(p.split('.'))) or file})" for p, _ in leaves(cluster, ("cluster",))}
    launcher = cluster.get("launcher", site.raw.get("launcher", default_profile("launcher").name))
    problems: list[Problem] = []
    pool, shape = _pool_shape(site, cluster, launcher) if isinstance(launcher, str) else (None, None)
    if shape is not None:
        problems += _shape_problems(site, pool, shape, cluster, marks)
        given = {k: v for k, v in msgspec.to_builtins(shape).items() if v is not None}
        where = ("clusters", site.name, "partitions", pool)
        _fill(
            cluster, given, ("cluster",), marks, site.marks, where, f"partition {pool} of profile {site.name}", sources
        )
    # another launcher's section would be refused: a spec that picks `local` keeps the site's other settings
    others = set(profiles("launcher")) - {launcher}
    raw = {k: v for k, v in site.raw.items() if k not in others}
    where = ("clusters", site.name, "cluster")
    _fill(cluster, raw, ("cluster",), marks, site.marks, where, f"profile {site.name}", sources)
    record = SiteRecord(
        name=site.name,
        file=str(site.file),
        sha256=hashlib.sha256(site.file.read_bytes()).hexdigest(),
        profile=msgspec.to_builtins(site.profile),
        sources=sources,
    )
    return record, problems
