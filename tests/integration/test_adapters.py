"""The OpenAI and Anthropic adapters against the real built-in engine, over HTTP.

The engine serves a tiny model that was first fine-tuned (real torch training,
a few seconds) to answer three scripted prompts, so that greedy decoding gives
known replies: ``"call"`` -> a well-formed calculator tool call and, after the
tool result, ``"19"``; ``"bad"`` -> a tool call with malformed JSON arguments;
``"hi"`` -> ``"hello"``. Everything else (sessions, rendering, generation,
parsing, recording, streaming) is the production code path on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
aiohttp = pytest.importorskip("aiohttp")

from slime.agent.adapters import InvalidToolCall, ToolCall, parse_tool_calls, start_adapter  # noqa: E402
from slime.agent.generate import render_demonstration  # noqa: E402
from slime.agent.tools import get_tools  # noqa: E402
from slime.backends.rollout.builtin.server import start_server  # noqa: E402

pytestmark = pytest.mark.timeout(300)

TOOLS = get_tools(["calculator"])
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "07+12"}}\n</tool_call>'
BAD = '<tool_call>\n{"name": "calculator", "arguments": {"expression": 07+}}\n</tool_call>'
SCRIPTS = [
    [
        {"role": "user", "content": "call"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "07+12"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "19"},
        {"role": "assistant", "content": "19"},
    ],
    [{"role": "user", "content": "bad"}, {"role": "assistant", "content": BAD}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
]
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


def _fine_tune(model_dir: Path, out_dir: Path) -> Path:
    """Teach the tiny model the scripted replies (masked NLL on assistant tokens)."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    demos = [render_demonstration(tok, s, TOOLS) for s in SCRIPTS]
    T = max(len(d["tokens"]) for d in demos)
    tokens = torch.zeros(len(demos), T, dtype=torch.long)
    mask = torch.zeros(len(demos), T - 1)
    for i, d in enumerate(demos):
        L, P = len(d["tokens"]), len(d["tokens"]) - d["response_length"]
        tokens[i, :L] = torch.tensor(d["tokens"])
        mask[i, P - 1 : L - 1] = torch.tensor(d["loss_mask"], dtype=torch.float32)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores: one thread is faster than two fighting
    try:
        for _ in range(400):
            logp = torch.log_softmax(model(tokens).logits[:, :-1], -1).gather(-1, tokens[:, 1:, None])[..., 0]
            loss = -(logp * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loss.item() < 0.005:
                break
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05, f"scripted fine-tune did not converge (loss {loss.item():.3f})"
    model.save_pretrained(out_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            (out_dir / name).write_bytes((model_dir / name).read_bytes())
    return out_dir


@pytest.fixture(scope="module")
def scripted(tmp_path_factory, tiny_model):
    return _fine_tune(tiny_model(seed=0), tmp_path_factory.mktemp("adapters") / "scripted")


@pytest.fixture(scope="module")
def engine(scripted):
    srv = start_server(scripted, seed=0)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tok(scripted):
    return transformers.AutoTokenizer.from_pretrained(scripted)


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def adapter(request, engine, tok):
    srv = start_adapter(request.param, engine.url, tok, max_turns=4)
    yield srv
    srv.stop()


# ------------------------------------------------------------------ helpers
def run(coro):
    return asyncio.run(coro)


def headers(proto: str, token: str | None, style: str = "native") -> dict[str, str]:
    if token is None:
        return {}
    native = "bearer" if proto == "openai" else "x-api-key"
    use = native if style == "native" else ("x-api-key" if native == "bearer" else "bearer")
    return {"Authorization": f"Bearer {token}"} if use == "bearer" else {"x-api-key": token}


def body(proto: str, messages: list[dict], **extra) -> dict:
    """A request in the protocol's shape; ``messages`` in OpenAI form (user/assistant/tool)."""
    if proto == "openai":
        return {
            "model": "m",
            "messages": messages,
            "tools": [t.openai_schema() for t in TOOLS],
            "temperature": 0,
            **extra,
        }
    out = []
    for m in messages:
        if m["role"] == "tool":
            out.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}],
                }
            )
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    extra.setdefault("max_tokens", 128)
    return {"model": "m", "messages": out, "tools": [t.anthropic_schema() for t in TOOLS], "temperature": 0, **extra}


