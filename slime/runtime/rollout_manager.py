"""The rollout manager: prompts in, the scored samples a rollout trains on out (``RolloutBatch``).

One per job (a Ray actor; a plain object in tests), owning the prompt source, tokenizer, reward,
filter and one engine client per engine that generates (a decode engine's pairs each request with a
prefill engine). ``generate(rollout_id)`` runs ``slime.runtime.rollout`` and returns the kept samples
in group order (or, ``train_only``, reads saved ones); with ``agent``, agent episodes. ``evaluate``: eval sets.
Guaranteed: each request's ``sampling_seed`` derives from (seed, rollout, draw position, sample),
so a resumed run draws the same prompts and responses (partial responses depend on abort timing).
Not implemented: custom rollout plug-ins (slime's ``--rollout-function-path``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from slime.diagnosis import fault_dump
from slime.diagnosis.beats import beat
from slime.rl.sample import Sample, SampleStatus, episode_id
from slime.runtime.record import FULL_CREDIT
from slime.runtime.rollout import RolloutBatch

if TYPE_CHECKING:
    from slime.agent.context import GenerateContext
    from slime.runtime.rollout.generate import GroupGenerator
    from slime.runtime.rollout.source import Group
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


def _newest(s: Sample) -> int:
    return max(s.token_versions) if s.token_versions else s.weight_version


def _numbered(groups: Sequence[Any], rollout_id: int) -> list[Sample]:
    """The kept groups' samples, renumbered: group ``g`` = the g-th kept group, indices 0.. in order.
    A sample the engine aborted on its own (not our abort: kept groups finished) is an error."""
    out: list[Sample] = []
    for g, group in enumerate(groups):
        for s in group.samples:
            s.group_index, s.index = g, len(out)
            out.append(s)
    aborted = [s.index for s in out if s.status == SampleStatus.ABORTED]
    if aborted:
        raise RuntimeError(
            f"rollout {rollout_id}: {len(aborted)} request(s) were aborted by the engine "
            f"(samples {aborted[:5]}...); check the engine logs"
        )
    return out


def _first_per_episode(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per episode, in order (a forked agent episode's leaves share its reward)."""
    seen: set[Any] = set()
    out = []
    for s in samples:
        key = episode_id(s)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


async def _health(clients: Sequence[Any]) -> list[bool]:
    return list(await asyncio.gather(*(c.health() for c in clients)))


async def _close(clients: Sequence[Any]) -> None:
    for c in clients:
        await c.close()


