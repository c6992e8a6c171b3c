"""The rules of ``kind: SFTJob``: what supervised fine-tuning honours, and the RL settings it refuses.

An SFT job trains the masked NLL of the assistant turns of ``data.prompts``' chat transcripts; each
rollout is ``rollout.batch_size`` rows of the data, in epochs. Rollout sampling, rewards, the RL
algorithm, agents and the RL debug modes have no meaning there: a spec that sets one is refused,
naming the field, rather than run with it ignored. Held-out generations (``data.eval``) keep their own
sampling settings and are scored by exact match with the reference reply (the default reward).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from slime.spec.plugin import Finding
from slime.spec.rules import rule
from slime.spec.types import Algorithm, Reward, Spec

__all__ = ["sft_job"]

_NOT_SFT = "kind SFTJob trains on the data's assistant turns"
# derived by resolve for RL; an SFT spec cannot have set them unless it set what they derive from
_DERIVED_ALGORITHM = ("eps_clip_high", "normalize_std", "critic")


def _changed(value: msgspec.Struct, default: msgspec.Struct, skip: tuple[str, ...] = ()) -> list[str]:
    fields = type(default).__struct_fields__
    return [f for f in fields if f not in skip and _differs(getattr(value, f), getattr(default, f))]


def _differs(value: object, default: object) -> bool:
    # field by field: a partially loaded spec (next to a schema error) wraps its sections in proxies
    if isinstance(default, msgspec.Struct):
        return any(_differs(getattr(value, f), getattr(default, f)) for f in default.__struct_fields__)
    return value != default


def _rollout(s: Spec) -> Iterator[Finding]:
    r = s.rollout
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
    for name, default in sampling.items():
        if getattr(r, name) != default:
            yield (
                f"rollout.{name}",
                f"{_NOT_SFT}; it samples no rollouts, so rollout.{name} would be ignored",
                f"remove rollout.{name} (held-out generations sample with data.eval[].{name})",
            )
    if r.n_samples_per_prompt != 1:
        yield (
            "rollout.n_samples_per_prompt",
            f"{_NOT_SFT} once per epoch; n_samples_per_prompt {r.n_samples_per_prompt} would repeat each row in a step",
            "set rollout.n_samples_per_prompt: 1 (rollout.epochs sets the passes over the data)",
        )
    for name, on in (
        ("dynamic_sampling", r.dynamic_sampling is not None),
        ("partial", r.partial),
        ("partial_mask_offpolicy", r.partial_mask_offpolicy),
        ("over_sampling_batch_size", (r.over_sampling_batch_size or r.batch_size) != r.batch_size),
    ):
        if on:
            yield (f"rollout.{name}", f"{_NOT_SFT}; rollout.{name} shapes RL generation", f"remove rollout.{name}")
    if s.train.async_:
        yield ("train.async", f"{_NOT_SFT}; there is no generation to overlap with training", "remove train.async")


@rule
def sft_job(s: Spec) -> Iterator[Finding]:
    if s.kind != "SFTJob":
        return
    yield from _rollout(s)
    for f in _changed(s.reward, Reward()):
        yield (
            f"reward.{f}",
            f"{_NOT_SFT}, not a reward; held-out generations are scored by exact match with the reference reply",
            "remove the reward section (kind RLJob uses it)",
        )
    for f in _changed(s.algorithm, Algorithm(), _DERIVED_ALGORITHM):
        name = next(x.encode_name for x in msgspec.structs.fields(Algorithm) if x.name == f)
        yield (
            f"algorithm.{name}",
            f"{_NOT_SFT} with the per-token NLL (slime's sft_loss, --calculate-per-token-loss); "
            f"algorithm.{name} belongs to RL",
            "remove it (an SFT warm-up before RL is algorithm.sft_warmup_steps of a kind RLJob spec)",
        )
    for path, on in (
        ("agent", s.agent is not None),
        ("model.ref_path", s.model.ref_path is not None),
        ("model.critic_path", s.model.critic_path is not None),
        ("debug.mode", s.debug.mode != "normal"),
        ("debug.save_rollouts", s.debug.save_rollouts),
    ):
        if on:
            yield (path, f"{_NOT_SFT}; {path} is for RL rollouts", f"remove {path}")
    if not s.data.apply_chat_template:
        yield (
            "data.apply_chat_template",
            "kind SFTJob renders each transcript with the tokenizer's chat template (the loss on assistant turns)",
            "set data.apply_chat_template: true",
        )
