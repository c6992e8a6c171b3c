"""The default agent loop as a generate plug-in (``agent.generate`` default).

``await generate(ctx, sample, sampling_params)`` runs one episode: open a session on the shared
adapter server, let an HTTP agent call ``agent.tools`` in a sandbox until it answers or hits
``agent.max_turns``, close the session, linearise its trajectory tree into samples (mask 1 on
model tokens only) and copy the once-scored reward of the final answer to each of them.
Guaranteed: an unreachable or failing engine raises ``RuntimeError`` (never a zero reward); a
rejected prompt ends the episode with one ``failed`` sample. Also :func:`rollout_metrics`; the
warm-up demonstrations are re-exported from ``slime.agent.demos``. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from slime.agent.adapters.clients import AgentAPIError, CallRequest, make_client
from slime.agent.adapters.server import AdapterServer, start_adapter
from slime.agent.context import GenerateContext
from slime.agent.demos import agent_sft_sample, calculator_demonstration, render_demonstration
from slime.agent.sandbox import Sandbox, make_sandbox
from slime.agent.tools import Tool, get_tools
from slime.rl.sample import Sample, SampleStatus

__all__ = [
    "AgentConfig",
    "AgentRunner",
    "Episode",
    "agent_sft_sample",
    "calculator_demonstration",
    "fill_samples",
    "generate",
    "render_demonstration",
    "rollout_metrics",
    "run_episode",
    "sandbox_kwargs",
    "shutdown_adapters",
]


def sandbox_kwargs(sandbox_spec: Any) -> tuple[str, dict[str, Any]]:
    """``(backend, constructor kwargs)`` for the spec's ``agent.sandbox`` section."""
    sb = sandbox_spec
    if sb.backend == "local":
        return "local", {
            "network": sb.network,
            "memory_mb": sb.memory_mb,
            "cpu_time_s": sb.cpu_time_s,
            "max_procs": sb.max_procs,
            "max_file_mb": sb.max_file_mb,
            "allow_unisolated": sb.allow_unisolated,
            "wall_timeout_s": sb.timeout_s,
            **({"work_mb": sb.work_mb} if sb.work_mb is not None else {}),
            **({"total_memory_mb": sb.total_memory_mb} if sb.total_memory_mb is not None else {}),
        }
    if sb.backend == "e2b":
        if not sb.api_key_secret:
            raise ValueError("agent.sandbox.api_key_secret is required for the e2b backend")
        # work_mb / total_memory_mb are refused for e2b by the spec rules; the per-process limits hold.
        kwargs: dict[str, Any] = {
            "api_key_ref": f"env:{sb.api_key_secret}",
            "network": sb.network,
            "memory_mb": sb.memory_mb,
            "cpu_time_s": sb.cpu_time_s,
            "max_procs": sb.max_procs,
            "max_file_mb": sb.max_file_mb,
        }
        if sb.image:
            kwargs["template"] = sb.image
        return "e2b", kwargs
    return sb.backend, {}


@dataclass(frozen=True)
class AgentConfig:
    protocol: str = "openai"
    max_turns: int = 4
    tools: tuple[str, ...] = ("python",)
    sandbox_backend: str = "local"
    sandbox_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_timeout_s: float = 10.0
    system_prompt: str | None = None
    max_length: int | None = None  # the model's context length: longer samples are cut
    max_tool_output_chars: int = 200  # every character of a tool result is a prompt token
    drift_threshold: int = 8

    @classmethod
    def from_spec(cls, spec: Any) -> AgentConfig:
        ag = spec.agent
        if ag is None:
            return cls(max_length=spec.model.max_context_len)
        backend, kwargs = sandbox_kwargs(ag.sandbox)
        return cls(
            protocol=ag.adapter,
            max_turns=ag.max_turns,
            tools=tuple(ag.tools),
            sandbox_backend=backend,
            sandbox_kwargs=kwargs,
            tool_timeout_s=ag.sandbox.timeout_s,
            max_length=spec.model.max_context_len,
        )


@dataclass
class Episode:
    final_text: str = ""
    stop: str = ""  # answer | max_turns | refused:<code> | error:<code>
    turns: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    invalid_tool_calls: int = 0
    error: str | None = None
    sandbox_id: str | None = None


class _LazySandbox:
    """Starts the sandbox at the first tool call; most episodes of an untrained policy make none."""

    def __init__(self, backend: str, kwargs: Mapping[str, Any]) -> None:
        self.backend, self.kwargs = backend, dict(kwargs)
        self.sandbox: Sandbox | None = None

    async def get(self) -> Sandbox:
        if self.sandbox is None:
            sb = make_sandbox(self.backend, **self.kwargs)
            await sb.__aenter__()
            self.sandbox = sb
        return self.sandbox

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.__aexit__(None, None, None)


