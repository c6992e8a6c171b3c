"""On-policy distillation's teacher engine (``algorithm.opd.type: engine``): its log-probs on sampled tokens.

:func:`ask_teacher` scores each kept sample on the teacher engine with SGLang's scoring request, as
slime's ``--opd-type sglang`` does: ``input_ids`` = prompt + response, ``max_new_tokens: 0``,
``return_logprob``, ``logprob_start_len`` = prompt length - 1, at the rollout temperature (slime's
#2085). ``meta_info.input_token_logprobs`` then covers ``tokens[P-1:]`` with a None first entry, so
its tail is the response's log-probs, stored as ``Sample.teacher_log_probs``. One request per prompt
group, all at once. Guaranteed: a reply of the wrong shape raises naming the sample; nothing is
stored for a failed sample. Not here: where the teacher runs (``slime.runtime.job``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from slime.rl.sample import Sample

__all__ = ["ask_teacher", "teacher_request"]


def teacher_request(samples: Sequence[Sample], temperature: float) -> dict[str, Any]:
    """One batched ``/generate`` body that scores these samples' response tokens."""
    return {
        "input_ids": [list(s.tokens) for s in samples],
        "sampling_params": {"max_new_tokens": 0, "temperature": temperature, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": [s.prompt_length - 1 for s in samples],
    }


def _response_log_probs(s: Sample, item: Any) -> list[float]:
    """The response's log-probs out of one reply item (SGLang's ``[log-prob, token id, text]`` triples)."""
    triples = (item.get("meta_info") or {}).get("input_token_logprobs") if isinstance(item, dict) else None
    want = s.response_tokens
    if not isinstance(triples, list) or len(triples) != len(want) + 1:
        got = "none" if not isinstance(triples, list) else f"{len(triples)} entries"
        raise RuntimeError(
            f"sample {s.index}: the teacher engine returned {got} of input_token_logprobs for "
            f"{len(want)} response token(s) + 1; is it an SGLang-compatible engine with logprob_start_len?"
        )
    if [t[1] for t in triples[1:]] != want:
        raise RuntimeError(f"sample {s.index}: the teacher engine scored other tokens than the sample's response")
    return [float(t[0]) for t in triples[1:]]


async def ask_teacher(client: Any, samples: Sequence[Sample], temperature: float) -> None:
    """Set ``teacher_log_probs`` on every sample with a response (an ``EngineClient`` to the teacher)."""
    groups: dict[Any, list[Sample]] = {}
    for s in samples:
        if s.response_length > 0 and s.prompt_length > 0:
            groups.setdefault(s.group_index, []).append(s)

    async def one(group: list[Sample]) -> None:
        reply = await client.post("/generate", teacher_request(group, temperature), idempotent=True)
        if not isinstance(reply, list) or len(reply) != len(group):
            raise RuntimeError(f"the teacher engine answered a batch of {len(group)} with {type(reply).__name__}")
        scored = [_response_log_probs(s, item) for s, item in zip(group, reply)]
        for s, lps in zip(group, scored):
            s.teacher_log_probs = lps

    await asyncio.gather(*(one(g) for g in groups.values()))
