"""The typed context the rollout manager hands to the ``agent.generate`` plug-in (its ``ctx``).

One frozen :class:`GenerateContext` per set of engines, passed to every call, so a plug-in may
cache per context. It satisfies ``slime.rl.plugins.RolloutContext``.
Guaranteed: every field is set; ``clients`` is not empty. Not guaranteed: the engines are healthy
(a failed request raises in the plug-in, which must let it through: a fault is not a zero reward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slime.backends.rollout.client import EngineClient
    from slime.rl.plugins import RewardFn
    from slime.spec.types import Spec

__all__ = ["GenerateContext"]


@dataclass(frozen=True, kw_only=True, eq=False)
class GenerateContext:
    clients: tuple[EngineClient, ...]  # one per engine; prompt group g uses clients[g % len(clients)]
    tokenizer: Any  # the run's Hugging Face tokenizer (with a chat template)
    spec: Spec  # the resolved spec: agent, model.max_context_len, reward
    reward_fn: RewardFn  # the run's reward

    def __post_init__(self) -> None:
        if not self.clients:
            raise ValueError("a generate context needs at least one engine client")

    @classmethod
    def for_spec(cls, spec: Spec, clients: Sequence[EngineClient], tokenizer: Any) -> GenerateContext:
        """The context of ``spec`` with its own reward function (``reward`` section)."""
        from slime.rl.rewards import reward_from_spec

        return cls(clients=tuple(clients), tokenizer=tokenizer, spec=spec, reward_fn=reward_from_spec(spec))