async def run_episode(
    client: Any,
    tools: Sequence[Tool],
    sandbox: _LazySandbox,
    *,
    prompt: str,
    max_turns: int,
    tool_timeout_s: float,
    system_prompt: str | None = None,
    max_tool_output_chars: int = 200,
) -> Episode:
    """Talk to the adapter through ``client`` until a final answer or ``max_turns`` turns."""
    ep = Episode()
    by_name = {t.name: t for t in tools}
    client.start(prompt, system_prompt)
    for turn in range(max_turns):
        try:
            reply = await client.complete(list(tools))
        except AgentAPIError as exc:
            refused = exc.code in ("turn_limit_exceeded", "session_closed")
            ep.stop = f"{'refused' if refused else 'error'}:{exc.code}"
            ep.error = None if refused else str(exc)
            return ep
        ep.turns += 1
        ep.invalid_tool_calls += len(reply.invalid_tool_calls)
        ep.final_text = reply.text
        if not reply.tool_calls:
            ep.stop = "answer"
            return ep
        if turn == max_turns - 1:
            break  # no turn left to show the model any tool result: do not run the tools
        results: list[tuple[CallRequest, str]] = []
        for call in reply.tool_calls:
            record = {"name": call.name, "arguments": call.arguments, "ok": False, "timed_out": False}
            tool = by_name.get(call.name)
            if tool is None:
                output = f"error: unknown tool {call.name!r}; available: {', '.join(by_name)}"
            elif call.arguments is None:
                output = "error: the arguments are not a JSON object"
            else:
                sb = await sandbox.get()
                ep.sandbox_id = sb.sandbox_id
                res = await tool.run(sb, call.arguments, timeout=tool_timeout_s, max_output_chars=max_tool_output_chars)
                output = res.output
                record.update(ok=res.ok, timed_out=res.timed_out, sandbox_id=sb.sandbox_id)
            record["output"] = output
            ep.tool_calls.append(record)
            results.append((call, output))
        client.add_tool_results(results)
    ep.stop = "max_turns"
    return ep


# Adapter errors that mean the infrastructure failed (not the policy): the rollout must fail loudly.
_FATAL = frozenset({"engine_unavailable", "engine_error", "internal_error", "generation_aborted"})

# One adapter server per (protocol, engine, tokenizer) in this process.
_ADAPTERS: dict[tuple[str, str, int], AdapterServer] = {}
_ADAPTERS_LOCK = threading.Lock()


def _shared_adapter(protocol: str, engine_url: str, tokenizer: Any, drift_threshold: int) -> AdapterServer:
    key = (protocol, engine_url, id(tokenizer))
    with _ADAPTERS_LOCK:
        srv = _ADAPTERS.get(key)
        if srv is None or not srv.running:
            srv = start_adapter(protocol, engine_url, tokenizer, drift_threshold=drift_threshold)
            _ADAPTERS[key] = srv
        return srv


def shutdown_adapters() -> None:
    """Stop every adapter server this process started (the runtime calls it at exit)."""
    with _ADAPTERS_LOCK:
        servers = list(_ADAPTERS.values())
        _ADAPTERS.clear()
    for srv in servers:
        srv.stop()


