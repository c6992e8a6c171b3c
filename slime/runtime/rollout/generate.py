"""Generating one prompt group: a ``/generate`` request per group, continuation of partial responses, abort.

:class:`GroupGenerator` sends a group's pending and aborted samples in one request (rids end with a
dot so one never prefixes another); continued samples send their earlier tokens and append what
comes back with each token's version. :meth:`GroupGenerator.abort` aborts its own rids on every
engine. Agent specs run the ``agent.generate`` plug-in instead (episodes finish, never aborted).
Guaranteed: a request's samples depend only on its seed, prompt and weights, not on the engine's
batch; an engine returning no log-probs raises. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime.rl.sample import Sample, SampleStatus

if TYPE_CHECKING:
    from slime.agent.context import GenerateContext
    from slime.runtime.rollout.source import Group

__all__ = ["GroupGenerator", "append_result", "weight_version"]

TODO = (SampleStatus.PENDING, SampleStatus.ABORTED)


def weight_version(v: str | None) -> int:
    """The engine's weight version as an int (-1 if it reports something else)."""
    try:
        return int(v) if v is not None else -1
    except ValueError:
        return -1


def append_result(s: Sample, res: Any) -> None:
    """Append one ``GenerateResult`` to ``s`` (a fresh sample, or a continued partial one)."""
    if res.logprobs is None:
        raise RuntimeError(f"rid {res.rid}: the engine returned no log-probs (return_logprob was requested)")
    k, v = len(res.output_ids), weight_version(res.weight_version)
    if s.response_length == 0:
        s.weight_version = v
    elif k:  # a second part: from now on each token's version is recorded
        if not s.token_versions:
            s.token_versions = [s.weight_version] * s.response_length
        s.token_versions += [v] * k
    s.tokens = list(s.tokens) + list(res.output_ids)
    s.response = s.response + res.text
    s.rollout_log_probs = list(s.rollout_log_probs) + list(res.logprobs)
    s.loss_mask = list(s.loss_mask) + [1] * k
    s.response_length += k
    if res.aborted:
        s.status = SampleStatus.ABORTED
    else:
        s.status = SampleStatus.TRUNCATED if res.truncated else SampleStatus.COMPLETED


class GroupGenerator:
    """Generates groups on ``clients`` (one per engine) for one rollout (``tag`` names its rids)."""

    def __init__(
        self, clients: Sequence[Any], *, tag: str, max_new_tokens: int, context: GenerateContext | None = None
    ) -> None:
        if not clients:
            raise RuntimeError("the rollout manager has no engines (set_engines was never called)")
        self.clients, self.tag, self.max_new, self.context = list(clients), tag, max_new_tokens, context
        self.in_flight: dict[str, Any] = {}  # rid -> its engine's client

    async def run(self, group: Group, position: int, params: Sequence[dict]) -> None:
        """Generate what ``group`` still needs (``params``: one sampling dict per sample)."""
        for j, s in enumerate(group.samples):
            s.group_index, s.index = position, position * len(group.samples) + j  # the engine is chosen by it
        if self.context is not None:
            await self._agent(group, params)
            return
        client = self.clients[position % len(self.clients)]
        todo: list[tuple[int, dict]] = []
        for j, s in enumerate(group.samples):
            if s.status not in TODO:
                continue
            left = self.max_new - s.response_length
            if left <= 0:  # a continued response already at the limit
                s.status = SampleStatus.TRUNCATED
                continue
            todo.append((j, {**params[j], "max_new_tokens": left}))
        if not todo:
            return
        rids = [f"{self.tag}-d{group.draw}-s{j}." for j, _ in todo]
        self.in_flight.update(dict.fromkeys(rids, client))
        try:
            results = await client.generate(
                [group.samples[j].tokens for j, _ in todo], [p for _, p in todo], return_logprob=True, rid=rids
            )
        finally:
            for rid in rids:
                self.in_flight.pop(rid, None)
        for (j, _), res in zip(todo, results):
            append_result(group.samples[j], res)

    async def _agent(self, group: Group, params: Sequence[dict]) -> None:
        from slime.agent.generate import fill_samples

        outs = await fill_samples(self.context, group.samples, params)
        group.samples = [s for per_input in outs for s in per_input]

    async def abort(self) -> int:
        """Abort every request of this generator still in flight; returns how many were asked."""
        pending = list(self.in_flight.items())
        await asyncio.gather(*(client.abort(rid) for rid, client in pending))
        return len(pending)