class RolloutManager:
    """Construction only records its arguments; :meth:`setup` (called by every method, or explicitly
    by the driver so that data errors reach it typed rather than as a dead actor) does the work."""

    def __init__(
        self, spec: Spec, engine_urls: Sequence[str], tokenizer_dir: str, *, rollouts_dir: str | None = None
    ) -> None:
        self.spec, self._urls, self._tokenizer_dir = spec, list(engine_urls), tokenizer_dir
        self.rollouts_dir = rollouts_dir  # debug.save_rollouts: where each rollout's samples are written
        self._ready = False
        self.clients: list[Any] = []  # one client per generate target (set_engines): not prefill engines
        self._prefill: Any = None  # the prefill engines' PrefillPool (prefill/decode groups), else None
        self._bootstrap: dict[str, int] = {}  # prefill engine URL -> KV bootstrap port (set_engines)
        self._context: GenerateContext | None = None  # the agent plug-in's context of these engines
        self._stream: Any = None  # fully-async: the GroupStream, started by stream_start
        self._stream_saved: list[dict[str, Any]] = []  # its ready groups from a checkpoint, loaded at start
        self._stream_rollout = 0  # the rollout the stream's new groups are drawn for
        self._teacher: Any = None  # algorithm.opd type engine: an EngineClient to the teacher engine (set_teacher)

    def setup(self) -> None:
        """Load the tokenizer, the prompt data (every row checked), the reward function and the filter."""
        if self._ready:
            return
        from slime.data.jsonl import PromptDataset
        from slime.migrate.slime_args import slime_args
        from slime.models.tokenizer import load_tokenizer
        from slime.placement import normal_priority
        from slime.rl.filters import load_filter
        from slime.rl.rewards import reward_from_spec
        from slime.rl.rewards.custom import SlimeArgs
        from slime.runtime.rollout.source import PromptSource

        normal_priority()
        fault_dump.arm()  # the watchdog's stack dump where py-spy cannot read this process
        spec = self.spec
        r, d = spec.rollout, spec.data
        self.tokenizer = load_tokenizer(self._tokenizer_dir)
        self._dataset_args = dict(
            input_key=d.input_key,
            label_key=d.label_key,
            metadata_key=d.metadata_key,
            tokenizer=self.tokenizer,
            apply_chat_template=d.apply_chat_template,
            max_prompt_tokens=r.max_prompt_len,
            sft=spec.kind == "SFTJob",  # rows are chat transcripts: the last assistant reply is the label
        )
        self.dataset = PromptDataset(d.prompts, shuffle=d.shuffle, seed=spec.train.seed, **self._dataset_args)
        self.source = PromptSource(self.dataset, n=r.n_samples_per_prompt, encode=self.encode)
        if spec.algorithm.sft_warmup_steps > 0:
            self._check_sft_labels()
        self._sft_dataset = None
        self._eval_sets: dict[str, Any] = {}
        self.reward_fn = reward_from_spec(spec)  # slime-style (args, ...) plug-ins get the spec's values
        ds = r.dynamic_sampling
        self.group_filter = load_filter(ds.filter, args=SlimeArgs(**slime_args(spec))) if ds is not None else None
        self._loop = asyncio.new_event_loop()
        self.set_engines(self._urls, self._bootstrap)
        eos = self.tokenizer.eos_token_id
        self.eos_id = int(eos) if eos is not None else None
        self._ready = True

    def set_engines(self, engine_urls: Sequence[str], prefill: Mapping[str, int] | None = None) -> None:
        """Talk to these engines from now on (the driver starts them while the data loads).

        ``prefill``: the engines among them that only prefill (URL → KV bootstrap port); requests then go to
        the others, each paired with one of these (``slime.backends.rollout.pd``)."""
        from slime.backends.rollout.external import engine_secret
        from slime.backends.rollout.pd import paired_clients

        self._close_clients()
        self._urls, self._bootstrap = list(engine_urls), dict(prefill or {})
        timeout = max(600.0, self.spec.rollout.startup_timeout_s)
        secret = engine_secret(self.spec)  # external engines: their own token, else the job's
        self.clients, self._prefill = paired_clients(self._urls, self._bootstrap, timeout_s=timeout, secret=secret)
        self._context = None  # built at first use, for these engines

    def _close_clients(self) -> None:
        if self._prefill is not None:
            self._run(self._prefill.close())
        if self.clients:
            self._run(_close(self.clients))

    def set_teacher(self, url: str) -> None:
        """``algorithm.opd.type: engine``: score every kept sample on the teacher engine at ``url`` from now on."""
        from slime.backends.rollout.client import EngineClient

        self.setup()
        if self._teacher is not None:
            self._run(self._teacher.close())
        # the job started it: the job's secret (secret=None), whatever the student engines take
        self._teacher = EngineClient(url, timeout_s=max(600.0, self.spec.rollout.startup_timeout_s))

    def _ask_teacher(self, samples: list[Sample], metrics: dict[str, Any]) -> None:
        """The teacher engine's log-probs of each sample's response (``rollout/teacher_s``: the seconds taken)."""
        from slime.runtime.rollout.teacher import ask_teacher

        t = time.perf_counter()
        self._run(ask_teacher(self._teacher, samples, self.spec.rollout.temperature))
        metrics["rollout/teacher_s"] = time.perf_counter() - t

    # ---------------------------------------------------------------- helpers
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _run(self, coro):
        return self._loop.run_until_complete(coro)

    def sampling_params(self, *, temperature: float, seed: int | None, e: EvalSet | None = None) -> dict[str, Any]:
        """One request's sampling dict: the rollout's settings, or eval set ``e``'s."""
        r = self.spec.rollout
        params: dict[str, Any] = {
            "max_new_tokens": e.max_response_len if e is not None else r.max_response_len,
            "temperature": temperature,
            "top_p": e.top_p if e is not None else r.top_p,
            "top_k": e.top_k if e is not None else r.top_k,
        }
        if r.stop:
            params["stop"] = list(r.stop)
        if seed is not None and temperature > 0:
            params["sampling_seed"] = seed
        return params

    def generator(self, tag: str, max_new_tokens: int) -> GroupGenerator:
        from slime.runtime.rollout.generate import GroupGenerator

        context = self.generate_context() if self.spec.agent is not None else None
        tag = f"{tag}-{uuid.uuid4().hex[:6]}"  # rids unique across managers sharing engines
        return GroupGenerator(self.clients, tag=tag, max_new_tokens=max_new_tokens, context=context)

    def generate_context(self) -> GenerateContext:
        """The ``ctx`` of the ``agent.generate`` plug-in: one object per set of engines."""
        from slime.agent.context import GenerateContext

        if self._context is None:
            self._context = GenerateContext(
                clients=tuple(self.clients), tokenizer=self.tokenizer, spec=self.spec, reward_fn=self.reward_fn
            )
        return self._context

    # ---------------------------------------------------------------- rollout
    def generate(self, rollout_id: int, weight_version: int | None = None) -> RolloutBatch:
        """The samples rollout ``rollout_id`` trains on (advances the prompt source; see the module doc).

        ``weight_version``: the version the engines serve (what ``partial_mask_offpolicy`` keeps)."""
        self.setup()
        if self.spec.debug.mode == "train_only":
            from slime.runtime.rollout.saved import read_rollout

            samples = read_rollout(self.spec.debug.load_rollouts, rollout_id)
            metrics: dict[str, Any] = {"rollout/groups_kept": len({s.group_index for s in samples})}
        else:
            samples, metrics = self._run(_collect(self, rollout_id, weight_version))
            if self._teacher is not None and samples:
                self._ask_teacher(samples, metrics)
        if self.rollouts_dir is not None:
            from slime.runtime.rollout.saved import write_rollout

            write_rollout(self.rollouts_dir, rollout_id, samples)
        return RolloutBatch(samples, metrics)

    def generate_timed(self, rollout_id: int, weight_version: int | None = None) -> tuple[RolloutBatch, float]:
        """:meth:`generate` and the seconds it took here (the engines' time, without the caller's waits)."""
        t = time.perf_counter()
        batch = self.generate(rollout_id, weight_version)
        return batch, time.perf_counter() - t

    # ---------------------------------------------------------------- fully-async (train.async mode fully)
    def stream_start(self) -> None:
        """Start (or continue) generating groups into the ready buffer with the weights served now."""
        self.setup()
        if self._stream is None:
            self._stream = _make_stream(self)
            self._stream.ready.load(self._stream_saved)
        self._stream.resume()

    def stream_pause(self) -> None:
        """Stop between groups (before a weight update or a checkpoint); :meth:`stream_start` continues."""
        if self._stream is not None:
            self._stream.pause()

    def stream_take(self, rollout_id: int, current: int) -> tuple[RolloutBatch, float]:
        """Rollout ``rollout_id``: ``rollout.batch_size`` ready groups within the staleness bound of version
        ``current`` (older ones dropped) and the stream's generating seconds since the last take."""
        self._stream_rollout = rollout_id + 1  # the groups drawn from now on are for the next take
        taken, dropped, seconds = self._stream.take(self.spec.rollout.batch_size, current)
        if rollout_id + 1 == self.spec.rollout.num_rollouts:
            self._stream.close()  # the last rollout: nothing more to generate
        samples = _numbered([x.group for x in taken], rollout_id)
        lags = [current - x.version for x in taken]
        metrics: dict[str, Any] = {
            "rollout/groups_kept": len(taken),
            "rollout/stale_dropped": len(dropped),
            "rollout/buffer_ready": len(self._stream.ready),
            **{f"rollout/staleness_groups/{k}": lags.count(k) for k in range(self._stream.ready.max_staleness + 1)},
        }
        if self._teacher is not None and samples:
            self._ask_teacher(samples, metrics)
        if self.rollouts_dir is not None:
            from slime.runtime.rollout.saved import write_rollout

            write_rollout(self.rollouts_dir, rollout_id, samples)
        return RolloutBatch(samples, metrics), seconds

    # ---------------------------------------------------------------- eval
    def eval_dataset(self, e: EvalSet):
        from slime.data.jsonl import PromptDataset

        if e.name not in self._eval_sets:
            self._eval_sets[e.name] = PromptDataset(e.path, shuffle=False, **self._dataset_args)
        return self._eval_sets[e.name]

    def evaluate(self, names: Sequence[str] | None = None, *, tag: int = 0) -> dict[str, float]:
        """Metrics ``eval/<name>/{reward,accuracy,response_len}`` and ``eval/<name>/pass@k`` for the named
        sets (default: all); the first set of the spec is also reported as ``eval/reward`` and ``eval/accuracy``."""
        self.setup()
        out: dict[str, float] = {}
        for e in self.spec.data.eval:
            if names is None or e.name in names:
                out.update(self._run(_evaluate_set(self, e, tag)))
        first = self.spec.data.eval[0].name if self.spec.data.eval else None
        if f"eval/{first}/reward" in out:
            out["eval/reward"], out["eval/accuracy"] = out[f"eval/{first}/reward"], out[f"eval/{first}/accuracy"]
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
        return [self.sft_sample(row) for row in self._sft_dataset.next_batch(n)]

    def sft_sample(self, row: Any) -> dict:
        """One SFT sample ``{tokens, response_length[, loss_mask]}``: a chat transcript (``kind: SFTJob``) through
        the chat template with the loss on its assistant turns; else (the warm-up) the prompt and its label."""
        if self.spec.kind == "SFTJob":
            from slime.data.chat import render_messages

            return render_messages(self.tokenizer, row.prompt)
        label = _sft_label(row)
        if self.spec.agent is not None:  # the agent's chat format (a tool-using demonstration when one fits)
            from slime.agent.generate import agent_sft_sample

            return agent_sft_sample(self.spec, self.tokenizer, row.text, str(label), row.metadata)
        answer = self.encode(str(label)) + ([self.eos_id] if self.eos_id is not None else [])
        return {"tokens": self.encode(row.text) + answer, "response_length": len(answer)}

    def sft_batch(self) -> list[dict]:
        """``kind: SFTJob``: the next ``rollout.batch_size`` transcripts of the training data as SFT samples,
        from the prompt source's cursor (so a checkpoint resumes with the next ones)."""
        self.setup()
        return [self.sft_sample(row) for row in self.dataset.next_batch(self.spec.rollout.batch_size)]

    def sft_eval_samples(self, name: str) -> list[dict]:
        """``kind: SFTJob``: eval set ``name``'s transcripts (its first ``max_prompts``) as SFT samples,
        for the held-out loss."""
        self.setup()
        (e,) = [x for x in self.spec.data.eval if x.name == name]
        rows = self.eval_dataset(e).rows[: e.max_prompts]
        return [self.sft_sample(row) for row in rows]

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The prompt source's state (cursor, partial-rollout buffer) and, fully-async (taken paused), the
        ready groups not yet trained: part of every checkpoint."""
        self.setup()
        state = self.source.state_dict()
        if self._stream is not None:
            state["stream_ready"] = self._stream.ready.to_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.setup()
        self.source.load_state_dict(state)
        self._stream_saved = list(state.get("stream_ready", []))

    def engine_health(self) -> dict[str, bool]:
        self.setup()
        every = [*self.clients, *(self._prefill.clients if self._prefill is not None else ())]
        return {c.base_url: ok for c, ok in zip(every, self._run(_health(every)))}

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._ready:
            self._close_clients()
            if self._teacher is not None:
                self._run(self._teacher.close())


# Module-level on purpose: a Ray actor class with any ``async def`` method becomes an async actor whose
# sync methods run inside a running event loop, where ``run_until_complete`` fails.
async def _score(reward_fn: Any, samples: list[Sample], phase: str = "rollout") -> None:
    from slime.rl.rewards import batch_rewards

    await batch_rewards(reward_fn, samples)
    beat(phase)  # a long rollout or eval moves group by group (the watchdog's progress)


async def _then_beat(work: Awaitable[Any], phase: str) -> Any:
    out = await work
    beat(phase)
    return out


async def _collect(
    mgr: RolloutManager, rollout_id: int, weight_version: int | None
) -> tuple[list[Sample], dict[str, Any]]:
    from slime.runtime.rollout.collect import CollectConfig, collect, mask_offpolicy

    r, seed = mgr.spec.rollout, mgr.spec.train.seed
    n, ds = r.n_samples_per_prompt, r.dynamic_sampling
    gen = mgr.generator(f"r{rollout_id}", r.max_response_len)

    async def generate(group: Group, position: int) -> None:
        params = [
            mgr.sampling_params(temperature=r.temperature, seed=sampling_seed(seed, "rollout", rollout_id, i))
            for i in range(position * n, position * n + len(group.samples))
        ]
        await _then_beat(gen.run(group, position, params), "rollout")

    cfg = CollectConfig(
        batch_size=r.batch_size,
        over_sampling=r.over_sampling_batch_size or r.batch_size,
        max_rounds=ds.max_rounds if ds is not None else 1,
        partial=r.partial,
    )
    groups, metrics = await collect(
        mgr.source,
        rollout_id,
        cfg,
        generate=generate,
        score=partial(_score, mgr.reward_fn),
        keep=mgr.group_filter,
        abort=gen.abort,
    )
    samples = _numbered(groups, rollout_id)
    if r.partial_mask_offpolicy and samples:
        current = weight_version if weight_version is not None else max(_newest(s) for s in samples)
        metrics["rollout/masked_offpolicy_tokens"] = mask_offpolicy(samples, current)
    return samples, metrics


def _make_stream(mgr: RolloutManager) -> Any:
    """The manager's GroupStream: groups from the prompt source, generated with seeds from their draw."""
    from slime.runtime.rollout.stream import GroupStream

    r, a, seed = mgr.spec.rollout, mgr.spec.train.async_, mgr.spec.train.seed
    gens: list[Any] = [mgr.generator("stream", r.max_response_len)]

    def draw() -> Group:
        (group,) = mgr.source.take(1, mgr._stream_rollout)
        for s in group.samples:
            s.metadata["draw"] = group.draw  # which group a trained sample came from (debug.save_rollouts)
        return group

    async def run(group: Group) -> bool:
        n = len(group.samples)
        params = [
            mgr.sampling_params(temperature=r.temperature, seed=sampling_seed(seed, "stream", group.draw, j))
            for j in range(n)
        ]
        await gens[0].run(group, group.draw, params)
        if any(s.status == SampleStatus.ABORTED for s in group.samples):
            return False
        await _score(mgr.reward_fn, group.samples)
        return True

    async def abort() -> None:
        await gens[0].abort()
        gens[0] = mgr.generator("stream", r.max_response_len)  # continued requests get fresh rids

    def put_back(groups: list[Group]) -> None:
        mgr.source.buffer.extendleft(reversed(groups))  # before any group buffered earlier: oldest first

    return GroupStream(
        draw=draw, run=run, abort=abort, put_back=put_back, capacity=a.buffer_groups, max_staleness=a.max_staleness
    )


