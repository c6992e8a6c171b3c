"""The JSON Schema of the current spec version, generated from the typed objects.

``msgspec.json.schema`` derives the schema (types, constraints, defaults and each field's one-line
description) from ``slime.spec.types``, with the installed plug-ins' sections; the committed copy
``slime/spec/schema/v2.json`` (the built-in plug-ins) exists for editors' YAML language servers,
and a test keeps it byte-identical to the generated one. Validation uses the ``jsonschema`` library
because it reports every violation (``iter_errors``), where msgspec's converter stops at the first.
Older versions are upgraded before validation (``slime.spec.versions``): one schema is enough.
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path as FsPath
from typing import Any

from slime.spec.errors import Origin, Problem
from slime.spec.yamlmarks import Marks, Path

SUPPORTED_VERSIONS = ("slime/v1", "slime/v2")  # apiVersions a spec may have (older ones are upgraded)
CURRENT = SUPPORTED_VERSIONS[-1]
SCHEMA_DIR = FsPath(__file__).with_name("schema")

__all__ = [
    "SUPPORTED_VERSIONS",
    "did_you_mean",
    "dotted",
    "dump_schema",
    "field_names",
    "generate_schema",
    "origin_of",
    "schema_for",
    "schema_problems",
    "subschema",
    "suggest_field",
    "suggest_path",
    "value_problems",
]


def _plugins() -> dict[str, list[str]]:
    from slime.spec.plugin import KINDS, profiles

    return {kind: list(profiles(kind)) for kind in KINDS}


def generate_schema(api_version: str = CURRENT) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the current spec version, generated from the types by msgspec."""
    if api_version != CURRENT:
        raise KeyError(api_version)
    import msgspec

    from slime.spec.types import Spec

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://slime-submit.dev/schema/{api_version.split('/')[1]}.json",
        "title": f"slime-submit RLJob spec ({api_version})",
        "x-plugins": _plugins(),
        **msgspec.json.schema(Spec),
    }


@functools.cache
def schema_for(api_version: str) -> dict[str, Any]:
    """The schema of one spec version: the committed copy (a test keeps it equal to
    ``generate_schema``), read in ~1 ms instead of ~20 ms of type inspection on every CLI start."""
    if api_version != CURRENT:
        raise KeyError(api_version)
    try:
        committed = json.loads(committed_schema_path(api_version).read_text())
    except (OSError, ValueError):
        committed = None
    if committed is not None and committed.get("x-plugins") == _plugins():
        return committed
    return generate_schema(api_version)  # other plug-ins are installed: their sections are in it


def dump_schema(api_version: str = CURRENT) -> str:
    """The generated schema as JSON text (fields in declaration order, as ``explain`` lists them)."""
    return json.dumps(generate_schema(api_version), indent=2) + "\n"


@functools.cache
def _validator(api_version: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema_for(api_version))


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def origin_of(path: Path, marks: Marks) -> Origin | None:
    """The origin of ``path`` or of its nearest marked ancestor."""
    for n in range(len(path), -1, -1):
        o = marks.get(tuple(path[:n]))
        if o is not None:
            return o
    return None


def _deref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = root["$defs"][name]
    return schema


