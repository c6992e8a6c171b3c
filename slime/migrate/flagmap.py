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
from typing import Any

from slime.migrate.bashargs import Word
from slime.migrate.slime_flags import (
    ARCHITECTURE,
    BOXED_RM_TYPES,
    DATA_PATH_FLAGS,
    DIRECT,
    RM_TYPES,
    RM_TYPES_REFUSED,
    SLIME_DEFAULTS,
    SLIME_ONLY,
    SLIME_SGLANG_OWN,
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
            b.unmapped.append(
                (f.name, f"given again on line {flags[last[f.name]].line}; the last one wins (as in slime's argparse)")
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
    """``section``: the slime/v1 path the flag table speaks; ``shown``: where the written spec has it."""
    if len(f.values) > 1:
        b.unmapped.append(
            (
                f.name,
                f"takes several values ({' '.join(f.values)}); {shown} holds one value per "
                f"{what} flag: add it by hand if the engine accepts a quoted list",
            )
        )
    elif f.values and _UNRESOLVED.search(f.values[0]):
        b.unmapped.append((f.name, f"value {f.values[0]!r} could not be resolved without running the script"))
    else:
        b.from_flag(f, _key(section) + (key,), _scalar(f.values[0]) if f.values else True)


# Flags of slime's SGLang that the pinned one renamed: 0.5.23 split the CUDA-graph batch sizes into
# -decode and -prefill (the old ones were decode batch sizes), so the old name is now an ambiguous prefix.
_SGLANG_RENAMED = {"cuda-graph-max-bs": "cuda-graph-max-bs-decode", "cuda-graph-bs": "cuda-graph-bs-decode"}


def _sglang_pass_through(f: Flag, b: Builder, key: str) -> None:
    """``--sglang-<key>``: SGLang's ``--<key>`` when the pinned SGLang has it (validate refuses the others)."""
    key = _SGLANG_RENAMED.get(key, key)
    if (problem := unknown_flag(key)) is not None:
        b.unmapped.append((f.name, problem[0]))
        return
    _pass_through(f, b, "rollout.engine_args", key, "SGLang", "rollout.sglang.args")


def _plugin_path(dotted: str) -> str:
    """slime's 'pkg.mod.fn' as slime/v2's 'pkg.mod:fn'."""
    if ":" in dotted:
        return dotted
    module, _, fn = dotted.rpartition(".")
    return f"{module}:{fn}" if module else dotted


def map_flag(f: Flag, b: Builder, seen: dict[str, Flag]) -> None:
    name = f.name
    if name in DIRECT:
        path, kind = DIRECT[name]
        value, error = _convert(f, kind)
        if value is None:
            b.unmapped.append((name, error or "no value"))
            return
        note = ""
        if kind == "str" and _UNRESOLVED.search(value):
            note = " -- contains an unexpanded shell variable: replace it"
            b.notes.append((value, f"{name}: shell expansion not resolved in the script"))
        b.from_flag(f, path, value, note)
        if error:
            b.unmapped.append((" ".join(f.values), f"{error} (ignored)"))
    elif name in SPECIAL:
        _special(f, b, seen)
    elif name in ARCHITECTURE:
        b.mapped.append((name, IMPLIED))
    elif name in SLIME_SGLANG_OWN:
        b.unmapped.append((name, SLIME_SGLANG_OWN[name]))
    elif name.startswith("--sglang-") and (hit := sglang_reserved(name[len("--sglang-") :])) is not None:
        b.unmapped.append(
            (
                name,
                f"slime-submit sets --{hit} itself from the spec and the layout (one engine per "
                "rollout.gpus_per_engine GPUs); its engines cannot take it from rollout.sglang.args",
            )
        )
    elif name.startswith("--sglang-"):
        _sglang_pass_through(f, b, name[len("--sglang-") :])
    elif name.startswith("--router-"):
        b.unmapped.append(
            (
                name,
                "slime-submit's rollout manager sends requests straight to the engines and spreads them itself "
                "(no sglang-router in the request path), so router settings have nothing to act on",
            )
        )
    elif name in SLIME_ONLY:
        b.unmapped.append((name, slime_only_reason(name)))
    elif name == "--spec":
        b.unmapped.append(
            (
                name,
                "a custom Megatron layer spec: the megatron backend builds the model from "
                "model.path's config.json; check it supports this model",
            )
        )
    elif (problem := unknown_megatron_option(name[2:])) is not None:  # a Megatron-LM flag, not megatron-core's
        b.unmapped.append((name, problem[0]))
    else:  # a megatron-core option slime passes through
        _pass_through(f, b, "train.backend_args", name[2:], "Megatron", "train.megatron.args")


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
        b.unmapped.append((" ".join(vals), f"value(s) after the switch {name} (line {f.line}), ignored"))
    if name == "--rm-type" and one is None:
        b.unmapped.append((name, "needs one value"))
    elif name == "--rm-type":
        _rm_type(f, one or "", b)
    elif name == "--custom-rm-path" and one is None:
        b.unmapped.append((name, "needs one value: the reward function's dotted path"))
    elif name == "--custom-rm-path":
        b.from_flag(f, "reward.custom", _plugin_path(one))
        b.set("reward.type", "custom", f"implied by {name} (line {f.line})")
    elif name in DATA_PATH_FLAGS:
        _data_path_flag(f, one, b)
    elif name == "--train-backend":
        if one == "megatron":
            b.from_flag(f, "train.backend", "megatron")
        else:
            b.unmapped.append((name, f"train backend {one!r} has no slime/v2 equivalent (torch or megatron)"))
    elif name in ("--bf16", "--fp16"):
        b.from_flag(f, "train.precision", name[2:])
    elif name == "--optimizer":
        if one == "adam":
            b.from_flag(f, "train.optimizer.name", "adam")
        else:
            b.unmapped.append((name, f"optimizer {one!r}: slime/v2 trains with Adam(W) only"))
    elif name == "--lr-decay-style":
        if one in ("constant", "cosine", "linear"):
            b.from_flag(f, "train.optimizer.lr_schedule", one)
        else:
            b.unmapped.append((name, f"lr decay style {one!r}: slime/v2 has constant, cosine and linear"))
    elif name == "--disable-grpo-std-normalization":
        b.from_flag(f, "algorithm.normalize_std", False)
    elif name == "--loss-type" and one == "policy_loss":
        b.mapped.append((name, "algorithm.estimator (slime's default RL policy loss)"))
    elif name == "--loss-type":
        b.unmapped.append(
            (
                name,
                f"slime's {' '.join(vals) or 'empty'} loss (sft_loss: a supervised fine-tuning job; value_loss: a "
                "critic; custom_loss: a plug-in) has no slime/v2 equivalent: the imported spec trains the RL "
                "policy loss of algorithm.estimator, a different job",
            )
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
        b.unmapped.append((name, "not a JSON object of environment variables"))
        return
    for k, v in env.items():
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            b.from_flag(f, ("cluster", "env", k), str(v))
        else:
            b.unmapped.append((name, f"{k!r} is not an environment variable name"))


def _rm_type(f: Flag, kind: str, b: Builder) -> None:
    boxed = kind.startswith("boxed_")
    entry = (BOXED_RM_TYPES if boxed else RM_TYPES).get(kind.removeprefix("boxed_"))
    if entry is None and boxed:
        b.unmapped.append(
            (
                f.name,
                f"slime's {kind!r} grades only the \\boxed{{}} content of the response (boxed_math and "
                "boxed_deepscaler then almost never score); slime/v2 has no such variant: port it as "
                "reward.type: custom",
            )
        )
    elif entry is None:
        why = RM_TYPES_REFUSED.get(kind, f"no built-in {kind!r} reward in slime/v2: port it as reward.type: custom")
        b.unmapped.append((f.name, why))
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
        b.unmapped.append((f.name, "needs one value: the filter function's dotted path"))
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
        b.unmapped.append((f.name, "needs one value: the saved rollouts' path (template)"))
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
        b.unmapped.append((f.name, error or "no value"))
    return value


def finish(b: Builder, seen: dict[str, Flag], name: str | None) -> None:
    """Map the flags whose meaning depends on others, fill slime's defaults, size the cluster, name the job."""
    _kl(b, seen)
    _betas(b, seen)
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
            b.unmapped.append(("--kl-loss-coef", "slime ignores it without --use-kl-loss"))
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


def _resume(b: Builder, seen: dict[str, Flag]) -> None:
    """``--load``: resuming in the save directory, or a checkpoint to start from."""
    load, save = seen.get("--load"), seen.get("--save")
    if load is not None and len(load.values) != 1:
        b.unmapped.append(("--load", "needs one value: the checkpoint directory"))
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
            b.unmapped.append(
                (
                    key.name,
                    f"slime would reward dapo's {' '.join(key.values)!r}; slime/v2's dapo reward is its score (+1/-1)",
                )
            )
    elif key is not None and value and b.get("reward.type") in ("custom", "remote"):
        b.from_flag(key, "reward.key", value)
    elif key is not None:
        b.unmapped.append(
            (
                key.name,
                "slime picks this key out of a reward returned as a dict; slime/v2's built-in rewards return "
                "numbers (reward.key is for custom and remote rewards)",
            )
        )


def _weight_sync(b: Builder, seen: dict[str, Flag]) -> None:
    mode, transport = seen.get("--update-weight-mode"), seen.get("--update-weight-transport")
    for f in (mode, transport):
        if f is None:
            continue
        if b.get("rollout.colocate"):
            b.unmapped.append((f.name, "colocated engines are updated in memory; no transport to choose"))
        elif f is mode:
            if f.values == ["delta"]:
                b.from_flag(f, "rollout.weight_sync", "delta")
            else:
                b.mapped.append((f.name, "rollout.weight_sync (full updates are the default)"))
        elif not (mode and mode.values == ["delta"]):
            if f.values and f.values[0] in ("nccl", "disk"):
                b.from_flag(f, "rollout.weight_sync", f.values[0])
            else:
                b.unmapped.append((f.name, f"transport {' '.join(f.values)!r}: slime/v2 has nccl, disk and delta"))
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
        b.unmapped.append((passrate.name, "slime/v2 logs pass@k for eval sets (data.eval[*].pass_at_k); none given"))
    if data is not None and not data.values:
        b.unmapped.append((data.name, "needs values: NAME PATH [NAME PATH ...] or a PATH"))
    if data is None or not data.values:
        for n, f in extras.items():
            if f is not None:
                b.unmapped.append((n, "no --eval-prompt-data to apply it to"))
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
        b.unmapped.append((f.name, "pass@k needs more than one sample per eval prompt (--n-samples-per-eval-prompt)"))
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
        b.unmapped.append((mode.name, f"W&B mode {' '.join(mode.values)!r}: slime/v2 has online, offline, disabled"))
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
    if not colocate and b.get("rollout.gpus") is None:
        b.placeholder(
            "rollout.gpus",
            b.get("rollout.gpus_per_engine") or 1,
            "a disaggregated run (no --colocate) needs --rollout-num-gpus",
        )
    rollout = b.get("rollout.gpus") or 0
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