async def _evaluate_set(mgr: RolloutManager, e: EvalSet, tag: int) -> dict[str, float]:
    """One eval set's metrics; per episode (a forked agent episode counts once), pass@k per prompt."""
    from slime.rl.passk import mean_pass_at_k
    from slime.runtime.rollout.source import Group

    ds, k = mgr.eval_dataset(e), e.n_samples_per_prompt
    rows = ds.rows[: e.max_prompts] if e.max_prompts else ds.rows
    gen = mgr.generator(f"eval-{e.name}-{tag}", e.max_response_len or mgr.spec.rollout.max_response_len)
    groups, runs = [], []
    for g, row in enumerate(rows):
        ids = mgr.encode(row.text)
        group = Group([Sample(prompt=row.text, tokens=list(ids), label=row.label) for _ in range(k)], g, tag)
        seeds = [sampling_seed(mgr.spec.train.seed, "eval", e.name, tag, g * k + j) for j in range(k)]
        params = [mgr.sampling_params(temperature=e.temperature, seed=x, e=e) for x in seeds]
        groups.append(group)
        runs.append(_then_beat(gen.run(group, g, params), "eval"))
    await asyncio.gather(*runs)
    await _score(mgr.reward_fn, _numbered(groups, tag), "eval")
    # one entry per episode (the leaves of a forked agent episode share its reward); plain samples: each
    per_group = [_first_per_episode(grp.samples) for grp in groups]
    episodes = [s for grp in per_group for s in grp]
    rewards = [float(s.reward or 0.0) for s in episodes]
    n, name = max(1, len(rewards)), f"eval/{e.name}"
    out = {
        f"{name}/reward": sum(rewards) / n,
        f"{name}/accuracy": sum(x >= FULL_CREDIT for x in rewards) / n,
        f"{name}/response_len": sum(s.response_length for s in episodes) / n,
    }
    counts = [(len(grp), sum(float(s.reward or 0.0) >= FULL_CREDIT for s in grp)) for grp in per_group]
    for kk in e.pass_at_k:
        out[f"{name}/pass@{kk}"] = mean_pass_at_k(counts, kk)
    return out
