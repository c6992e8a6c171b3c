"""``slime-submit import-slime-args``: turn a slime ``train.py`` launch script (or flag list) into a v2 spec.

``convert_slime_args(text)`` reads the flags (``slime.migrate.bashargs``), maps them
(``slime.migrate.flagmap``) and writes a commented slime/v2 YAML where each value says where it came
from: a flag and line, a differing slime default, derived, or a ``PLACEHOLDER``.
Guaranteed: every flag is in ``mapped`` or in ``unmapped`` with a reason, none dropped silently; the
YAML is validated and problems returned. Not guaranteed: equivalence for options slime/v2 lacks.
ruamel.yaml writes the YAML because it can attach a comment to each key.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from slime.migrate.bashargs import Script, read_script
from slime.migrate.flagmap import IMPLIED, Builder, Key, dedupe, finish, is_sft, map_flag, parse_flags
from slime.migrate.sft import SftImport, SftImportError, sft_import
from slime.spec.errors import Problem
from slime.spec.versions import CURRENT, Move, move_path, upgrade

__all__ = ["IMPLIED", "ConversionResult", "convert_slime_args", "read_source"]

_SECTION_ORDER = (
    "apiVersion",
    "kind",
    "name",
    "description",
    "cluster",
    "model",
    "train",
    "rollout",
    "data",
    "reward",
    "algorithm",
    "logging",
)


@dataclass(frozen=True)
class ConversionResult:
    """The generated spec text and an account of every flag."""

    yaml: str
    mapped: list[tuple[str, str]]  # (flag, spec path or what implies it)
    unmapped: list[tuple[str, str]]  # (flag or word, reason)
    placeholders: list[tuple[str, str]] = field(default_factory=list)  # (spec path, what to put there)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (shell text, why it was left as written)
    problems: list[Problem] = field(default_factory=list)  # validation of the generated spec
    differences: list[tuple[str, str]] = field(default_factory=list)  # (flag, what slime computes that v1 does not)
    refused: list[tuple[str, str]] = field(default_factory=list)  # unmapped flags that change what is trained
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # contradictions between flags or config.json

    @property
    def valid(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def accepted(self, drop_unmapped: bool = False) -> bool:
        """The import succeeds: a valid spec, no contradiction, and no refused flag unless dropping them."""
        return self.valid and not self.conflicts and (drop_unmapped or not self.refused)

    def report(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "mapped": [{"flag": f, "path": p} for f, p in self.mapped],
            "unmapped": [{"flag": f, "reason": r} for f, r in self.unmapped],
            "refused": [{"flag": f, "reason": r} for f, r in self.refused],
            "conflicts": [{"flag": f, "reason": r} for f, r in self.conflicts],
            "placeholders": [{"path": p, "why": w} for p, w in self.placeholders],
            "notes": [{"text": t, "why": w} for t, w in self.notes],
            "differences": [{"flag": f, "slime": w} for f, w in self.differences],
            "problems": [p.to_json() for p in self.problems],
        }


# ----------------------------------------------------------------------------- YAML
def _field_order() -> dict[str, list[str]]:
    """Section path -> its field names in declaration order (the order `explain` uses)."""
    from slime.spec.schema import field_names

    order: dict[str, list[str]] = {"": list(_SECTION_ORDER)}
    for section in (
        "cluster",
        "model",
        "train",
        "train.parallel",
        "train.dynamic_batch",
        "train.optimizer",
        "train.checkpoint",
        "rollout",
        "data",
        "reward",
        "algorithm",
        "algorithm.critic",
        "logging",
        "logging.wandb",
    ):
        order[section] = field_names(CURRENT, tuple(section.split(".")))
    return order


def _printable(text: str) -> str:
    """Comment text on one line: control characters, line separators and lone surrogates escaped."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _emit(b: Builder, header: list[str], footer: list[str]) -> tuple[str, list[Move]]:
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    order = _field_order()
    root = CommentedMap()
    for parts in sorted(b.values, key=lambda p: _sort_key(p, order)):
        value, comment = b.values[parts]
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, CommentedMap())
        if isinstance(value, list) and value and isinstance(value[0], dict):
            seq = CommentedSeq(CommentedMap(item) for item in value)
            value = seq
        elif isinstance(value, list):
            seq = CommentedSeq(value)
            seq.fa.set_flow_style()
            value = seq
        elif isinstance(value, dict):
            inner = CommentedMap(value)
            inner.fa.set_flow_style()
            value = inner
        node[parts[-1]] = value
        if not comment:
            continue
        comment = _printable(comment)
        if isinstance(value, CommentedSeq) and not value.fa.flow_style():  # a block list: comment above it
            node.yaml_set_comment_before_after_key(parts[-1], before=comment, indent=2 * (len(parts) - 1))
        else:
            node.yaml_add_eol_comment(comment, parts[-1])
    _, moves = upgrade(root)  # the flag table speaks slime/v1's field paths: moved like any v1 file's
    y = YAML(typ="rt")
    y.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    buf = io.StringIO()
    y.dump(root, buf)
    head = "".join(f"# {_printable(line)}\n" for line in header)
    foot = "".join(f"# {_printable(line)}\n" for line in footer)
    return head + buf.getvalue() + (("\n" + foot) if foot else ""), moves


