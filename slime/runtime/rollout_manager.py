"""The rollout manager / data buffer: prompts in, scored groups of ``Sample``s out.

One instance per job (a Ray actor in the runtime; a plain object in tests). It
owns the prompt dataset and its resumable cursor, the tokenizer, the reward
function and one ``EngineClient`` per engine. ``generate(rollout_id)`` draws
``rollout.batch_size`` prompts, asks the engines for ``n_samples_per_prompt``
responses each (``/generate`` with ``return_logprob``; the groups of a rollout
are dealt round-robin over the engines, one batched request per engine), scores
them and returns the samples in group order (prompt ``g``'s samples are rows
``g*n .. g*n+n-1``).

Determinism (exact resume): every sampled request carries a ``sampling_seed``
derived from ``(train.seed, rollout_id, sample index)``, so a rollout's samples
do not depend on the process, the batch or what ran before; together with the
dataset cursor in the checkpoint, a resumed run draws the same prompts and the
same responses as an uninterrupted one (up to float differences between batch
shapes in the engine, which do not arise when the same batch is replayed).

Each sample records the engine's ``weight_version`` (an int the runtime sets
with every weight sync; -1 if the engine reports something else).

With an ``agent`` section, each sample is one agent episode instead
(``slime.agent.generate.fill_samples``: the ``agent.generate`` plug-in, default
the built-in tool-calling loop, one sample per input kept in place; its ``ctx``
is a frozen ``slime.agent.context.GenerateContext`` of the current engines,
:meth:`RolloutManager.generate_context`), and the SFT warm-up uses the agent's
chat format (``agent_sft_sample``).

Not implemented: over-sampling with dynamic filters (``over_sampling_batch_size``
larger than ``batch_size`` is rejected), partial rollouts, custom rollout
plug-ins.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from slime.rl.sample import Sample, SampleStatus
from slime.runtime.record import FULL_CREDIT

if TYPE_CHECKING:
    from slime.agent.context import GenerateContext
    from slime.spec.types import EvalSet, Spec

__all__ = ["FULL_CREDIT", "RolloutManager", "sampling_seed"]


def sampling_seed(*parts: Any) -> int:
    """A 63-bit seed from its parts (stable across processes and Python versions)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _sft_label(row: Any) -> Any:
    """The answer the SFT warm-up trains on: the label, or the first of a list of them (None: none)."""
    if isinstance(row.label, list):
        return row.label[0] if row.label else None
    return row.label


def _version(v: str | None) -> int:
    try:
        return int(v) if v is not None else -1
    except ValueError:
        return -1


