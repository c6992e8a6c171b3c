"""Map parsed slime flags onto slime/v1 spec paths (the logic behind ``slime.migrate.importer``).

``parse_flags`` splits shell words into flags and values; ``map_flag`` maps one flag through the
tables of ``slime.migrate.slime_flags``; ``finish`` maps the flags that depend on others, fills
slime's defaults where they differ, sizes the cluster and adds placeholders for required values.
Everything goes through a :class:`Builder`, which records each value's comment and the
mapped/unmapped account.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.migrate.bashargs import Word
from slime.migrate.flag_table import REMOVED, removed_reason
from slime.migrate.slime_flags import (
    ARCH_CONFIG,
    ARCHITECTURE,
    BOXED_RM_TYPES,
    DATA_PATH_FLAGS,
    DIRECT,
    DROPPABLE,
    MEGATRON_DROPPABLE,
    MEGATRON_REFUSED,
    MEGATRON_RENAMED,
    OPD_FLAGS,
    OPTIMIZER_OFFLOAD_FLAGS,
    PD_TRANSFER_FLAGS,
    PP_SIZE_FLAGS,
    RM_TYPES,
    RM_TYPES_REFUSED,
    SFT_FLAGS,
    SFT_REASON,
    SLIME_DEFAULTS,
    SLIME_ONLY,
    SPECIAL,
    slime_only_reason,
)


def sglang_reserved(key: str) -> str | None:
    """The SGLang flag slime-submit sets itself that ``key`` names (the sglang plug-in's table), or None."""
    from slime.spec.plugin import hook, profile

    return hook(profile("rollout_backend", "sglang"), "sglang_reserved")(key)


def unknown_flag(key: str) -> tuple[str, str] | None:
    """(message, hint) when ``key`` is not a flag of the pinned SGLang (the sglang plug-in's table), or None."""
    from slime.spec.plugin import hook, profile

    return hook(profile("rollout_backend", "sglang"), "unknown_flag")(key)


def unknown_megatron_option(key: str) -> tuple[str, str] | None:
    """(message, hint) when ``key`` is not an option train.megatron.args takes (the megatron plug-in's table)."""
    from slime.spec.plugin import hook, profile

    return hook(profile("train_backend", "megatron"), "unknown_option")(key)


__all__ = ["IMPLIED", "Builder", "Flag", "Key", "dedupe", "finish", "map_flag", "parse_flags"]

IMPLIED = "implied by model.path config.json"
_UNRESOLVED = re.compile(r"\$\(|\$\{|\$[A-Za-z_]")
_REPEATABLE = {"--rollout-sample-hook-path"}


@dataclass
class Flag:
    name: str
    values: list[str]
    line: int

    def shown(self) -> str:
        return " ".join([self.name] + [v if v and " " not in v else repr(v) for v in self.values])


Key = tuple[str, ...]


def _key(path: str | Key) -> Key:
    return path if isinstance(path, tuple) else tuple(path.split("."))


class Builder:
    def __init__(self) -> None:
        self.values: dict[Key, tuple[Any, str]] = {}  # spec path (parts, so keys may hold dots) -> value, comment
        self.mapped: list[tuple[str, str]] = []
        self.unmapped: list[tuple[str, str]] = []
        self.placeholders: list[tuple[str, str]] = []
        self.notes: list[tuple[str, str]] = []
        self.differences: list[tuple[str, str]] = []  # (flag as written, what slime computes that the spec does not)
        self.refused: list[tuple[str, str]] = []  # unmapped and changing what is trained: exit 2 unless dropped
        self.conflicts: list[tuple[str, str]] = []  # contradictions (flag vs flag or config.json): always exit 2
        self.implied: list[Flag] = []  # architecture flags, compared with config.json by ``finish``
        self.sft = False  # a supervised fine-tuning script: its SFT flags are refused as one (kind SFTJob)
        self.sft_job = False  # ... and it imports to a kind SFTJob spec (not refused as half SFT)

    def refuse(self, flag: str, why: str) -> None:
        """Not mapped, and the job would train something else without it."""
        self.unmapped.append((flag, why))
        self.refused.append((flag, why))

    def drop(self, flag: str, why: str) -> None:
        """Not mapped, and dropping it changes only speed, memory or logging (or slime ignores it too)."""
        self.unmapped.append((flag, why))

    def conflict(self, flag: str, why: str) -> None:
        """Two settings that cannot both hold: never resolved by picking one."""
        self.unmapped.append((flag, why))
        self.conflicts.append((flag, why))

    def set(self, path: str | Key, value: Any, comment: str) -> None:
        self.values[_key(path)] = (value, comment)

    def get(self, path: str, default: Any = None) -> Any:
        return self.values[_key(path)][0] if _key(path) in self.values else default

    def has(self, path: str) -> bool:
        return _key(path) in self.values

    def from_flag(self, f: Flag, path: str | Key, value: Any, note: str = "") -> None:
        self.set(path, value, f"{f.shown()} (line {f.line}){note}")
        self.mapped.append((f.name, ".".join(_key(path))))

    def placeholder(self, path: str, value: Any, why: str) -> None:
        self.set(path, value, f"PLACEHOLDER: {why}")
        self.placeholders.append((path, why))


# ----------------------------------------------------------------------------- flags
def parse_flags(words: list[Word]) -> tuple[list[Flag], list[Word]]:
    flags: list[Flag] = []
    strays: list[Word] = []
    for w in words:
        if w.text.startswith("--") and len(w.text) > 2:
            name, eq, value = w.text.partition("=")
            flags.append(Flag(name, [value] if eq else [], w.line))
        elif flags:
            flags[-1].values.append(w.text)
        else:
            strays.append(w)
    return flags, strays


def dedupe(flags: list[Flag], b: Builder) -> list[Flag]:
    last = {f.name: i for i, f in enumerate(flags)}
    out = []
    for i, f in enumerate(flags):
        if last[f.name] != i and f.name not in _REPEATABLE:
            b.drop(
                f.name, f"given again on line {flags[last[f.name]].line}; the last one wins (as in slime's argparse)"
            )
        else:
            out.append(f)
    return out


def _convert(f: Flag, kind: str) -> tuple[Any, str | None]:
    """The flag's value as ``kind``, or an error saying why it cannot be."""
    vals = f.values
    if kind == "bool":
        return True, (f"a switch, but followed by {' '.join(vals)!r}" if vals else None)
    if kind == "list":
        return (list(vals), None) if vals else (None, "needs at least one value")
    if len(vals) != 1:
        return None, ("needs a value" if not vals else f"takes one value, got {len(vals)}: {' '.join(vals)}")
    v = vals[0]
    if kind == "str":
        return v, None
    if _UNRESOLVED.search(v):
        return None, f"value {v!r} could not be resolved without running the script"
    try:
        out = int(v) if kind == "int" else float(v)
    except ValueError:
        return None, f"value {v!r} is not {'an integer' if kind == 'int' else 'a number'}"
    if isinstance(out, float) and not math.isfinite(out):
        return None, f"value {v!r} is not a finite number"
    return out, None


def _scalar(v: str) -> Any:
    """A pass-through value as YAML will hold it: int, float, bool switch, or text."""
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", v):
        return float(v)
    return v


def _pass_through(f: Flag, b: Builder, section: str, key: str, what: str, shown: str) -> None:
    """``section``: the slime/v1 path the flag table speaks; ``shown``: where the written spec has it.
    A value that cannot be passed on refuses the flag, unless the flag only tunes speed or memory."""
    speed_only = section == "rollout.engine_args" and key.startswith(SGLANG_SPEED_ONLY)
    if len(f.values) > 1:
        (b.drop if speed_only else b.refuse)(
            f.name,
            f"takes several values ({' '.join(f.values)}); {shown} holds one value per "
            f"{what} flag: add it by hand if the engine accepts a quoted list",
        )
    elif f.values and _UNRESOLVED.search(f.values[0]):
        (b.drop if speed_only else b.refuse)(
            f.name, f"value {f.values[0]!r} could not be resolved without running the script"
        )
    else:
        b.from_flag(f, _key(section) + (key,), _scalar(f.values[0]) if f.values else True)


# SGLang flags that tune only speed or memory (prefixes): dropped with a note when they cannot be passed on.
SGLANG_SPEED_ONLY = ("cuda-graph-", "mem-fraction-static", "chunked-prefill-size", "max-running-requests", "log-")

# Flags of slime's SGLang that the pinned one renamed: 0.5.23 split the CUDA-graph batch sizes into
# -decode and -prefill (the old ones were decode batch sizes), so the old name is now an ambiguous prefix.
_SGLANG_RENAMED = {"cuda-graph-max-bs": "cuda-graph-max-bs-decode", "cuda-graph-bs": "cuda-graph-bs-decode"}


def _sglang_pass_through(f: Flag, b: Builder, key: str) -> None:
    """``--sglang-<key>``: SGLang's ``--<key>`` when the pinned SGLang has it (validate refuses the others)."""
    key = _SGLANG_RENAMED.get(key, key)
    if (problem := unknown_flag(key)) is not None:
        b.refuse(f.name, problem[0])
        return
    _pass_through(f, b, "rollout.engine_args", key, "SGLang", "rollout.sglang.args")


def _plugin_path(dotted: str) -> str:
    """slime's 'pkg.mod.fn' as slime/v2's 'pkg.mod:fn'."""
    if ":" in dotted:
        return dotted
    module, _, fn = dotted.rpartition(".")
    return f"{module}:{fn}" if module else dotted


def is_sft(seen: dict[str, Flag]) -> bool:
    """slime's SFT recipe: the SFT loss, the SFT rollout function, or no advantages computed."""
    loss, fn = seen.get("--loss-type"), seen.get("--rollout-function-path")
    return (
        (loss is not None and loss.values == ["sft_loss"])
        or (fn is not None and any("sft_rollout" in v for v in fn.values))
        or "--disable-compute-advantages-and-returns" in seen
    )


def _refused_reason(f: Flag) -> str:
    """Why one of slime's own flags is refused, naming the mode its value selects."""
    if f.name == "--rollout-function-path" and any("sft_rollout" in v for v in f.values):
        return SFT_REASON
    if f.name in ("--rollout-function-path", "--data-source-path") and any("fully_async" in v for v in f.values):
        return (
            "fully-async mode through slime's example rollout function, whose staleness handling is its own "
            "code: write train.async: {mode: fully, max_staleness: K} by hand (groups more than K weight "
            "versions old are dropped)"
        )
    return slime_only_reason(f.name)


def map_flag(f: Flag, b: Builder, seen: dict[str, Flag]) -> None:
    name = f.name
    if b.sft and name in SFT_FLAGS:
        b.refuse(name, SFT_REASON)
    elif name in DIRECT:
        path, kind = DIRECT[name]
        value, error = _convert(f, kind)
        if value is None:
            b.refuse(name, error or "no value")
            return
        note = ""
        if kind == "str" and _UNRESOLVED.search(value):
            note = " -- contains an unexpanded shell variable: replace it"
            b.notes.append((value, f"{name}: shell expansion not resolved in the script"))
        b.from_flag(f, path, value, note)
        if error:
            b.refuse(" ".join(f.values), f"{error} (ignored)")
    elif name in SPECIAL:
        _special(f, b, seen)
    elif name in ARCHITECTURE:
        b.mapped.append((name, IMPLIED))
        b.implied.append(f)
    elif name in REMOVED:
        b.refuse(name, removed_reason(name))
    elif name in PP_SIZE_FLAGS:
        _pp_size(f, b, seen)
    elif name in SLIME_ONLY:
        (b.drop if name in DROPPABLE else b.refuse)(name, _refused_reason(f))
    elif name in PD_TRANSFER_FLAGS and "--prefill-num-servers" in seen and len(f.values) == 1:
        b.from_flag(f, PD_TRANSFER_FLAGS[name], f.values[0])
    elif name in PD_TRANSFER_FLAGS:
        b.drop(name, "a prefill/decode transfer setting without --prefill-num-servers: set it in rollout.sglang.pd")
    elif name.startswith("--sglang-") and (hit := sglang_reserved(name[len("--sglang-") :])) is not None:
        b.drop(
            name,
            f"slime-submit sets --{hit} itself from the spec and the layout (one engine per "
            "rollout.gpus_per_engine GPUs); its engines cannot take it from rollout.sglang.args",
        )
    elif name.startswith("--sglang-"):
        _sglang_pass_through(f, b, name[len("--sglang-") :])
    elif name.startswith("--router-"):
        b.drop(
            name,
            "slime-submit's rollout manager sends requests straight to the engines and spreads them itself "
            "(no sglang-router in the request path), so router settings have nothing to act on",
        )
    elif name == "--spec":  # slime's model-family layer spec: the megatron backend picks it from model_type
        b.mapped.append((name, IMPLIED + " (model_type; validate checks the backend supports it)"))
    else:
        _megatron_flag(f, b)


def _megatron_flag(f: Flag, b: Builder) -> None:
    """A Megatron flag slime passes through: a megatron-core option, its ``--no-`` form, or refused."""
    name = f.name
    negated = name.startswith("--no-") and not f.values and unknown_megatron_option(name[5:]) is None
    if negated:  # Megatron-LM's --no-<x> switches store False into <x>
        b.from_flag(f, ("train", "backend_args", name[5:]), False, " -- Megatron's --no- form of this option")
    elif name in MEGATRON_RENAMED and not f.values:
        option, value = MEGATRON_RENAMED[name]
        b.from_flag(f, ("train", "backend_args", option), value, " -- megatron-core's name for this Megatron flag")
    elif name in OPTIMIZER_OFFLOAD_FLAGS:
        pass  # ``finish`` maps the pair together
    elif name in MEGATRON_DROPPABLE:
        b.drop(name, MEGATRON_DROPPABLE[name])
    elif name in MEGATRON_REFUSED:
        b.refuse(name, MEGATRON_REFUSED[name])
    elif (problem := unknown_megatron_option(name[2:])) is not None:  # a Megatron-LM flag, not megatron-core's
        b.refuse(name, problem[0])
    else:  # a megatron-core option slime passes through
        _pass_through(f, b, "train.backend_args", name[2:], "Megatron", "train.megatron.args")


def _pp_size(f: Flag, b: Builder, seen: dict[str, Flag]) -> None:
    """SGLang's pipeline-parallel size (and its long alias) -> rollout.sglang.args.pp-size: an engine of
    rollout.gpus_per_engine GPUs then runs tensor parallel gpus_per_engine / pp-size, as slime does."""
    other = seen.get(PP_SIZE_FLAGS[1] if f.name == PP_SIZE_FLAGS[0] else PP_SIZE_FLAGS[0])
    if f.name == PP_SIZE_FLAGS[1] and other is not None and other.values != f.values:
        b.conflict(
            f.name,
            f"{f.shown()} (line {f.line}) and {other.shown()} (line {other.line}) name one setting with two "
            "values: keep one",
        )
        return
    if f.name == PP_SIZE_FLAGS[1] and other is not None:
        b.mapped.append((f.name, "rollout.engine_args.pp-size (the same value as --sglang-pp-size)"))
        return
    value, error = _convert(f, "int")
    if value is None:
        b.refuse(f.name, error or "needs one value")
        return
    b.from_flag(
        f, ("rollout", "engine_args", "pp-size"), value, " -- SGLang pipeline stages: tp = gpus_per_engine / pp"
    )


_SWITCHES = {
    "--bf16",
    "--fp16",
    "--disable-grpo-std-normalization",
    "--use-kl-loss",
    "--use-wandb",
    "--calculate-per-token-loss",
}


def _special(f: Flag, b: Builder, seen: dict[str, Flag]) -> None:
    name, vals = f.name, f.values
    one = vals[0] if len(vals) == 1 else None
    if name in _SWITCHES and vals:
        b.refuse(" ".join(vals), f"value(s) after the switch {name} (line {f.line}), ignored")
    if name == "--rm-type" and one is None:
        b.refuse(name, "needs one value")
    elif name == "--rm-type":
        _rm_type(f, one or "", b)
    elif name == "--custom-rm-path" and one is None:
        b.refuse(name, "needs one value: the reward function's dotted path")
    elif name == "--custom-rm-path":
        b.from_flag(f, "reward.custom", _plugin_path(one))
        b.set("reward.type", "custom", f"implied by {name} (line {f.line})")
    elif name in DATA_PATH_FLAGS:
        _data_path_flag(f, one, b)
    elif name == "--train-backend":
        if one == "megatron":
            b.from_flag(f, "train.backend", "megatron")
        else:
            b.refuse(name, f"train backend {one!r} has no slime/v2 equivalent (torch or megatron)")
    elif name in ("--bf16", "--fp16"):
        b.from_flag(f, "train.precision", name[2:])
    elif name == "--optimizer":
        if one == "adam":
            b.from_flag(f, "train.optimizer.name", "adam")
        else:
            b.refuse(name, f"optimizer {one!r}: slime/v2 trains with Adam(W) only")
    elif name == "--lr-decay-style":
        if one in ("constant", "cosine", "linear"):
            b.from_flag(f, "train.optimizer.lr_schedule", one)
        else:
            b.refuse(name, f"lr decay style {one!r}: slime/v2 has constant, cosine and linear")
    elif name == "--disable-grpo-std-normalization":
        b.from_flag(f, "algorithm.normalize_std", False)
    elif name == "--loss-type" and one == "policy_loss":
        b.mapped.append((name, "algorithm.estimator (slime's default RL policy loss)"))
    elif name == "--loss-type":
        b.refuse(
            name,
            f"slime's {' '.join(vals) or 'empty'} loss (sft_loss: a supervised fine-tuning job; value_loss: a "
            "critic; custom_loss: a plug-in) has no slime/v2 equivalent: the imported spec trains the RL "
            "policy loss of algorithm.estimator, a different job",
        )
    elif name == "--calculate-per-token-loss":
        b.from_flag(f, "algorithm.loss_agg", "token_mean", " -- slime's mean over every trained token of the step")
    elif name == "--save-hf":
        b.from_flag(f, "train.checkpoint.save_hf", True, " -- the HF copy is written into the run dir")
    elif name == "--train-env-vars":
        _train_env_vars(f, b)
    # The rest (--use-kl-loss, --kl-loss-coef, betas, --load, --ref-load, eval, wandb, weight
    # updates) depend on other flags: ``finish`` maps them once every flag is known.


def _train_env_vars(f: Flag, b: Builder) -> None:
    """``--train-env-vars '{"K": "V"}'``: each variable into ``cluster.env``."""
    name = f.name
    try:
        env = json.loads(" ".join(f.values))
        if not isinstance(env, dict):
            raise ValueError
    except ValueError:
        b.refuse(name, "not a JSON object of environment variables")
        return
    for k, v in env.items():
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            b.from_flag(f, ("cluster", "env", k), str(v))
        else:
            b.refuse(name, f"{k!r} is not an environment variable name")


def _rm_type(f: Flag, kind: str, b: Builder) -> None:
    boxed = kind.startswith("boxed_")
    entry = (BOXED_RM_TYPES if boxed else RM_TYPES).get(kind.removeprefix("boxed_"))
    if entry is None and boxed:
        b.refuse(
            f.name,
            f"slime's {kind!r} grades only the \\boxed{{}} content of the response (boxed_math and "
            "boxed_deepscaler then almost never score); slime/v2 has no such variant: port it as "
            "reward.type: custom",
        )
    elif entry is None:
        why = RM_TYPES_REFUSED.get(kind, f"no built-in {kind!r} reward in slime/v2: port it as reward.type: custom")
        b.refuse(f.name, why)
    else:
        reward_type, differs = entry
        b.from_flag(
            f, "reward.type", reward_type, " -- scored differently: see 'Differs from slime' below" * bool(differs)
        )
        if differs:
            b.differences.append((f.shown(), differs))


def _data_path_flag(f: Flag, one: str | None, b: Builder) -> None:
    """Dynamic sampling, debug modes and saved rollouts (eval sampling and pass@k: ``finish``, per eval set)."""
    name = f.name
    if name == "--dynamic-sampling-filter-path":
        _dynamic_filter(f, one, b)
    elif name in ("--debug-rollout-only", "--debug-train-only"):
        b.from_flag(f, "debug.mode", "rollout_only" if name == "--debug-rollout-only" else "train_only")
    elif name == "--save-debug-rollout-data":
        b.from_flag(f, "debug.save_rollouts", True, " -- Parquet files in the run dir, see 'Differs from slime'")
        b.differences.append(
            (
                f.shown(),
                "slime torch.saves each rollout's samples to this path template; slime-submit writes one Parquet "
                "file per rollout (pandas-readable) to the run dir's tasks/<i>/rollouts/ and ignores the path",
            )
        )
    elif name == "--load-debug-rollout-data":
        _load_rollouts(f, one, b)


_SLIME_FILTERS = {
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std": "nonzero_std",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std_with_fallback": (
        "nonzero_std_with_fallback"
    ),
}


def _dynamic_filter(f: Flag, one: str | None, b: Builder) -> None:
    if one is None:
        b.refuse(f.name, "needs one value: the filter function's dotted path")
        return
    builtin = _SLIME_FILTERS.get(one)
    b.from_flag(
        f, "rollout.dynamic_sampling.filter", builtin or _plugin_path(one), " -- slime's built-in" * bool(builtin)
    )
    b.differences.append(
        (
            f.shown(),
            "slime draws over-sampling batches until rollout_batch_size groups pass (forever if none do) and keeps "
            "the first groups to finish; slime-submit draws at most rollout.dynamic_sampling.max_rounds batches "
            "(4), then trains on the groups that passed, and keeps the first passing groups in draw order",
        )
    )


def _load_rollouts(f: Flag, one: str | None, b: Builder) -> None:
    if one is None:
        b.refuse(f.name, "needs one value: the saved rollouts' path (template)")
        return
    where = one.rsplit("/", 1)[0] if ("{" in one or one.endswith(".pt")) and "/" in one else one
    b.set("debug.mode", "train_only", f"implied by {f.name} (line {f.line}), as in slime")
    b.placeholder(
        "debug.load_rollouts",
        where,
        "slime's torch.save dumps are not read: point it at a tasks/<i>/rollouts dir that slime-submit saved "
        "(debug.save_rollouts: true)",
    )
    b.mapped.append((f.name, "debug.load_rollouts"))


# ----------------------------------------------------------------------------- cross-flag mapping
def _num(f: Flag | None, kind: str, b: Builder) -> Any:
    if f is None:
        return None
    value, error = _convert(f, kind)
    if value is None:
        b.refuse(f.name, error or "no value")
    return value


def finish(b: Builder, seen: dict[str, Flag], name: str | None) -> None:
    """Map the flags whose meaning depends on others, fill slime's defaults, size the cluster, name the job."""
    _architecture(b)
    _kl(b, seen)
    _betas(b, seen)
    _optimizer_offload(b, seen)
    _critic_only(b, seen)
    _opd(b, seen)
    _resume(b, seen)
    _reward_key(b, seen.get("--reward-key"))
    _weight_sync(b, seen)
    _eval_sets(b, seen)
    _wandb(b, seen)
    _length_limits(b)
    for path, (value, why) in SLIME_DEFAULTS.items():
        if not b.has(path):
            b.set(path, value, f"{why} (flag absent)")
    _cluster(b, seen)
    _required(b)
    b.set("name", name or _job_name(b), "from --name" if name else "derived from the model directory")


def _hf_config(path: Any) -> dict[str, Any] | None:
    try:
        config = json.loads((Path(str(path)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _architecture(b: Builder) -> None:
    """Each architecture flag against model.path's config.json where readable: a contradiction names both."""
    path = b.get("model.path")
    config = _hf_config(path) if b.implied and path else None
    if b.implied and config is None:
        b.notes.append(
            ("architecture flags", f"not compared with config.json: {path}/config.json is not readable here")
        )
    for f in b.implied if config is not None else []:
        key = next((k for k in ARCH_CONFIG.get(f.name, ()) if k in config), None)
        want = config.get(key) if key else None
        if len(f.values) != 1 or isinstance(want, bool) or not isinstance(want, (int, float)):
            continue  # a switch, a structural flag, or a value config.json does not hold
        try:
            given = float(f.values[0])
        except ValueError:
            continue  # an unexpanded shell variable: nothing to compare
        if not math.isclose(given, float(want), rel_tol=1e-9):
            b.conflict(
                f.name,
                f"{f.shown()} (line {f.line}) contradicts {path}/config.json {key} = {want}: the model is built "
                "from config.json; fix the flag or point --hf-checkpoint at the checkpoint it describes",
            )


def _kl(b: Builder, seen: dict[str, Flag]) -> None:
    """The KL loss and its coefficient, the KL estimator's difference, and the reference model."""
    # slime applies --kl-loss-coef only with --use-kl-loss.
    use_kl, coef = seen.get("--use-kl-loss"), seen.get("--kl-loss-coef")
    coef_value = _num(coef, "float", b)
    if use_kl:
        b.mapped.append(("--use-kl-loss", "algorithm.kl_loss_coef"))
    if coef is not None and coef_value is not None:
        if use_kl or coef_value == 0:
            b.from_flag(coef, "algorithm.kl_loss_coef", coef_value)
        else:
            b.drop("--kl-loss-coef", "slime ignores it without --use-kl-loss")
    kl_type = b.get("algorithm.kl_loss_type", "k1")  # slime's default when absent
    if (b.get("algorithm.kl_coef", 0) or 0) > 0 and kl_type != "k1":
        b.differences.append(
            (
                seen["--kl-loss-type"].shown(),
                f"slime also estimates the KL folded into the reward (--kl-coef) with {kl_type}; slime/v2 "
                "estimates that one with k1 (algorithm.kl_loss_type applies to the KL loss only), so the "
                "reward penalty differs",
            )
        )
    kl_used = (b.get("algorithm.kl_coef", 0) or 0) > 0 or (b.get("algorithm.kl_loss_coef", 0) or 0) > 0
    ref = seen.get("--ref-load")
    if ref is not None:
        if kl_used:
            b.from_flag(
                ref,
                "model.ref_path",
                "initial",
                " -- slime's Megatron copy of the starting weights; 'initial' anchors KL to the starting policy",
            )
        else:
            b.mapped.append(("--ref-load", "model.path (slime starts the actor from it; the HF checkpoint is used)"))
    elif kl_used:
        b.placeholder("model.ref_path", "initial", "KL needs a reference model and the input has no --ref-load")


def _betas(b: Builder, seen: dict[str, Flag]) -> None:
    """Adam's betas: the flags given, Megatron's default for a missing one."""
    betas = [seen.get("--adam-beta1"), seen.get("--adam-beta2")]
    pair = [_num(f, "float", b) for f in betas]
    if any(v is not None for v in pair):
        value = [pair[0] if pair[0] is not None else 0.9, pair[1] if pair[1] is not None else 0.999]
        used = [f for f, v in zip(betas, pair) if f is not None and v is not None]
        shown = ", ".join(f"{f.shown()} (line {f.line})" for f in used)
        b.set("train.optimizer.betas", value, shown + ("" if len(used) == 2 else "; the other is Megatron's default"))
        b.mapped.extend((f.name, "train.optimizer.betas") for f in used)
    else:
        b.set("train.optimizer.betas", [0.9, 0.999], "Megatron's --adam-beta1/--adam-beta2 defaults")


def _optimizer_offload(b: Builder, seen: dict[str, Flag]) -> None:
    """--optimizer-cpu-offload [--optimizer-offload-fraction F]: F (Megatron-LM's default 1.0) of the optimizer
    on the host; the fraction alone offloads nothing in Megatron-LM."""
    on, frac = (seen.get(name) for name in OPTIMIZER_OFFLOAD_FLAGS)
    if on is None:
        if frac is not None:
            b.drop(frac.name, "without --optimizer-cpu-offload Megatron-LM offloads nothing (memory only)")
        return
    if on.values:
        b.refuse(" ".join(on.values), f"value(s) after the switch {on.name} (line {on.line}), ignored")
    value = 1.0 if frac is None else _num(frac, "float", b)
    if value is None:
        return
    if not 0.0 <= value <= 1.0:
        b.refuse(frac.name, f"{value} is not a fraction between 0 and 1")
        return
    b.from_flag(on, ("train", "megatron", "optimizer_offload"), value, "" if frac else " -- Megatron-LM's fraction 1.0")
    if frac is not None:
        b.mapped.append((frac.name, "train.megatron.optimizer_offload"))


def _critic_only(b: Builder, seen: dict[str, Flag]) -> None:
    """--num-critic-only-steps N: only the critic trains over the first N rollouts (slime has a critic for ppo only)."""
    f = seen.get("--num-critic-only-steps")
    n = _num(f, "int", b)
    if f is None or n is None:
        return
    if n < 0:
        b.refuse(f.name, f"{n} rollouts: a count cannot be negative")
    elif b.get("algorithm.estimator") != "ppo":
        b.drop(f.name, "slime trains a critic only with --advantage-estimator ppo and ignores it otherwise")
    else:
        b.from_flag(f, "algorithm.critic.warmup_rollouts", n)


def _opd(b: Builder, seen: dict[str, Flag]) -> None:
    """--use-opd --opd-type megatron --opd-teacher-load T [--opd-kl-coef K] -> algorithm.opd (the teacher forwarded
    on the trainer ranks); slime's sglang type asks a teacher server the job does not start: refused."""
    use, kind, coef, load = (seen.get(name) for name in OPD_FLAGS)
    if use is None:
        for f in (kind, coef, load):
            if f is not None:
                b.drop(f.name, "slime reads it only with --use-opd")
        return
    one = kind.values[0] if kind is not None and len(kind.values) == 1 else None
    rest = [f for f in (kind, coef, load) if f is not None]
    if one != "megatron":
        b.refuse(use.name, _OPD_REFUSED.get(one, f"--opd-type {one!r} is not one of slime's sglang and megatron"))
        for f in rest:
            b.drop(f.name, "part of the refused --use-opd")
        return
    teacher = load.values[0] if load is not None and len(load.values) == 1 else None
    if teacher is None:
        b.refuse(use.name, "--opd-type megatron needs one --opd-teacher-load (slime requires it)")
        return
    if _hf_config(teacher) is not None:  # an HF directory is what algorithm.opd.teacher takes
        b.from_flag(load, ("algorithm", "opd", "teacher"), teacher)
    else:
        why = f"--opd-teacher-load {teacher} is a Megatron checkpoint (or not readable here): give the teacher's HF dir"
        b.placeholder("algorithm.opd.teacher", "/path/to/teacher-hf", why)
        b.mapped.append((load.name, "algorithm.opd.teacher (a placeholder: see the header)"))
    b.from_flag(kind, ("algorithm", "opd", "type"), "trainer", " -- the teacher forwarded on the trainer ranks")
    b.mapped.append((use.name, "algorithm.opd"))
    kl = _num(coef, "float", b)
    if coef is not None and kl is not None:
        b.from_flag(coef, ("algorithm", "opd", "kl_coef"), kl)


_OPD_REFUSED = {
    None: "--use-opd needs one --opd-type (sglang or megatron; slime requires it)",
    "sglang": "slime's sglang OPD type scores with a teacher SGLang server the job does not start (--rm-url and "
    "its OPD reward hooks); slime-submit's algorithm.opd.type engine starts its own teacher engine, on the "
    "built-in rollout backend only: use --opd-type megatron (algorithm.opd.type: trainer)",
}


def _resume(b: Builder, seen: dict[str, Flag]) -> None:
    """``--load``: resuming in the save directory, or a checkpoint to start from."""
    load, save = seen.get("--load"), seen.get("--save")
    if load is not None and len(load.values) != 1:
        b.refuse("--load", "needs one value: the checkpoint directory")
    elif load is not None:
        if save is not None and save.values and load.values[0].rstrip("/") == save.values[0].rstrip("/"):
            b.mapped.append(("--load", "train.checkpoint.dir (resumes from the newest checkpoint there)"))
        else:
            b.from_flag(load, "train.checkpoint.load", load.values[0])


def _length_limits(b: Builder) -> None:
    """slime filters no prompt and caps no response unless told; slime/v2 always has both limits."""
    ctx, response = b.get("model.max_context_len"), b.get("rollout.max_response_len")
    room = ctx - response if isinstance(ctx, int) and isinstance(response, int) else 0
    if not b.has("rollout.max_prompt_len") and room >= 1:
        b.set(
            "rollout.max_prompt_len",
            room,
            "slime filters no prompt (flag absent): the longest that leaves max_response_len in the context "
            "(SGLang refuses longer ones)",
        )
    elif not b.has("rollout.max_prompt_len"):
        b.differences.append(
            (
                "--rollout-max-prompt-len (absent)",
                "slime keeps every prompt; slime/v2 skips prompts longer than rollout.max_prompt_len (512 unless "
                "set): set it above your longest prompt",
            )
        )
    if not b.has("rollout.max_response_len"):
        b.differences.append(
            (
                "--rollout-max-response-len (absent)",
                "slime sends no max_new_tokens (the engine's default applies); slime/v2 stops responses at "
                "rollout.max_response_len (1024 unless set)",
            )
        )


def _reward_key(b: Builder, key: Flag | None) -> None:
    """slime's dapo grader returns {score, acc, pred}: slime needs --reward-key score; slime/v2's dapo is the score."""
    value = key.values[0] if key is not None and len(key.values) == 1 else None
    if b.get("reward.type") == "dapo":
        if key is None:
            b.differences.append(
                (
                    "--rm-type dapo",
                    "slime needs --reward-key score with it (its grader returns a dict); slime/v2 "
                    "rewards the score (+1/-1)",
                )
            )
        elif value == "score":
            b.mapped.append((key.name, "reward.type dapo (its +1/-1 score)"))
        else:
            b.refuse(
                key.name,
                f"slime would reward dapo's {' '.join(key.values)!r}; slime/v2's dapo reward is its score (+1/-1)",
            )
    elif key is not None and value and b.get("reward.type") in ("custom", "remote"):
        b.from_flag(key, "reward.key", value)
    elif key is not None:
        b.refuse(
            key.name,
            "slime picks this key out of a reward returned as a dict; slime/v2's built-in rewards return "
            "numbers (reward.key is for custom and remote rewards)",
        )


def _weight_sync(b: Builder, seen: dict[str, Flag]) -> None:
    """``--update-weight-mode``/``--update-weight-transport``, refused where slime refuses them (no setting
    turns into another): delta needs the disk transport and separate engines."""
    mode, transport = seen.get("--update-weight-mode"), seen.get("--update-weight-transport")
    delta = mode is not None and mode.values == ["delta"]
    if delta and transport is not None and transport.values != ["disk"]:
        b.conflict(
            transport.name,
            f"{mode.shown()} (line {mode.line}) needs --update-weight-transport disk, but the script gives "
            f"{transport.shown()} (line {transport.line}); slime refuses the pair too: give disk or drop delta",
        )
        return
    if delta and b.get("rollout.colocate"):
        b.conflict(
            mode.name,
            f"{mode.shown()} (line {mode.line}) with --colocate: colocated engines are updated in memory and "
            "slime refuses delta updates there too; drop --update-weight-mode delta or --colocate",
        )
        return
    for f in (mode, transport):
        if f is None:
            continue
        if b.get("rollout.colocate"):
            b.drop(f.name, "colocated engines are updated in memory; no transport to choose")
        elif f is mode:
            if delta:
                b.from_flag(f, "rollout.weight_sync", "delta")
            elif f.values == ["full"]:
                b.mapped.append((f.name, "rollout.weight_sync (full updates are the default)"))
            else:
                b.refuse(f.name, f"mode {' '.join(f.values)!r}: slime has full and delta")
        elif not delta:
            if f.values and f.values[0] in ("nccl", "disk"):
                b.from_flag(f, "rollout.weight_sync", f.values[0])
            else:
                b.refuse(f.name, f"transport {' '.join(f.values)!r}: slime/v2 has nccl, disk and delta")
        else:
            b.mapped.append((f.name, "rollout.weight_sync (delta updates travel over disk)"))


# slime's eval flags that set one field of every eval set: flag -> (field, kind)
_EVAL_EXTRAS = {
    "--eval-interval": ("interval", "int"),
    "--n-samples-per-eval-prompt": ("n_samples_per_prompt", "int"),
    "--eval-temperature": ("temperature", "float"),
    "--eval-max-response-len": ("max_response_len", "int"),
    "--eval-top-p": ("top_p", "float"),
    "--eval-top-k": ("top_k", "int"),
}


def _eval_sets(b: Builder, seen: dict[str, Flag]) -> None:
    data = seen.get("--eval-prompt-data")
    extras = {n: seen.get(n) for n in _EVAL_EXTRAS}
    passrate = seen.get("--log-passrate")
    if passrate is not None and (data is None or not data.values):
        b.drop(passrate.name, "slime/v2 logs pass@k for eval sets (data.eval[*].pass_at_k); none given")
    if data is not None and not data.values:
        b.refuse(data.name, "needs values: NAME PATH [NAME PATH ...] or a PATH")
    if data is None or not data.values:
        for n, f in extras.items():
            if f is not None:
                b.drop(n, "no --eval-prompt-data to apply it to (slime ignores it too)")
        return
    vals = data.values
    pairs = (
        [(vals[i], vals[i + 1]) for i in range(0, len(vals) - 1, 2)]
        if len(vals) > 1
        else [(re.sub(r"\.\w+$", "", vals[0].rsplit("/", 1)[-1]), vals[0])]
    )
    given = {_EVAL_EXTRAS[n][0]: _num(f, _EVAL_EXTRAS[n][1], b) for n, f in extras.items() if f is not None}
    interval, temperature = given.get("interval"), given.get("temperature")
    sets = []
    for set_name, path in pairs:
        item: dict[str, Any] = {"name": re.sub(r"[^A-Za-z0-9_.-]", "-", set_name) or "eval", "path": path}
        item.update({k: v for k, v in given.items() if v is not None})
        if interval is None and b.get("rollout.num_rollouts"):  # slime evaluates periodically only with it
            item["interval"] = b.get("rollout.num_rollouts")
        item["temperature"] = temperature if temperature is not None else b.get("rollout.temperature", 1.0)
        n = item.get("n_samples_per_prompt", 1)
        if passrate is not None and n > 1:  # slime's k: 1, 2, 4, ... up to n
            item["pass_at_k"] = [2**i for i in range(n.bit_length()) if 2**i <= n]
        sets.append(item)
    if passrate is not None:
        _passrate(b, passrate, any("pass_at_k" in s for s in sets))
    comment = f"{data.shown()} (line {data.line})"
    if interval is None:
        comment += "; no --eval-interval: evaluated at the end only"
    if temperature is None:
        comment += "; temperature: slime's eval default (the rollout temperature)"
    b.set("data.eval", sets, comment)
    b.mapped.append(("--eval-prompt-data", "data.eval"))
    b.mapped.extend((n, "data.eval[*]") for n, f in extras.items() if f is not None)


def _passrate(b: Builder, f: Flag, applied: bool) -> None:
    if not applied:
        b.drop(f.name, "pass@k needs more than one sample per eval prompt (--n-samples-per-eval-prompt)")
        return
    b.mapped.append((f.name, "data.eval[*].pass_at_k"))
    b.differences.append(
        (
            f.shown(),
            "slime also logs passrate/pass@k of the training rollouts and names eval keys eval/<set>-pass@k; "
            "slime-submit logs eval/<set>/pass@k for the eval sets only",
        )
    )


def _wandb(b: Builder, seen: dict[str, Flag]) -> None:
    use, mode, key = seen.get("--use-wandb"), seen.get("--wandb-mode"), seen.get("--wandb-key")
    if mode is not None and mode.values and mode.values[0] in ("online", "offline", "disabled"):
        b.from_flag(mode, "logging.wandb.mode", mode.values[0])
    elif mode is not None:
        b.drop(mode.name, f"W&B mode {' '.join(mode.values)!r}: slime/v2 has online, offline, disabled")
    if use is not None:
        b.mapped.append((use.name, "logging.wandb.mode"))
        if not b.has("logging.wandb.mode"):
            b.set("logging.wandb.mode", "online", f"--use-wandb (line {use.line})")
    elif not b.has("logging.wandb.mode"):
        b.set("logging.wandb.mode", "disabled", "slime logs to W&B only with --use-wandb (flag absent)")
    if key is not None:
        b.set(
            "cluster.secrets.WANDB_API_KEY",
            {"env": "WANDB_API_KEY"},
            f"--wandb-key (line {key.line}): the key itself is not copied; export WANDB_API_KEY when submitting",
        )
        b.mapped.append((key.name, "cluster.secrets.WANDB_API_KEY (a reference; the value is not copied)"))


def _cluster(b: Builder, seen: dict[str, Flag]) -> None:
    nodes, per_node = b.get("train.nodes") or 1, b.get("train.gpus_per_node") or 0
    actor = nodes * per_node
    colocate = bool(b.get("rollout.colocate"))
    # no engines to place: training on saved rollouts, an SFT job without eval generations (slime.spec.resolve),
    # or engines the job does not start (external)
    engines = b.get("debug.mode") != "train_only" and not (b.sft_job and not b.has("data.eval"))
    engines = engines and not b.has("rollout.external")
    if engines and not colocate and b.get("rollout.gpus") is None:
        b.placeholder(
            "rollout.gpus",
            b.get("rollout.gpus_per_engine") or 1,
            "a disaggregated run (no --colocate) needs --rollout-num-gpus",
        )
    rollout = (b.get("rollout.gpus") or 0) if engines else 0
    gpn = b.get("cluster.gpus_per_node")
    if gpn is None:
        gpn = max(per_node, 8)
        b.set("cluster.gpus_per_node", gpn, "slime's --num-gpus-per-node default; set your nodes' GPU count")
    total = max(actor, rollout) if colocate else actor + rollout
    cluster_nodes = max(1, -(-total // gpn)) if gpn else nodes
    b.set(
        "cluster.nodes",
        cluster_nodes,
        f"derived: {'max(actor, rollout)' if colocate else 'actor + rollout'} = {total} GPUs / {gpn} per node",
    )
    b.set(
        "cluster.launcher",
        "local" if cluster_nodes == 1 else "slurm",
        "slime scripts start Ray by hand: 'local' runs on this machine, 'slurm' submits with sbatch",
    )


def _required(b: Builder) -> None:
    if b.get("model.path") is None:
        b.placeholder(
            "model.path",
            "/path/to/hf-checkpoint",
            "no --hf-checkpoint in the input; the HF-format checkpoint directory",
        )
    if b.get("data.prompts") is None:
        b.placeholder("data.prompts", "/path/to/prompts.jsonl", "no --prompt-data in the input; a JSONL file")
    if b.get("rollout.num_rollouts") is None and b.get("rollout.epochs") is None:
        b.placeholder("rollout.num_rollouts", 100, "no --num-rollout or --num-epoch in the input")
    if b.get("reward.type") is None:
        b.placeholder("reward.type", "exact", "no --rm-type or --custom-rm-path in the input")


def _job_name(b: Builder) -> str:
    placeholder = any(path == "model.path" for path, _ in b.placeholders)
    model = "" if placeholder else str(b.get("model.path") or "").rstrip("/").rsplit("/", 1)[-1]
    base = "-".join(x for x in (model, str(b.get("algorithm.estimator") or "grpo")) if x)
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:63].strip("-")
    return slug or "slime-import"