def _sort_key(path: Key, order: dict[str, list[str]]) -> list[int]:
    key, parent = [], ""
    for part in path:
        names = order.get(parent, [])
        key.append(names.index(part) if part in names else len(names))
        parent = f"{parent}.{part}" if parent else part
    return key


# ----------------------------------------------------------------------------- entry point
def _sft_sections(flags: list, entry: str | None, b: Builder) -> SftImport | None:
    """An SFT script's kind SFTJob sections, set on ``b``; None (its SFT flags then refused) if it is half SFT."""
    try:
        sft = sft_import(flags, entry=entry)
    except SftImportError as e:
        b.refuse(e.flag, str(e))
        return None
    if sft is None:
        return None
    for path, value in sft.sections.items():
        if path != "kind":
            b.set(path, value, "kind: SFTJob (slime's SFT recipe)")
    b.mapped.extend((flag, "kind") for flag in sft.consumed)
    b.notes.extend(sft.notes)
    return sft


def _drop_rl_paths(unset: tuple[str, ...], b: Builder) -> None:
    """Remove what an SFT spec must not carry, saying which flag's value went (slime's SFT run ignores it too)."""
    for key in [k for k in b.values if any(".".join(k) == u or ".".join(k).startswith(u + ".") for u in unset)]:
        _, comment = b.values.pop(key)
        if comment and not comment.startswith("PLACEHOLDER"):
            b.notes.append((comment.split(" ")[0], f"{'.'.join(key)} is not used by kind SFTJob: left out"))
    b.placeholders[:] = [
        (p, why) for p, why in b.placeholders if not any(p == u or p.startswith(u + ".") for u in unset)
    ]


def convert_slime_args(
    text: str, name: str | None = None, model: str | None = None, sourced: tuple[str, ...] = ()
) -> ConversionResult:
    """Convert a slime launch script or flag list into a commented slime/v2 spec (see the module docstring).

    ``model``: a checkpoint directory to use instead of the script's ``--hf-checkpoint`` (its config.json
    is then compared with the script's architecture flags). ``sourced``: the text of the files the script
    sources (``scripts/models/<m>.sh``), whose arrays it uses."""
    script = read_script(text, sourced)
    b = Builder()
    b.notes.extend(script.notes)
    flags, strays = parse_flags(script.words)
    for w in strays:
        b.refuse(w.text, f"a value with no flag before it (line {w.line})")
    _unread_flags(script, b)
    if script.entry and "async" in script.entry:  # train_async.py: the next rollout overlaps training
        b.set("train.async", True, f"{script.entry} (line {script.entry_line})")
    flags = dedupe(flags, b)
    seen = {f.name: f for f in flags}
    b.sft = is_sft(seen)
    sft = _sft_sections(flags, script.entry, b) if b.sft else None
    b.sft_job = sft is not None
    for f in flags:
        if sft is None or f.name not in sft.consumed:
            map_flag(f, b, seen)
    if model is not None:
        given = seen.get("--hf-checkpoint")
        where = f" (the script gives {given.shown()})" if given is not None else ""
        b.set("model.path", model, f"import-slime-args --model{where}")
    finish(b, seen, name)
    if sft is not None:
        _drop_rl_paths(sft.unset, b)
    accounted = {f for f, _ in b.mapped} | {f for f, _ in b.unmapped}
    for f in flags:  # the guarantee: nothing dropped silently, whatever a handler above missed
        if f.name not in accounted:
            b.refuse(f.name, f"could not be mapped with value(s) {f.values!r}")
    b.set("apiVersion", "slime/v1", "")
    b.set("kind", "SFTJob" if sft is not None else "RLJob", "")
    b.set("description", "Imported from a slime launch script by slime-submit import-slime-args.", "")

    text_out, moves = _emit(b, _header(script, b), _footer(b))

    def moved(path: str) -> str:  # the v1 path the flag table gave, where the written v2 spec has it
        return ".".join(move_path(tuple(path.split(".")), moves))

    return ConversionResult(
        yaml=text_out,
        mapped=[(flag, moved(path)) for flag, path in b.mapped],
        unmapped=b.unmapped,
        placeholders=[(moved(path), why) for path, why in b.placeholders],
        notes=b.notes,
        problems=_validate(text_out),
        differences=b.differences,
        refused=b.refused,
        conflicts=b.conflicts,
    )