class AgentRunner:
    """Runs episodes against one or more engines; holds the config, tools and reward.

    With several engines, prompt group ``g`` goes to engine ``g % len(engines)``
    (each engine gets its own adapter server), as the rollout manager deals groups.
    """

    def __init__(
        self, config: AgentConfig, engine_url: str | Sequence[str], tokenizer: Any, *, reward_fn: Any = None
    ) -> None:
        self.config = config
        self.engine_urls = [engine_url] if isinstance(engine_url, str) else list(engine_url)
        if not self.engine_urls:
            raise ValueError("AgentRunner needs at least one engine URL")
        self.tokenizer = tokenizer
        self.tools = get_tools(config.tools)
        if reward_fn is None:
            from slime.rl.rewards import make_reward_fn

            reward_fn = make_reward_fn("exact")
        self.reward_fn = reward_fn

    @classmethod
    def from_context(cls, ctx: GenerateContext) -> AgentRunner:
        if not hasattr(ctx.tokenizer, "apply_chat_template"):
            raise TypeError("the agent generate plug-in needs ctx.tokenizer (a Hugging Face tokenizer)")
        urls = [c.base_url for c in ctx.clients]
        return cls(AgentConfig.from_spec(ctx.spec), urls, ctx.tokenizer, reward_fn=ctx.reward_fn)

    def adapter(self, group_index: int | None = None) -> AdapterServer:
        c = self.config
        url = self.engine_urls[(group_index or 0) % len(self.engine_urls)]
        return _shared_adapter(c.protocol, url, self.tokenizer, c.drift_threshold)

    async def run(self, sample: Sample, sampling_params: Mapping[str, Any]) -> list[Sample]:
        c = self.config
        adapter = self.adapter(sample.group_index)
        session_id = f"agent-{sample.group_index}-{sample.index}-{uuid.uuid4().hex[:8]}"
        _, token = await adapter.aopen_session(
            session_id, max_turns=c.max_turns, sampling=dict(sampling_params), metadata={"index": sample.index}
        )
        sandbox = _LazySandbox(c.sandbox_backend, c.sandbox_kwargs)
        try:
            async with aiohttp.ClientSession() as http:
                client = make_client(c.protocol, http, adapter.url, token)
                episode = await run_episode(
                    client,
                    self.tools,
                    sandbox,
                    prompt=_prompt_text(sample),
                    max_turns=c.max_turns,
                    tool_timeout_s=c.tool_timeout_s,
                    system_prompt=c.system_prompt,
                    max_tool_output_chars=c.max_tool_output_chars,
                )
        finally:
            try:
                await sandbox.close()
            finally:
                result = await adapter.aclose_session(session_id)
        if episode.stop.removeprefix("error:") in _FATAL:
            raise RuntimeError(f"agent episode {session_id} failed: {episode.error}")
        scored = replace_sample(sample, response=episode.final_text)
        reward = float(await self.reward_fn(scored))
        return to_samples(
            sample, result.samples(reward, max_length=c.max_length), episode, reward, records=result.records
        )


def _prompt_text(sample: Sample) -> str:
    p = sample.prompt
    if isinstance(p, str):
        return p
    # A list of chat messages: the agent sends the last user message (system prompts come from the config).
    if isinstance(p, list) and p and isinstance(p[-1], Mapping) and isinstance(p[-1].get("content"), str):
        return p[-1]["content"]
    raise ValueError(f"sample {sample.index}: the agent needs a text prompt, got {type(p).__name__}")


def replace_sample(sample: Sample, **changes: Any) -> Sample:
    d = sample.to_dict()
    d.update(changes)
    return Sample.from_dict(d)


def to_samples(
    sample: Sample, trajectories: list[Any], episode: Episode, reward: float, *, records: Sequence[Any] = ()
) -> list[Sample]:
    """Training samples of one episode (fields: docs/design-notes.md, slime.agent.generate)."""
    agent_meta = {
        "stop": episode.stop,
        "turns": episode.turns,
        "tool_calls": episode.tool_calls,
        "invalid_tool_calls": episode.invalid_tool_calls,
        "final_answer": episode.final_text,
        "sandbox_id": episode.sandbox_id,
        "error": episode.error,
        "placements": [r.placement.kind for r in records],
        "leaves": len(trajectories),
    }
    if not trajectories:
        failed = replace_sample(sample, response="", reward=reward, status=SampleStatus.FAILED.value)
        failed.metadata = {**sample.metadata, "agent": {**agent_meta, "error": episode.error or "no turn recorded"}}
        return [failed]
    out = []
    for i, ts in enumerate(trajectories):
        s = replace_sample(sample, response=episode.final_text)
        s.tokens = list(ts.tokens)
        s.response_length = len(ts.tokens) - ts.prompt_length
        s.loss_mask = list(ts.loss_mask)
        s.rollout_log_probs = list(ts.rollout_log_probs)
        s.reward = reward
        s.status = SampleStatus.TRUNCATED if ts.status == "truncated" else SampleStatus.COMPLETED
        s.weight_version = min(ts.weight_versions) if ts.weight_versions else 0
        s.metadata = {
            **sample.metadata,
            "agent": {
                **agent_meta,
                "leaf": i,
                "session_id": ts.metadata["session_id"],
                "turn_spans": ts.metadata["turns"],
            },
        }
        out.append(s)
    return out


_RUNNERS: dict[int, tuple[Any, AgentRunner]] = {}


async def generate(ctx: GenerateContext, sample: Sample, sampling_params: Mapping[str, Any], /) -> list[Sample]:
    """The ``GenerateFn`` plug-in: one agent episode for ``sample`` (see the module docstring)."""
    entry = _RUNNERS.get(id(ctx))
    if entry is None or entry[0] is not ctx:
        entry = (ctx, AgentRunner.from_context(ctx))
        _RUNNERS.clear()  # one live context at a time; a new one replaces the old
        _RUNNERS[id(ctx)] = entry
    return await entry[1].run(sample, sampling_params)


def _trained_tokens(s: Sample) -> int:
    return sum(s.loss_mask)