def _object_branches(schema: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    schema = _deref(schema, root)
    if "anyOf" in schema:
        out: list[dict[str, Any]] = []
        for s in schema["anyOf"]:
            out.extend(_object_branches(s, root))
        return out
    return [schema]


def subschema(api_version: str, path: Path) -> dict[str, Any] | None:
    """The schema of the field at ``path`` (list items for ints), or None if no such field."""
    root = schema_for(api_version)
    current: dict[str, Any] = root
    for part in path:
        nxt = None
        for branch in _object_branches(current, root):
            if isinstance(part, int) and "items" in branch:
                nxt = branch["items"]
            elif isinstance(part, str) and part in branch.get("properties", {}):
                nxt = branch["properties"][part]
            elif isinstance(part, str) and isinstance(branch.get("additionalProperties"), dict):
                nxt = branch["additionalProperties"]
            if nxt is not None:
                break
        if nxt is None:
            return None
        current = nxt
    return current


def field_names(api_version: str, path: Path) -> list[str]:
    sub = subschema(api_version, path)
    if sub is None:
        return []
    names: list[str] = []
    for branch in _object_branches(sub, schema_for(api_version)):
        names.extend(branch.get("properties", {}))
    return names


def _osa_distance(a: str, b: str) -> int:
    """Edit distance counting a swap of neighbours as one edit ('gpro' is 1 from 'grpo', 2 from 'gspo')."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[len(b)]


# Names users bring from Megatron / slime command-line flags (``--tensor-model-parallel-size``,
# ``--rollout-batch-size``) and common shorthands, with the spec field each one is. Edit distance alone
# could never find these (``tp`` is nowhere near ``tensor``).
FLAG_ALIASES = {
    "tp": "train.parallel.tensor",
    "tensor_model_parallel_size": "train.parallel.tensor",
    "tensor_parallel_size": "train.parallel.tensor",
    "pp": "train.parallel.pipeline",
    "pipeline_model_parallel_size": "train.parallel.pipeline",
    "pipeline_parallel_size": "train.parallel.pipeline",
    "cp": "train.parallel.context",
    "context_parallel_size": "train.parallel.context",
    "ep": "train.parallel.expert",
    "expert_model_parallel_size": "train.parallel.expert",
    "expert_parallel_size": "train.parallel.expert",
    "etp": "train.parallel.expert_tensor",
    "expert_tensor_parallel_size": "train.parallel.expert_tensor",
    "sp": "train.parallel.sequence_parallel",
    "actor_num_nodes": "train.nodes",
    "actor_num_gpus_per_node": "train.gpus_per_node",
    "lr": "train.optimizer.lr",
    "rollout_num_gpus": "rollout.gpus",
    "rollout_num_gpus_per_engine": "rollout.gpus_per_engine",
    "rollout_batch_size": "rollout.batch_size",
    "num_rollout": "rollout.num_rollouts",
    "num_rollouts": "rollout.num_rollouts",
    "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "rollout_max_prompt_len": "rollout.max_prompt_len",
    "rollout_max_response_len": "rollout.max_response_len",
    "rollout_temperature": "rollout.temperature",
    "rollout_top_p": "rollout.top_p",
    "rollout_top_k": "rollout.top_k",
    "temperature": "rollout.temperature",
    "global_batch_size": "train.global_batch_size",
    "micro_batch_size": "train.micro_batch_size",
    "advantage_estimator": "algorithm.estimator",
    "estimator": "algorithm.estimator",
    "kl_loss_coef": "algorithm.kl_loss_coef",
    "eps_clip": "algorithm.eps_clip",
    "hf_checkpoint": "model.path",
    "prompt_data": "data.prompts",
    "rm_type": "reward.type",
}


def suggest_field(word: str, at: Path, options: list[str]) -> str | None:
    """What to suggest for an unknown key ``word`` under ``at`` (valid keys there: ``options``).

    A flag name from :data:`FLAG_ALIASES` answers with its field: the bare name where that field is at
    ``at``, otherwise its full dotted path (``tp`` under ``train`` → ``train.parallel.tensor``). Any other
    word gets :func:`did_you_mean` among ``options``.
    """
    target = FLAG_ALIASES.get(word.lower().lstrip("-").replace("-", "_"))
    if target is not None:
        parent, _, name = target.rpartition(".")
        return name if parent == dotted(at) and name in options else target
    return did_you_mean(word, options)


def suggest_path(word: str, at: Path, options: list[str]) -> Path | None:
    """:func:`suggest_field` as the suggested field's full path (for hints that name whole paths)."""
    close = suggest_field(word, at, options)
    if close is None:
        return None
    return tuple(close.split(".")) if "." in close else at + (close,)


def did_you_mean(word: str, options: list[str]) -> str | None:
    """The option closest to ``word`` (a typo, a swap, a missing letter), or None if none is close."""
    if not options:
        return None
    lowered = word.lower()
    best = min(
        options,
        key=lambda o: (_osa_distance(lowered, o.lower()), -difflib.SequenceMatcher(None, lowered, o.lower()).ratio()),
    )
    if _osa_distance(lowered, best.lower()) <= max(1, len(word) // 3):
        return best
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return close[0] if close else None


def _describe(value: Any) -> str:
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):  # not JSON (already reported by slime.spec.values)
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _leaf_error(error):
    """For anyOf (Optional[...] fields) pick the branch error that is not about null."""
    from jsonschema.exceptions import best_match

    while error.validator in ("anyOf", "oneOf") and error.context:  # nested: an optional field in an optional section
        non_null = [e for e in error.context if e.schema.get("type") != "null"]
        error = best_match(non_null or error.context)
    return error


def schema_problems(api_version: str, data: Any, marks: Marks, *, task: int | None = None) -> list[Problem]:
    """Every JSON Schema violation in ``data``, as problems with origins and hints."""
    problems: list[Problem] = []
    reported_missing: set[tuple[Path, str]] = set()
    for error in _validator(api_version).iter_errors(data):
        err = _leaf_error(error)
        path: Path = tuple(err.absolute_path)
        if err.validator == "additionalProperties":
            problems += _unknown_keys(err, path, marks, task)
        elif err.validator == "required":
            problems += _missing_keys(api_version, err, path, marks, task, reported_missing)
        else:
            problems.append(_value_problem(error, err, path, marks, task))
    return problems


def _unknown_keys(err: Any, path: Path, marks: Marks, task: int | None) -> list[Problem]:
    allowed = list(err.schema.get("properties", {}))
    out = []
    for key in sorted(set(err.instance) - set(allowed)):
        close = suggest_field(key, path, allowed)
        hint = (f"did you mean '{close}'? " if close else "") + f"valid keys here: {', '.join(allowed)}"
        out.append(
            Problem(
                path=dotted(path + (key,)),
                message=f"unknown field '{key}'",
                hint=hint,
                origin=origin_of(path + (key,), marks),
                task=task,
            )
        )
    return out


def _missing_keys(
    api_version: str, err: Any, path: Path, marks: Marks, task: int | None, reported: set[tuple[Path, str]]
) -> list[Problem]:
    # jsonschema yields one error per missing key, each naming the whole list: report each key once
    missing = [k for k in err.validator_value if k not in err.instance and (path, k) not in reported]
    reported.update((path, k) for k in missing)
    out = []
    for key in missing:
        sub = err.schema.get("properties", {}).get(key, {})
        desc = _deref(sub, schema_for(api_version)).get("description") or sub.get("description")
        out.append(
            Problem(
                path=dotted(path + (key,)),
                message=f"required field '{key}' is missing",
                hint=f"add '{key}:' under '{dotted(path) or 'the top level'}'" + (f" ({desc})" if desc else ""),
                origin=origin_of(path, marks),
                task=task,
            )
        )
    return out


def _value_problem(error: Any, err: Any, path: Path, marks: Marks, task: int | None) -> Problem:
    """A wrong value: not one of the enum/const, the wrong type or format, or another schema keyword."""
    v, hint = err.validator, None
    if v == "enum":
        options = [str(o) for o in err.validator_value if o is not None]
        close = did_you_mean(str(err.instance), options)
        message = f"{_describe(err.instance)} is not a valid value"
        hint = (f"did you mean '{close}'? " if close else "") + f"valid values: {', '.join(options)}"
    elif v == "const":
        message = f"must be {err.validator_value!r}, got {_describe(err.instance)}"
        hint = f"supported: {err.validator_value}"
    elif v == "type":
        want = err.validator_value
        wants = want if isinstance(want, list) else [want]
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in wants)
        message = f"expected {words}, got {_describe(err.instance)}"
        if "string" in wants and isinstance(err.instance, (int, float)) and not isinstance(err.instance, bool):
            # YAML reads `time_limit: 30` or `mem: 500` as a number
            message += f" (a number in YAML; write it in quotes, '{err.instance}', to give the text)"
    elif v == "pattern":
        message = f"{_describe(err.instance)} has the wrong format"
    else:
        message = err.message
    if hint is None:
        desc = err.schema.get("description") or error.schema.get("description")
        hint = f"expected: {desc}" if desc else None
    return Problem(
        path=dotted(path if path else tuple(error.absolute_path)),
        message=message,
        hint=hint,
        origin=origin_of(path, marks),
        task=task,
    )


def value_problems(api_version: str, path: Path, value: Any, marks: Marks, *, task: int | None = None) -> list[Problem]:
    """Problems of one value placed at ``path`` (e.g. a sweep value), with the messages of ``schema_problems``.

    The value is validated inside an otherwise empty document; problems about
    the missing rest of that document (outside ``path``) are dropped.
    """
    doc: Any = value
    for part in reversed(path):
        doc = [{}] * part + [doc] if isinstance(part, int) else {part: doc}
    if not isinstance(doc, dict):
        return []
    prefix = dotted(path)
    return [
        p
        for p in schema_problems(api_version, doc, marks, task=task)
        if p.path == prefix or p.path.startswith((prefix + ".", prefix + "["))
    ]


def write_committed_schema() -> FsPath:
    SCHEMA_DIR.mkdir(exist_ok=True)
    target = committed_schema_path(CURRENT)
    target.write_text(dump_schema(CURRENT))
    return target


def committed_schema_path(api_version: str = CURRENT) -> FsPath:
    return SCHEMA_DIR / (api_version.split("/", 1)[1] + ".json")