async def post(adapter, token, payload, *, style="native", raw: bytes | None = None):
    proto = adapter.protocol_name
    async with aiohttp.ClientSession() as s:
        kw = {"data": raw} if raw is not None else {"json": payload}
        async with s.post(adapter.url + PATHS[proto], headers=headers(proto, token, style), **kw) as r:
            text = await r.text()
            ctype = r.headers.get("Content-Type", "")
            return r.status, (json.loads(text) if "json" in ctype else text)


def reply_view(proto: str, data: dict) -> tuple[str, list[dict], list[dict], str]:
    """(text, tool calls as {id, name, arguments}, invalid calls, finish) of a non-streamed reply."""
    if proto == "openai":
        msg = data["choices"][0]["message"]
        calls = [
            {
                "id": c["id"],
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"]),
                "raw": c["function"]["arguments"],
            }
            for c in msg.get("tool_calls") or []
        ]
        return msg["content"] or "", calls, msg.get("invalid_tool_calls", []), data["choices"][0]["finish_reason"]
    blocks = data["content"]
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [
        {"id": b["id"], "name": b["name"], "arguments": b["input"], "raw": json.dumps(b["input"])}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    return text, calls, data.get("invalid_tool_calls", []), data["stop_reason"]


def error_code(proto: str, data: dict) -> str:
    return data["error"]["code"]


# ------------------------------------------------------------------- tests
def test_tool_call_round_trip_is_recorded_as_one_trajectory(adapter, tok):
    proto = adapter.protocol_name
    sid, token = adapter.open_session()
    msgs = [{"role": "user", "content": "call"}]
    status, data = run(post(adapter, token, body(proto, msgs)))
    assert status == 200, data
    text, calls, invalid, finish = reply_view(proto, data)
    assert finish == ("tool_calls" if proto == "openai" else "tool_use")
    assert [(c["name"], c["arguments"]) for c in calls] == [("calculator", {"expression": "07+12"})]
    assert text == "" and invalid == []
    if proto == "openai":  # arguments are the model's exact text, so the echo re-renders identically
        assert calls[0]["raw"] == '{"expression": "07+12"}'
    msgs += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "calculator", "arguments": calls[0]["raw"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "19"},
    ]
    status, data = run(post(adapter, token, body(proto, msgs)))
    assert status == 200, data
    text, calls, _, finish = reply_view(proto, data)
    assert (text, calls, finish) == ("19", [], "stop" if proto == "openai" else "end_turn")

    result = adapter.close_session(sid)
    assert [r.placement.kind for r in result.records] == ["root", "extend"]
    assert result.records[0].tool_calls[0]["arguments"] == {"expression": "07+12"}
    assert [r.weight_version for r in result.records] == ["default", "default"]
    [s] = result.samples(reward=1.0)
    assert len(s.loss_mask) == len(s.rollout_log_probs) == len(s.tokens) - s.prompt_length
    trained = [t for t, m in zip(s.tokens[s.prompt_length :], s.loss_mask) if m]
    assert tok.decode(trained) == CALL + "<|im_end|>" + "19<|im_end|>"
    untrained = tok.decode([t for t, m in zip(s.tokens[s.prompt_length :], s.loss_mask) if not m])
    assert "<tool_response>\n19\n</tool_response>" in untrained and "calculator" not in untrained
    assert all(lp <= 0 for lp in s.rollout_log_probs) and any(lp < 0 for lp in s.rollout_log_probs)
    assert s.weight_versions == [-1, -1] and s.reward == 1.0 and s.status == "completed"
    # the turn record carries the messages the engine saw plus the reply
    assert s.metadata["messages"][-1] == {"role": "assistant", "content": "19"}


def test_malformed_arguments_are_flagged_not_fatal(adapter):
    proto = adapter.protocol_name
    sid, token = adapter.open_session()
    status, data = run(post(adapter, token, body(proto, [{"role": "user", "content": "bad"}])))
    assert status == 200, data
    text, calls, invalid, finish = reply_view(proto, data)
    assert calls == [] and finish == ("stop" if proto == "openai" else "end_turn")
    assert len(invalid) == 1 and invalid[0]["name"] == "calculator"
    assert "not valid JSON" in invalid[0]["error"] and invalid[0]["raw"] == BAD
    assert text == BAD  # the raw block stays visible to the agent
    result = adapter.close_session(sid)
    [rec] = result.records
    assert rec.tool_calls == [] and rec.invalid_tool_calls[0]["raw"] == BAD
    assert result.samples()[0].metadata["messages"][-1]["invalid_tool_calls"][0]["name"] == "calculator"