async def _generate(clients: Sequence[Any], samples: list[Sample], params: list[dict], group_size: int) -> None:
    """Fill ``samples`` in place: groups dealt round-robin over the engines, one request per engine.

    Module-level on purpose: a Ray actor class with any ``async def`` method becomes an async
    actor whose sync methods run inside a running event loop, where ``run_until_complete`` fails.
    """
    per_engine: list[list[int]] = [[] for _ in clients]
    for i in range(len(samples)):
        per_engine[(i // group_size) % len(clients)].append(i)

    if not clients:
        raise RuntimeError("the rollout manager has no engines (set_engines was never called)")

    async def one(client, idx: list[int]) -> None:
        if not idx:
            return
        results = await client.generate([samples[i].tokens for i in idx], [params[i] for i in idx], return_logprob=True)
        for i, res in zip(idx, results):
            s = samples[i]
            if res.logprobs is None:
                raise RuntimeError(f"{client.base_url} returned no log-probs (return_logprob was requested)")
            s.tokens = list(s.tokens) + list(res.output_ids)
            s.response_length = len(res.output_ids)
            s.response = res.text
            s.rollout_log_probs = list(res.logprobs)
            s.loss_mask = [1] * s.response_length
            s.weight_version = _version(res.weight_version)
            s.status = (
                SampleStatus.ABORTED
                if res.aborted
                else SampleStatus.TRUNCATED
                if res.truncated
                else SampleStatus.COMPLETED
            )

    await asyncio.gather(*(one(c, idx) for c, idx in zip(clients, per_engine)))


async def _health(clients: Sequence[Any]) -> list[bool]:
    return list(await asyncio.gather(*(c.health() for c in clients)))


async def _close(clients: Sequence[Any]) -> None:
    for c in clients:
        await c.close()


class RolloutManager:
    """Construction only records its arguments; :meth:`setup` (called by every method, or explicitly
    by the driver so that data errors reach it typed rather than as a dead actor) does the work."""

    def __init__(self, spec: Spec, engine_urls: Sequence[str], tokenizer_dir: str) -> None:
        self.spec, self._urls, self._tokenizer_dir = spec, list(engine_urls), tokenizer_dir
        self._ready = False
        self.clients: list[Any] = []  # one EngineClient per engine (set_engines)
        self._context: GenerateContext | None = None  # the agent plug-in's context of these engines

    def setup(self) -> None:
        """Load the tokenizer, the prompt data (every row checked) and the reward function."""
        if self._ready:
            return
        from transformers import AutoTokenizer

        from slime.data.jsonl import PromptDataset
        from slime.placement import normal_priority
        from slime.rl.rewards import reward_from_spec

        normal_priority()
        spec = self.spec
        r, d = spec.rollout, spec.data
        if (r.over_sampling_batch_size or r.batch_size) != r.batch_size:
            raise ValueError(
                f"rollout.over_sampling_batch_size={r.over_sampling_batch_size} > batch_size needs a "
                "dynamic filter, which this runtime does not implement yet; remove it"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_dir)
        self._dataset_args = dict(
            input_key=d.input_key,
            label_key=d.label_key,
            metadata_key=d.metadata_key,
            tokenizer=self.tokenizer,
            apply_chat_template=d.apply_chat_template,
            max_prompt_tokens=r.max_prompt_len,
        )
        self.dataset = PromptDataset(d.prompts, shuffle=d.shuffle, seed=spec.train.seed, **self._dataset_args)
        if spec.algorithm.sft_warmup_steps > 0:
            self._check_sft_labels()
        self._sft_dataset = None
        self._eval_sets: dict[str, Any] = {}
        self.reward_fn = reward_from_spec(spec)  # slime-style (args, sample) plug-ins get the spec's values
        self._loop = asyncio.new_event_loop()
        self.set_engines(self._urls)
        eos = self.tokenizer.eos_token_id
        self.eos_id = int(eos) if eos is not None else None
        self._ready = True

    def set_engines(self, engine_urls: Sequence[str]) -> None:
        """Talk to these engines from now on (the driver starts them while the data loads)."""
        from slime.backends.rollout.client import EngineClient

        if self.clients:
            self._run(_close(self.clients))
        self._urls = list(engine_urls)
        timeout = max(600.0, self.spec.rollout.startup_timeout_s)
        self.clients = [EngineClient(u, timeout_s=timeout) for u in self._urls]
        self._context = None  # built at first use, for these engines

    # ---------------------------------------------------------------- helpers
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def _sampling_params(self, *, temperature: float, seed: int | None) -> dict[str, Any]:
        r = self.spec.rollout
        params: dict[str, Any] = {
            "max_new_tokens": r.max_response_len,
            "temperature": temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
        }
        if r.stop:
            params["stop"] = list(r.stop)
        if seed is not None and temperature > 0:
            params["sampling_seed"] = seed
        return params

    def _fill(self, samples: list[Sample], params: list[dict], group_size: int) -> None:
        if self.spec.agent is not None:  # agentic rollouts: one agent episode (plug-in) per sample, in place
            from slime.agent.generate import fill_samples

            self._run(fill_samples(self.generate_context(), samples, params))
        else:
            self._run(_generate(self.clients, samples, params, group_size))

    def generate_context(self) -> GenerateContext:
        """The ``ctx`` of the ``agent.generate`` plug-in: one object per set of engines."""
        from slime.agent.context import GenerateContext

        if self._context is None:
            self._context = GenerateContext(
                clients=tuple(self.clients), tokenizer=self.tokenizer, spec=self.spec, reward_fn=self.reward_fn
            )
        return self._context

    def _score(self, samples: list[Sample]) -> None:
        from slime.rl.rewards import batch_rewards

        self._run(batch_rewards(self.reward_fn, samples))

    # ---------------------------------------------------------------- rollout
    def generate(self, rollout_id: int) -> list[Sample]:
        """The scored samples of rollout ``rollout_id`` (advances the dataset cursor)."""
        self.setup()
        r, seed = self.spec.rollout, self.spec.train.seed
        n = r.n_samples_per_prompt
        samples: list[Sample] = []
        params: list[dict] = []
        for g, row in enumerate(self.dataset.next_batch(r.batch_size)):
            ids = self.encode(row.text)
            for j in range(n):
                index = g * n + j
                samples.append(
                    Sample(
                        group_index=g,
                        index=index,
                        prompt=row.text,
                        tokens=list(ids),
                        label=row.label,
                        metadata={**row.metadata, "rollout_id": rollout_id},
                    )
                )
                params.append(
                    self._sampling_params(
                        temperature=r.temperature, seed=sampling_seed(seed, "rollout", rollout_id, index)
                    )
                )
        self._fill(samples, params, n)
        aborted = [s.index for s in samples if s.status == SampleStatus.ABORTED]
        if aborted:
            raise RuntimeError(
                f"rollout {rollout_id}: {len(aborted)} request(s) were aborted by the engine "
                f"(samples {aborted[:5]}...); check the engine logs"
            )
        self._score(samples)
        return samples

    def generate_timed(self, rollout_id: int) -> tuple[list[Sample], float]:
        """:meth:`generate` and the seconds it took here (the engines' time, without the caller's waits)."""
        t = time.perf_counter()
        samples = self.generate(rollout_id)
        return samples, time.perf_counter() - t

    # ---------------------------------------------------------------- eval
    def _eval_set(self, e: EvalSet):
        from slime.data.jsonl import PromptDataset

        if e.name not in self._eval_sets:
            self._eval_sets[e.name] = PromptDataset(e.path, shuffle=False, **self._dataset_args)
        return self._eval_sets[e.name]

    def evaluate(self, names: Sequence[str] | None = None, *, tag: int = 0) -> dict[str, float]:
        """Metrics ``eval/<name>/{reward,accuracy,response_len}`` for the named sets (default: all);
        the first set of the spec is also reported as ``eval/reward`` and ``eval/accuracy``."""
        self.setup()
        sets = [e for e in self.spec.data.eval if names is None or e.name in names]
        out: dict[str, float] = {}
        for e in sets:
            ds = self._eval_set(e)
            rows = ds.rows[: e.max_prompts] if e.max_prompts else ds.rows
            samples, params = [], []
            for g, row in enumerate(rows):
                ids = self.encode(row.text)
                for j in range(e.n_samples_per_prompt):
                    index = g * e.n_samples_per_prompt + j
                    samples.append(
                        Sample(group_index=g, index=index, prompt=row.text, tokens=list(ids), label=row.label)
                    )
                    params.append(
                        self._sampling_params(
                            temperature=e.temperature,
                            seed=sampling_seed(self.spec.train.seed, "eval", e.name, tag, index),
                        )
                    )
            self._fill(samples, params, e.n_samples_per_prompt)
            self._score(samples)
            rewards = [float(s.reward or 0.0) for s in samples]
            n = max(1, len(rewards))
            out[f"eval/{e.name}/reward"] = sum(rewards) / n
            out[f"eval/{e.name}/accuracy"] = sum(x >= FULL_CREDIT for x in rewards) / n
            out[f"eval/{e.name}/response_len"] = sum(s.response_length for s in samples) / n
            if e.name == self.spec.data.eval[0].name:
                out["eval/reward"] = out[f"eval/{e.name}/reward"]
                out["eval/accuracy"] = out[f"eval/{e.name}/accuracy"]
        return out

    # ---------------------------------------------------------------- SFT data
    def _check_sft_labels(self) -> None:
        """The warm-up trains on the labels: every row needs one (else it would learn the text "None").
        Checked at setup, before any warm-up step, over the same rows the warm-up draws from."""
        from slime.data.jsonl import DatasetError

        d = self.spec.data
        if d.label_key is None:
            raise ValueError("algorithm.sft_warmup_steps > 0 needs labels: set data.label_key")
        for row in self.dataset.rows:
            if _sft_label(row) is None:
                raise DatasetError(
                    f"{self.dataset.path}:{row.line}: {d.label_key!r} is "
                    f"{json.dumps(row.label)}, but algorithm.sft_warmup_steps > 0 trains on the "
                    "labels; give every row a label, or set algorithm.sft_warmup_steps: 0"
                )

    def sft_samples(self, n: int) -> list[dict]:
        """``n`` (prompt, label + EOS) pairs for the SFT warm-up, from their own cursor over the prompts."""
        self.setup()
        from slime.data.jsonl import PromptDataset

        d = self.spec.data
        if self._sft_dataset is None:
            # Its own order (seed + 1) so the warm-up does not consume the RL prompt order.
            self._sft_dataset = PromptDataset(
                d.prompts, shuffle=d.shuffle, seed=self.spec.train.seed + 1, **self._dataset_args
            )
        out = []
        for row in self._sft_dataset.next_batch(n):
            label = _sft_label(row)
            if self.spec.agent is not None:  # the agent's chat format (a tool-using demonstration when one fits)
                from slime.agent.generate import agent_sft_sample

                out.append(agent_sft_sample(self.spec, self.tokenizer, row.text, str(label)))
                continue
            answer = self.encode(str(label)) + ([self.eos_id] if self.eos_id is not None else [])
            out.append({"tokens": self.encode(row.text) + answer, "response_length": len(answer)})
        return out

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        self.setup()
        return {"data": self.dataset.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setup()
        self.dataset.load_state_dict(state["data"])

    def engine_health(self) -> dict[str, bool]:
        self.setup()
        return {c.base_url: ok for c, ok in zip(self.clients, self._run(_health(self.clients)))}

    def close(self) -> None:
        if self._ready:
            self._run(_close(self.clients))