async def fill_samples(
    ctx: GenerateContext, samples: list[Sample], params: Sequence[Mapping[str, Any]], *, max_concurrent: int = 128
) -> list[list[Sample]]:
    """The rollout manager's hook: one agent episode per input sample; each input's training samples.

    Runs ``spec.agent.generate`` (default: :func:`generate`) for every sample (at most
    ``max_concurrent`` at once) and returns, per input and in order, every root-to-leaf sample of
    its episode (an episode that forked gives several, sharing the input's ``group_index`` and
    reward; the trainer counts them once in their group's statistics, see
    ``slime.runtime.train_data.sequence_scores``). An episode with no usable sample (no recorded
    turn, or nothing generated) becomes one inert sample (prompt + EOS, loss mask 0, reward 0,
    status ``failed``) so every input is accounted for.
    """
    from slime.core.registry import load_object
    from slime.rl.plugins import check_plugin

    path = ctx.spec.agent.generate if ctx.spec.agent is not None else None
    fn = load_object(path) if path else generate
    check_plugin(fn, "generate", name=path or "slime.agent.generate:generate")
    gate = asyncio.Semaphore(max_concurrent)
    results: list[list[Sample]] = [[] for _ in samples]

    async def one(i: int) -> None:
        async with gate:
            out = await fn(ctx, samples[i], dict(params[i]))
        outs = out if isinstance(out, list) else [out]
        if not outs:
            raise ValueError(f"generate plug-in {path or 'default'} returned no sample for sample {i}")
        results[i] = _usable(ctx, samples[i], outs)

    try:
        async with asyncio.TaskGroup() as group:
            for i in range(len(samples)):
                group.create_task(one(i))
    except ExceptionGroup as eg:
        raise eg.exceptions[0] from None  # one clear error, not a group
    return results


def _usable(ctx: GenerateContext, target: Sample, outs: list[Sample]) -> list[Sample]:
    """Every leaf that trains something, else one inert sample in ``target``'s place."""
    usable = [s for s in outs if s.status != SampleStatus.FAILED and s.response_length > 0]
    if usable:
        return usable
    tok = ctx.tokenizer
    eos = tok.eos_token_id
    prompt = list(target.tokens) or list(tok.encode(str(target.prompt), add_special_tokens=False))
    target.tokens = prompt + [eos if eos is not None else 0]
    target.response_length, target.loss_mask, target.rollout_log_probs = 1, [0], [0.0]
    target.reward, target.status = 0.0, SampleStatus.FAILED
    target.response = ""
    target.metadata = {**target.metadata, **{k: v for k, v in outs[0].metadata.items() if k == "agent"}}
    return [target]


def rollout_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """Per-rollout agent metrics (``agent/*``) from the samples' ``metadata["agent"]``.

    Rates are per episode; ``agent/tool_calls``, ``agent/sandboxed_tool_calls`` (calls whose
    tool actually ran in a sandbox: a known tool with object arguments) and
    ``agent/tool_calls_ok`` are counts, so a run dir shows how much sandboxed work happened.
    """
    eps, seen = [], set()
    for s in samples:  # one entry per episode: the leaves of a forked episode share its record
        agent = s.metadata.get("agent")
        if isinstance(agent, dict) and (key := agent.get("session_id") or id(agent)) not in seen:
            seen.add(key)
            eps.append(agent)
    if not eps:
        return {}
    n = len(eps)
    calls = [c for e in eps for c in e.get("tool_calls", [])]
    return {
        # Counts (not rates): tool calls the model made, those executed in a sandbox, those that succeeded.
        "agent/tool_calls": float(len(calls)),
        "agent/sandboxed_tool_calls": float(sum(1 for c in calls if c.get("sandbox_id"))),
        "agent/tool_calls_ok": float(sum(1 for c in calls if c.get("ok"))),
        "agent/tool_call_rate": sum(1 for e in eps if e.get("tool_calls")) / n,
        "agent/tool_calls_per_episode": len(calls) / n,
        "agent/tool_call_ok_frac": sum(1 for c in calls if c.get("ok")) / max(1, len(calls)),
        "agent/invalid_tool_calls_per_episode": sum(e.get("invalid_tool_calls", 0) for e in eps) / n,
        "agent/turns_mean": sum(e.get("turns", 0) for e in eps) / n,
        "agent/answered_frac": sum(1 for e in eps if e.get("stop") == "answer") / n,
        "agent/sandboxed_episodes": float(sum(1 for e in eps if e.get("sandbox_id"))),
        "agent/forked_episodes": float(sum(1 for e in eps if e.get("leaves", 1) > 1)),
        "agent/samples_per_episode": len(samples) / n,
        "agent/failed_episodes": float(sum(1 for s in samples if s.status == SampleStatus.FAILED)),
    }