def _sse_events(text: str) -> list[tuple[str | None, str]]:
    out = []
    for chunk in text.strip().split("\n\n"):
        event, data = None, None
        for line in chunk.splitlines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((event, data))
    return out


def test_streaming_gives_the_same_reply_as_events(adapter):
    proto = adapter.protocol_name
    sid, token = adapter.open_session()
    extra = {"stream": True, **({"stream_options": {"include_usage": True}} if proto == "openai" else {})}
    status, text = run(post(adapter, token, body(proto, [{"role": "user", "content": "call"}], **extra)))
    assert status == 200, text
    events = _sse_events(text)
    if proto == "openai":
        assert events[-1] == (None, "[DONE]")
        chunks = [json.loads(d) for _, d in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        args = "".join(
            tc["function"].get("arguments", "")
            for c in chunks
            for ch in c["choices"]
            for tc in ch["delta"].get("tool_calls", [])
        )
        names = [
            tc["function"]["name"]
            for c in chunks
            for ch in c["choices"]
            for tc in ch["delta"].get("tool_calls", [])
            if "name" in tc.get("function", {})
        ]
        finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
        assert (names, json.loads(args), finishes) == (["calculator"], {"expression": "07+12"}, ["tool_calls"])
        assert chunks[-1]["usage"]["completion_tokens"] > 0 and chunks[-1]["choices"] == []
    else:
        names = [e for e, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        datas = [json.loads(d) for _, d in events]
        start = [d["content_block"] for d in datas if d["type"] == "content_block_start"]
        partial = "".join(
            d["delta"]["partial_json"]
            for d in datas
            if d["type"] == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
        )
        assert [(b["type"], b["name"]) for b in start] == [("tool_use", "calculator")]
        assert json.loads(partial) == {"expression": "07+12"}
        assert datas[-2]["delta"]["stop_reason"] == "tool_use"
    result = adapter.close_session(sid)
    assert len(result.records) == 1 and result.records[0].tool_calls[0]["name"] == "calculator"


def test_session_from_either_header_and_auth_errors(adapter):
    proto = adapter.protocol_name
    hi = body(proto, [{"role": "user", "content": "hi"}])
    sid, token = adapter.open_session()
    for style in ("native", "other"):
        status, data = run(post(adapter, token, hi, style=style))
        assert status == 200, data
        assert reply_view(proto, data)[0] == "hello"
    status, data = run(post(adapter, "sess-not-a-real-token", hi))
    assert status == 401 and error_code(proto, data) == "unknown_session"
    status, data = run(post(adapter, None, hi))
    assert status == 401 and error_code(proto, data) == "unknown_session"
    assert len(adapter.close_session(sid).records) == 2


def test_turn_cap_and_closed_session_are_refused(adapter):
    proto = adapter.protocol_name
    hi = body(proto, [{"role": "user", "content": "hi"}])
    sid, token = adapter.open_session(max_turns=2)
    assert [run(post(adapter, token, hi))[0] for _ in range(2)] == [200, 200]
    status, data = run(post(adapter, token, hi))
    assert status == 403 and error_code(proto, data) == "turn_limit_exceeded"
    result = adapter.close_session(sid)
    assert len(result.records) == 2 and result.refused == 1
    status, data = run(post(adapter, token, hi))
    assert status == 410 and error_code(proto, data) == "session_closed"
    with pytest.raises(KeyError):
        adapter.close_session(sid)


def test_bad_requests_name_the_field(adapter):
    proto = adapter.protocol_name
    sid, token = adapter.open_session()
    status, data = run(post(adapter, token, None, raw=b"{not json"))
    assert status == 400 and "not valid JSON" in data["error"]["message"]
    status, data = run(post(adapter, token, {"model": "m", "messages": [], "max_tokens": 5}))
    assert status == 400 and "messages" in data["error"]["message"]
    img = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    status, data = run(post(adapter, token, {"model": "m", "messages": img, "max_tokens": 5}))
    assert status == 400 and "messages[0].content[0]" in data["error"]["message"]
    long_prompt = body(proto, [{"role": "user", "content": "x" * 400}])  # past the 256-token context
    status, data = run(post(adapter, token, long_prompt))
    assert status == 400 and error_code(proto, data) == "engine_rejected"
    assert "context length" in data["error"]["message"]
    # none of these consumed a turn or left one in flight
    status, _ = run(post(adapter, token, body(proto, [{"role": "user", "content": "hi"}])))
    assert status == 200
    result = adapter.close_session(sid)
    assert len(result.records) == 1


def test_close_drains_in_flight_requests_and_records_nothing_after(adapter):
    """slime's W22 race: close() must wait for admitted requests, and refuse later ones."""
    proto = adapter.protocol_name
    sid, token = adapter.open_session(max_turns=100)
    # An unscripted prompt at temperature 1 generates until max_tokens: requests stay in flight a while.
    slow = body(proto, [{"role": "user", "content": "zz"}], temperature=1.0, max_tokens=60)
    session = adapter.sessions.get(sid)

    async def scenario():
        first = [asyncio.create_task(post(adapter, token, slow)) for _ in range(6)]
        deadline = time.monotonic() + 30
        while session.inflight < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        inflight_at_close = session.inflight
        closing = asyncio.create_task(adapter.aclose_session(sid))
        await asyncio.sleep(0)
        while session.state == "open":
            await asyncio.sleep(0.001)
        late = [asyncio.create_task(post(adapter, token, slow)) for _ in range(4)]
        result = await closing
        first_done = await asyncio.gather(*first)
        late_done = await asyncio.gather(*late)
        return inflight_at_close, result, first_done, late_done

    inflight_at_close, result, first_done, late_done = run(scenario())
    assert inflight_at_close >= 3
    ok = [d for s, d in first_done if s == 200]
    ids = {(d["id"].split("-")[1] if proto == "openai" else d["id"].split("_")[1]) for d in ok}
    # every request that got a reply has its turn in the result: nothing lost, close waited for them
    assert len(ok) >= inflight_at_close and len(result.records) == len(ok)
    assert {r.turn_id for r in result.records} == ids
    assert len(result.tree) == len(result.records)
    # everything that arrived after close began was refused, and nothing was recorded since
    assert [s for s, _ in late_done] == [410] * 4
    assert all(error_code(proto, d) == "session_closed" for _, d in late_done)
    assert len(result.records) == len(result.tree) == len(ok) and session.state == "closed"
    assert result.refused >= 4


def test_lone_surrogates_and_too_deep_json_are_400s_naming_the_field(adapter):
    """JSON may carry unpaired \\ud800 escapes and nest 100000 deep; neither may reach the
    tokenizer or the engine (they were 500s, and a 502 for a stop string)."""
    proto = adapter.protocol_name
    sid, token = adapter.open_session()
    hi = [{"role": "user", "content": "hi"}]
    stop_key = "stop" if proto == "openai" else "stop_sequences"
    if proto == "openai":
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "1", "note": "\ud800"}},
                }
            ],
        }
        answer = {"role": "tool", "tool_call_id": "c0", "content": "1"}
        bad_call = ("messages[1].tool_calls[0].function.arguments.note", [hi[0], call, answer])
    else:
        call = {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "c0", "name": "calculator", "input": {"expression": "1", "note": "\ud800"}}
            ],
        }
        answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c0", "content": "1"}]}
        bad_call = ("messages[1].content[0].input.note", [hi[0], call, answer])
    cases = [
        ("messages[0].content", {"messages": [{"role": "user", "content": "hi \ud800"}]}),
        (f"{stop_key}[0]", {"messages": hi, stop_key: ["\udcff"]}),
        (bad_call[0], {"messages": bad_call[1]}),
    ]
    for field, payload in cases:
        status, data = run(post(adapter, token, {"model": "m", "max_tokens": 8, **payload}))
        assert status == 400 and error_code(proto, data) == "invalid_request", (field, data)
        assert (
            data["error"]["message"].startswith(f"{field}: contains '\\u")
            and "lone surrogate" in data["error"]["message"]
        )
    status, data = run(post(adapter, token, None, raw=b"[" * 100000 + b"]" * 100000))
    assert status == 400 and "nests too deeply" in data["error"]["message"]
    # none of them consumed a turn; the session still works
    assert run(post(adapter, token, body(proto, hi)))[0] == 200
    assert len(adapter.close_session(sid).records) == 1