def _unread_flags(script: Script, b: Builder) -> None:
    """List as unmapped the flags bash would not pass (an early end) or this file cannot see (unknown arrays)."""
    for line, end, text in script.early_end:
        b.refuse(
            f"line {line}: {text}",
            f"not part of the {script.entry} command, which ends on line {end} (no trailing '\\'): bash runs "
            "this line as a command of its own and slime never sees these flags; if they are meant for "
            f"{script.entry}, end line {end} with '\\'",
        )
    sourced = any(what.startswith("source ") for what, _ in script.notes)
    for w in script.unknown_arrays:
        if not sourced:  # bash expands an array defined nowhere to nothing: slime sees no flags from it
            b.drop(w.text, f"array defined nowhere in this script (line {w.line}): bash passes nothing for it")
            continue
        b.refuse(
            w.text,
            f"array not defined in this file (line {w.line}; a sourced file?): its flags "
            "were not imported; model-architecture flags are implied by model.path's "
            "config.json, add any others by hand",
        )


def _header(script: Script, b: Builder) -> list[str]:
    """The comment lines above the generated spec: its source and how to read its values."""
    return [
        "Generated by `slime-submit import-slime-args`"
        + (f" from the flags of {script.entry} (line {script.entry_line})." if script.entry else "."),
        "Each value says where it came from: '--flag value (line N)', a slime default that differs",
        "from slime/v2's, 'derived', or PLACEHOLDER (required, not in the input: fill it in).",
        f"{len(b.mapped)} flag(s) mapped, {len(b.unmapped)} not mapped (listed at the end).",
    ]


def _footer(b: Builder) -> list[str]:
    """The comment lines below the generated spec: differences, unmapped flags and shell notes."""
    footer: list[str] = []
    if b.differences:
        footer += ["Differs from slime (mapped, but slime/v2 computes this differently):"]
        footer += [f"  {flag}: {why}" for flag, why in b.differences]
    if b.unmapped:
        footer += ["Not mapped (no slime/v2 field, or not resolvable without running the script):"]
        footer += [f"  {flag}: {why}" for flag, why in b.unmapped]
    if b.notes:
        footer += ["Shell text left as written:"] + [f"  {what}: {why}" for what, why in b.notes]
    return footer


def read_source(path: str) -> str:
    """The text of a launch script or flag list ('-' = stdin), or a SpecError naming the file (exit 2)."""
    import sys
    from pathlib import Path

    from slime.spec.errors import Origin, SpecError

    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        message = f"file not found: {path}"
    except (OSError, UnicodeDecodeError) as exc:
        message = f"cannot read {path}: {exc}"
    raise SpecError(
        [
            Problem(
                path="",
                message=message,
                origin=Origin(file=path),
                hint="give a slime launch script (.sh) or a file of train.py flags",
            )
        ]
    )


def _validate(text: str) -> list[Problem]:
    from slime.spec import SpecError, load_spec_text

    try:
        loaded = load_spec_text(text, file="<imported spec>")
    except SpecError as exc:
        return exc.problems
    return list(loaded.warnings)