def test_out_of_range_seed_is_refused_before_it_reaches_a_batch(engine, tok):
    """torch's manual_seed takes [-2**63, 2**64-1]; a seed past it used to fail the engine step
    and abort every request batched with it (503s in other sessions)."""
    srv = start_adapter("openai", engine.url, tok)
    hi = [{"role": "user", "content": "hi"}]
    try:

        async def scenario():
            others = [srv.open_session()[1] for _ in range(3)]
            busy = [
                asyncio.create_task(
                    post(srv, t, body("openai", [{"role": "user", "content": "zz"}], temperature=1.0, max_tokens=40))
                )
                for t in others
            ]
            token = srv.open_session()[1]
            # sampled (temperature 1), so the engine would seed a generator with it
            bad = [await post(srv, token, body("openai", hi, seed=s, temperature=1.0)) for s in (2**64, -(2**63) - 1)]
            edges = [
                await post(srv, token, body("openai", hi, seed=s, temperature=1.0, max_tokens=4))
                for s in (2**64 - 1, -(2**63))
            ]
            return bad, edges, await asyncio.gather(*busy)

        bad, edges, busy = run(scenario())
    finally:
        srv.stop()
    for status, data in bad:
        assert status == 400, data
        assert data["error"]["message"].startswith("seed: must be an integer in [-2**63, 2**64-1]")
    assert [s for s, _ in edges] == [200, 200]  # the boundaries themselves are valid
    assert [s for s, _ in busy] == [200, 200, 200]

    async def direct(params):  # the engine refuses it too, so /generate cannot poison a batch
        async with aiohttp.ClientSession() as s:
            async with s.post(
                engine.url + "/generate", json={"input_ids": tok.encode("hi"), "sampling_params": params}
            ) as r:
                return r.status, await r.text()

    status, text = run(direct({"max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 2**64}))
    assert status == 400 and "sampling_params.sampling_seed must be an integer in [-2**63, 2**64-1]" in text
    status, text = run(direct({"max_new_tokens": 2, "stop": ["\udcff"]}))
    assert status == 400 and "sampling_params.stop" in text and "lone surrogate" in text
    assert run(direct({"max_new_tokens": 2, "temperature": 1.0, "sampling_seed": 2**64 - 1}))[0] == 200


class _GatedTemplate:
    """The real tokenizer, but rendering a prompt that starts with "big" waits for ``release``:
    a stand-in for seconds of template + tokenise work on a multi-MB prompt."""

    def __init__(self, tok):
        self._tok = tok
        self.entered, self.release = threading.Event(), threading.Event()
        self.released = None

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def apply_chat_template(self, messages, **kwargs):
        if messages[-1]["content"].startswith("big"):
            self.entered.set()
            self.released = self.release.wait(20)  # bounded: a regression fails instead of hanging
        return self._tok.apply_chat_template(messages, **kwargs)


def test_a_large_prompt_does_not_stall_other_sessions(engine, tok):
    gate = _GatedTemplate(tok)
    srv = start_adapter("openai", engine.url, gate)
    (_, big_token), (_, small_token) = srv.open_session(), srv.open_session()
    big = body("openai", [{"role": "user", "content": "big " + "hello world " * ((1 << 20) // 12)}])
    order = []

    async def send(name, token, payload):
        out = await post(srv, token, payload)
        order.append(name)
        return out

    async def scenario():
        big_task = asyncio.create_task(send("big", big_token, big))
        assert await asyncio.to_thread(gate.entered.wait, 60)
        async with aiohttp.ClientSession() as s:
            async with s.get(srv.url + "/health") as r:
                health = r.status
        small = await send("small", small_token, body("openai", [{"role": "user", "content": "hi"}]))
        gate.release.set()
        return health, small, await big_task

    try:
        health, small, big_reply = run(scenario())
        # a body past 8 MiB is refused before it is parsed
        status, text = run(post(srv, small_token, None, raw=b'{"messages": "' + b"a" * (9 << 20) + b'"}'))
    finally:
        srv.stop()
    # /health and the small request were served while the big prompt was still rendering
    assert gate.released is True and order == ["small", "big"] and health == 200
    assert small[0] == 200 and reply_view("openai", small[1])[0] == "hello"
    assert big_reply[0] == 400 and "context length" in big_reply[1]["error"]["message"]  # ~260k tokens
    assert status == 413 and "8388608" in text


@pytest.mark.parametrize("proto", ["openai", "anthropic"])
def test_generate_plugin_runs_the_tool_in_a_sandbox_and_scores(proto, engine, tok):
    """The default agent loop end to end on the scripted model (greedy, so deterministic)."""
    from slime.agent.generate import AgentConfig, AgentRunner, shutdown_adapters
    from slime.backends.rollout.client import EngineClient
    from slime.rl.sample import Sample, SampleStatus

    cfg = AgentConfig(
        protocol=proto, max_turns=3, tools=("calculator",), sandbox_kwargs={"wall_timeout_s": 10}, max_length=256
    )
    runner = AgentRunner(cfg, EngineClient(engine.url).base_url, tok)
    sample = Sample(group_index=3, index=7, prompt="call", label="19", metadata={"src": "t"})
    try:
        [out] = run(runner.run(sample, {"temperature": 0.0, "max_new_tokens": 96}))
        [wrong] = run(
            runner.run(
                Sample(group_index=3, index=8, prompt="call", label="20"), {"temperature": 0.0, "max_new_tokens": 96}
            )
        )
    finally:
        shutdown_adapters()
    agent = out.metadata["agent"]
    assert agent["stop"] == "answer" and agent["turns"] == 2 and agent["placements"] == ["root", "extend"]
    # the calculator really ran in a bubblewrap sandbox (the model never saw "19" before the tool said so)
    assert agent["tool_calls"] == [
        {
            "name": "calculator",
            "arguments": {"expression": "07+12"},
            "ok": True,
            "timed_out": False,
            "sandbox_id": agent["sandbox_id"],
            "output": "19",
        }
    ]
    assert agent["sandbox_id"].startswith("local-")
    assert (out.response, out.reward, wrong.reward) == ("19", 1.0, 0.0)
    assert (out.group_index, out.index, out.label, out.metadata["src"]) == (3, 7, "19", "t")
    assert out.status == SampleStatus.COMPLETED and out.weight_version == -1
    out.check_lengths()
    resp = out.tokens[-out.response_length :]
    assert tok.decode([t for t, m in zip(resp, out.loss_mask) if m]) == CALL + "<|im_end|>19<|im_end|>"
    assert tok.decode(out.tokens[: out.prompt_length]).endswith(
        "<|im_start|>user\ncall<|im_end|>\n<|im_start|>assistant\n"
    )


# ------------------------------------------------- parsing and tools (no engine needed)
def _ids():
    n = iter(range(100))
    return lambda: f"c{next(n)}"


def test_parse_tool_calls_text_valid_invalid_and_unclosed():
    text = (
        "pre " + CALL + ' mid <tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}'
        "</tool_call>" + BAD + '<tool_call>{"arguments": {}}</tool_call> tail <tool_call>{"name": "x"'
    )
    p = parse_tool_calls(text, _ids())
    assert [(c.id, c.name, c.arguments) for c in p.tool_calls] == [
        ("c0", "calculator", {"expression": "07+12"}),
        ("c1", "python", {"code": "print(1)"}),
    ]
    assert p.tool_calls[0].raw_arguments == '{"expression": "07+12"}'  # as generated
    assert p.tool_calls[1].raw_arguments == '{"code": "print(1)"}'  # double-encoded: normalised
    bad = p.invalid_tool_calls
    assert [(b.name, b.error.split(":")[0]) for b in bad] == [
        ("calculator", "tool call is not valid JSON"),
        (None, 'tool call has no "name" (a non-empty string)'),
        ("x", "<tool_call> is never closed with </tool_call>"),
    ]
    # content keeps every character except the valid calls
    assert p.content == "pre  mid " + BAD + '<tool_call>{"arguments": {}}</tool_call> tail <tool_call>{"name": "x"'
    assert isinstance(p.parts[1], ToolCall) and isinstance(p.parts[-1], InvalidToolCall)
    assert parse_tool_calls("just text", _ids()).content == "just text"
    arr = parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', _ids())
    assert "must be a JSON object" in arr.invalid_tool_calls[0].error


def test_tools_run_in_the_sandbox_and_never_raise():
    from slime.agent.sandbox import make_sandbox

    python, calculator = get_tools(["python", "calculator"])

    async def go():
        async with make_sandbox("local", cpu_time_s=5, memory_mb=512, wall_timeout_s=10) as sb:
            calc = [
                await calculator.run(sb, {"expression": e}, timeout=5)
                for e in ("07+12", "7/2", "-(3+4)*2", "1/0", "__import__('os')", "9**9**9")
            ]
            py = [
                await python.run(sb, {"code": c}, timeout=2)
                for c in ("import os; print(os.getcwd(), os.getuid())", "raise SystemExit(3)", "while True: pass")
            ]
            missing = await python.run(sb, {"src": "1"}, timeout=2)
            return calc, py, missing

    calc, py, missing = run(go())
    assert [(r.ok, r.output) for r in calc] == [
        (True, "19"),
        (True, "3.5"),
        (True, "-14"),
        (False, "error: division by zero"),
        (False, "error: not an arithmetic expression (numbers, + - * / // % ** and parentheses only)"),
        (False, "error: number too large"),
    ]
    assert py[0].ok and py[0].output == "/work 1000\n"  # inside the sandbox: its workdir, its uid
    assert (py[1].ok, py[1].output) == (False, "exit code 3")
    assert py[2].timed_out and py[2].output.startswith("error: timed out")
    assert (missing.ok, missing.output) == (False, "error: python needs 'code' (a string)")


def test_tools_refuse_nul_and_lone_surrogate_arguments_without_raising():
    """JSON "\\u0000" / "\\ud800" in generated arguments used to raise out of Tool.run and end the rollout."""
    from slime.agent.sandbox import make_sandbox

    python, calculator = get_tools(["python", "calculator"])

    async def go():
        async with make_sandbox("local", allow_unisolated=True, wall_timeout_s=10) as sb:
            results = [
                await python.run(sb, {"code": "print(1)\x00"}, timeout=5),
                await python.run(sb, {"code": "print('\ud800')"}, timeout=5),
                await calculator.run(sb, {"expression": "1+\x00"}, timeout=5),
            ]
            return results, await python.run(sb, {"code": "print(1)"}, timeout=5)

    results, after = run(go())
    assert [(r.ok, r.output) for r in results] == [
        (False, "error: python 'code' contains a NUL byte (\\x00) at position 8"),
        (
            False,
            "error: python 'code' contains '\\ud800' at position 7, a lone surrogate that is not valid Unicode text",
        ),
        (False, "error: calculator 'expression' contains a NUL byte (\\x00) at position 2"),
    ]
    assert (after.ok, after.output) == (True, "1\n")  # the sandbox is unharmed


def test_anthropic_text_block_without_string_text_names_the_field():
    from slime.agent.adapters.anthropic import AnthropicProtocol
    from slime.agent.adapters.sessions import AdapterError

    for role, block, got in (
        ("user", {"type": "text", "text": 5}, "got int"),
        ("user", {"type": "text"}, "it is missing"),
        ("assistant", {"type": "text", "text": None}, "got NoneType"),
    ):
        msgs = [{"role": "user", "content": "q"}] if role == "assistant" else []
        msgs.append({"role": role, "content": [{"type": "text", "text": "ok"}, block]})
        with pytest.raises(AdapterError) as info:
            AnthropicProtocol().parse({"messages": msgs, "max_tokens": 4})
        assert info.value.message == f"messages[{len(msgs) - 1}].content[1].text: must be a string ({got})"
        assert info.value.status == 400


def test_dead_engine_is_a_503_and_fails_the_episode_loudly(tok):
    import socket

    from slime.agent.generate import AgentConfig, AgentRunner, shutdown_adapters
    from slime.rl.sample import Sample

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    srv = start_adapter("openai", dead, tok, max_turns=1)
    try:
        sid, token = srv.open_session()
        status, data = run(post(srv, token, body("openai", [{"role": "user", "content": "hi"}])))
        assert status == 503 and data["error"]["code"] == "engine_unavailable"
        status, _ = run(post(srv, token, body("openai", [{"role": "user", "content": "hi"}])))
        assert status == 503  # the failed request gave its turn back: not a 403 turn-cap refusal
        assert srv.close_session(sid).records == []
    finally:
        srv.stop()
    runner = AgentRunner(AgentConfig(tools=("calculator",)), dead, tok)
    try:
        with pytest.raises(RuntimeError, match="engine_unavailable|unreachable"):
            run(runner.run(Sample(group_index=0, index=0, prompt="hi", label="x"), {"max_new_tokens": 8}))
    finally:
        shutdown_adapters()
