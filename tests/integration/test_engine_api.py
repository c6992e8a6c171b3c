"""Contract of the built-in engine's HTTP API (SGLang native subset) through the real client.

A real server runs in-process on a free 127.0.0.1 port over the built-in tiny
model; every call goes over HTTP. Log-probs are checked against a plain
Hugging Face forward pass, the way a trainer computes them.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
aiohttp = pytest.importorskip("aiohttp")

from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from slime.backends.rollout.client import EngineClient, EngineError, EngineUnavailable  # noqa: E402
from tests.fixtures.decoder_parity import worst_logit_diff  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def models(tiny_model):
    return tiny_model(seed=0), tiny_model(seed=1)


@pytest.fixture(scope="module")
def server(models):
    srv = start_server(models[0], host="127.0.0.1", port=0, seed=0)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tok(models):
    return transformers.AutoTokenizer.from_pretrained(models[0])


def run(coro):
    return asyncio.run(coro)


async def _call(url, fn):
    async with EngineClient(url, timeout_s=60) as c:
        return await fn(c)


async def _raw(url, method, path, payload=None, data=None):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, url + path, json=payload, data=data) as r:
            return r.status, await r.text()


def gen(server, ids, params, **kw):
    return run(_call(server.url, lambda c: c.generate(ids, params, **kw)))


# ------------------------------------------------------------------ endpoints
def test_health_info_and_cache(server, models):
    async def go(c):
        return (
            await c.health(),
            await c.health_generate(),
            await c.get_model_info(),
            await c.flush_cache(),
            await c.get("/get_server_info"),
            await c.get("/get_weight_version"),
        )

    healthy, gen_ok, info, flushed, server_info, version = run(_call(server.url, go))
    assert healthy and gen_ok and flushed is None
    assert info["model_path"] == str(models[0]) and info["is_generation"] is True
    assert info["weight_version"] == version["weight_version"]
    assert server_info["context_length"] == 256


def test_generate_response_shape_matches_sglang(server, tok):
    payload = {
        "input_ids": tok.encode("07+12="),
        "return_logprob": True,
        "rid": "shape-1",
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True},
    }
    status, body = run(_raw(server.url, "POST", "/generate", payload))
    assert status == 200
    import json

    out = json.loads(body)
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert meta["prompt_tokens"] == 6 and meta["completion_tokens"] == 4
    assert isinstance(meta["weight_version"], str)
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"] and all(t[2] is None for t in triples)
    assert all(isinstance(t[0], float) and t[0] <= 0 for t in triples)
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
    # without return_logprob the triples are omitted, like SGLang
    payload["return_logprob"], payload["rid"] = False, "shape-2"
    out2 = json.loads(run(_raw(server.url, "POST", "/generate", payload))[1])
    assert "output_token_logprobs" not in out2["meta_info"] and out2["output_ids"] == out["output_ids"]


def test_batched_generate_with_per_item_params(server, tok):
    prompts = [tok.encode(p) for p in ("07+12=", "1", "hello world")]
    params = [{"max_new_tokens": n, "ignore_eos": True, "temperature": t} for n, t in ((3, 0), (7, 1.0), (1, 0.5))]
    results = gen(server, prompts, params)
    assert [len(r.output_ids) for r in results] == [3, 7, 1]
    assert all(r.finish_reason == "length" and len(r.logprobs) == len(r.output_ids) for r in results)
    single = gen(server, prompts[0], params[0])
    assert single.output_ids == results[0].output_ids  # greedy: same alone or batched


def test_concurrent_batches_share_one_prefill_and_the_window_is_bounded(models, tok):
    """An idle engine collects requests until none arrived for ``batch_window_s``: batch requests sent
    together (a rollout's groups, each its own ``/generate``) start in one prefill, even a batch whose
    last item came first. The collection ends ``batch_window_max_s`` after the first arrival however
    long the quiet window: with a 60 s window a lone batch still returns (a waiting engine would hit the
    test's timeout)."""
    srv = start_server(models[0], host="127.0.0.1", port=0, seed=0, batch_window_s=1.0, batch_window_max_s=5.0)
    params = {"max_new_tokens": 2, "ignore_eos": True, "temperature": 0}
    groups = [[tok.encode(p)] * 3 for p in ("07+12=", "1", "hello world", "5+5=")]

    async def staggered(c):
        async def one(i, ids):
            await asyncio.sleep(0.05 * i)  # within the quiet window of the one before
            return await c.generate(ids, [params] * len(ids), rid=[f"g{i}-{j}." for j in range(len(ids))])

        return await asyncio.gather(*(one(i, ids) for i, ids in enumerate(groups)))

    try:
        out = run(_call(srv.url, staggered))
        assert [[len(r.output_ids) for r in g] for g in out] == [[2, 2, 2]] * 4
        assert srv.engine.prefills == 1, "the four batches were admitted in separate prefills"
        assert srv.engine.decode_steps == 1  # the second token of every sample, in one step
    finally:
        srv.stop()
    srv = start_server(models[0], host="127.0.0.1", port=0, seed=0, batch_window_s=60.0, batch_window_max_s=0.5)
    try:
        t = time.monotonic()
        results = gen(srv, groups[0], [params] * 3)
        assert [len(r.output_ids) for r in results] == [2, 2, 2]
        assert time.monotonic() - t < 50, "the engine waited out its quiet window past batch_window_max_s"
    finally:
        srv.stop()


def test_text_input(server, tok):
    by_text = run(
        _call(
            server.url,
            lambda c: c.post(
                "/generate",
                {"text": "07+12=", "sampling_params": {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True}},
            ),
        )
    )
    by_ids = gen(server, tok.encode("07+12="), {"temperature": 0, "max_new_tokens": 3, "ignore_eos": True})
    assert by_text["output_ids"] == by_ids.output_ids


def test_greedy_is_deterministic_under_concurrency(server, tok):
    ids = tok.encode("33+41=")
    params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}

    async def go(c):
        others = [
            c.generate(tok.encode(f"{i:02d}+{i:02d}="), {"temperature": 1.0, "max_new_tokens": 20}) for i in range(16)
        ]
        return await asyncio.gather(c.generate(ids, params), *others, c.generate(ids, params))

    results = run(_call(server.url, go))
    first, last = results[0], results[-1]
    alone = gen(server, ids, params)
    assert first.output_ids == last.output_ids == alone.output_ids
    assert first.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_sampling_seed_reproducible_and_filters(server, tok):
    ids = tok.encode("07+12=")
    seeded = {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": 1234}
    a, b = gen(server, ids, seeded), gen(server, [ids, tok.encode("x")], [seeded, seeded])[0]
    assert a.output_ids == b.output_ids
    c = gen(server, ids, {**seeded, "sampling_seed": 99})
    assert c.output_ids != a.output_ids
    greedy = gen(server, ids, {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True})
    # top_k=1 and a vanishing top_p keep only the argmax token: the output equals greedy's
    assert gen(server, ids, {**seeded, "top_k": 1}).output_ids == greedy.output_ids
    assert gen(server, ids, {**seeded, "top_p": 1e-6}).output_ids == greedy.output_ids


def test_max_new_tokens_gives_length_and_eos_gives_stop(server, tok):
    r = gen(server, tok.encode("1+1="), {"max_new_tokens": 5, "ignore_eos": True})
    assert (r.finish_reason, len(r.output_ids), r.truncated) == ("length", 5, True)
    # context limit: the output is cut where prompt + output reach the context length (256)
    r = gen(server, list(range(5, 100)) * 2 + [5] * 50, {"max_new_tokens": 50, "ignore_eos": True})
    assert r.finish_reason == "length" and len(r.output_ids) == 256 - 240
    # a token listed in stop_token_ids ends the sequence; it is kept in output_ids, trimmed from text
    sample = gen(server, tok.encode("07+12="), {"max_new_tokens": 40, "ignore_eos": True, "sampling_seed": 5})
    stop_id = sample.output_ids[10]
    k = sample.output_ids.index(stop_id)
    r = gen(
        server,
        tok.encode("07+12="),
        {"max_new_tokens": 40, "ignore_eos": True, "sampling_seed": 5, "stop_token_ids": [stop_id]},
    )
    assert (r.finish_reason, r.matched) == ("stop", stop_id)
    assert r.output_ids == sample.output_ids[: k + 1]
    assert r.text == tok.decode(sample.output_ids[:k], skip_special_tokens=True)


def test_stop_strings(server, tok):
    params = {"max_new_tokens": 60, "ignore_eos": True, "sampling_seed": 11, "temperature": 1.0}
    sample = gen(server, tok.encode("07+12="), params)
    pieces = [tok.decode([t]) for t in sample.output_ids]
    # a two-character stop string taken from the sampled output (printable ASCII only)
    k = next(
        i
        for i in range(2, len(pieces))
        if all(len(p) == 1 and p.isprintable() and p.isascii() for p in pieces[i - 1 : i + 1])
    )
    stop = pieces[k - 1] + pieces[k]
    first = next(i for i in range(1, len(pieces)) if pieces[i - 1] + pieces[i] == stop)
    r = gen(server, tok.encode("07+12="), {**params, "stop": [stop, "@@never@@"]})
    assert (r.finish_reason, r.matched) == ("stop", stop)
    assert r.output_ids == sample.output_ids[: first + 1]
    assert stop not in r.text and r.text == tok.decode(sample.output_ids[: first + 1])[: -len(stop)]
    kept = gen(server, tok.encode("07+12="), {**params, "stop": stop, "no_stop_trim": True})
    assert kept.text.endswith(stop)


def test_logprobs_match_a_trainer_forward(server, models, tok):
    model = transformers.AutoModelForCausalLM.from_pretrained(models[0], dtype=torch.float32).eval()
    ragged = [tok.encode(p) for p in ("07+12=", "49+49=", "<|im_start|>user\nhi<|im_end|>\n")]
    worst = 0.0
    # equal-length prompts take the unmasked decode path, ragged ones the masked one
    for temperature, prompts in ((1.0, ragged), (0.7, ragged), (0.0, ragged), (1.0, ragged[:2])):
        params = {"temperature": temperature, "max_new_tokens": 20, "ignore_eos": True, "top_p": 0.9}
        for prompt, res in zip(prompts, gen(server, prompts, [params] * len(prompts))):
            seq = torch.tensor([prompt + res.output_ids])
            with torch.no_grad():
                logits = model(seq).logits[0, len(prompt) - 1 : -1].float()
            if temperature > 0:
                logits = logits / temperature
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(res.output_ids)[:, None]).squeeze(1)
            worst = max(worst, (ref - torch.tensor(res.logprobs)).abs().max().item())
    assert worst <= 1e-3, worst


def test_update_weights_from_disk_changes_outputs_and_version(server, models, tok):
    ids = tok.encode("12+34=")
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    before = gen(server, ids, params)

    async def go(c):
        upd = await c.update_weights_from_disk(str(models[1]), weight_version="step-7")
        after = await c.generate(ids, params)
        info = await c.get_model_info()
        with pytest.raises(EngineError) as bad:
            await c.update_weights_from_disk(str(models[1] / "missing"), weight_version="nope")
        still = await c.generate(ids, params)
        await c.update_weights_from_disk(str(models[0]), weight_version="step-8")
        back = await c.generate(ids, params)
        return upd, after, info, bad.value, still, back

    upd, after, info, bad, still, back = run(_call(server.url, go))
    assert upd["success"] is True and "step-7" in upd["message"]
    assert after.output_ids != before.output_ids or after.logprobs != pytest.approx(before.logprobs, abs=1e-4)
    assert after.weight_version == "step-7" and info["weight_version"] == "step-7"
    assert info["model_path"] == str(models[1])
    assert bad.status == 400 and "missing" in bad.message
    assert still.output_ids == after.output_ids and still.weight_version == "step-7"  # failed load changed nothing
    assert back.output_ids == before.output_ids and back.weight_version == "step-8"
    assert back.logprobs == pytest.approx(before.logprobs, abs=1e-5)


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (None, "not valid JSON"),
        ([1, 2], "must be a JSON object"),
        ({"sampling_params": {}}, "exactly one of 'input_ids' or 'text'"),
        ({"input_ids": []}, "non-empty list"),
        ({"input_ids": [1, "a"]}, "non-empty list of integers"),
        ({"input_ids": [[1], []]}, "input_ids[1]"),
        ({"input_ids": [1, 99999]}, "token ids must be integers in [0, 261)"),
        ({"input_ids": [1] * 256}, "context length is 256"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be >= 0"),
        ({"input_ids": [1], "sampling_params": {"temperature": -0.5}}, "temperature must be >= 0"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1]"),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k must be -1"),
        ({"input_ids": [1], "sampling_params": {"temprature": 1}}, "unknown sampling_params key 'temprature'"),
        ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty=0.5 is not supported"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
        ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params has 1 entries but the batch has 2"),
        ({"input_ids": [1], "stream": True}, "stream=true is not supported"),
        ({"input_ids": [1], "rid": 5}, "rid must be a string"),
        ({"input_ids": [1], "return_logprob": "yes"}, "return_logprob must be true/false"),
        ({"input_ids": [1], "bogus": 1}, "unknown /generate field(s) ['bogus']"),
    ],
)
def test_bad_generate_requests_get_400(server, payload, fragment):
    data = b"{nope" if payload is None else None
    status, body = run(_raw(server.url, "POST", "/generate", payload if data is None else None, data))
    import json

    assert status == 400, body
    assert fragment in json.loads(body)["error"]["message"]


def test_bad_admin_requests_get_400_and_server_survives(server):
    for path, payload, fragment in [
        ("/update_weights_from_disk", {}, "model_path"),
        ("/update_weights_from_disk", {"model_path": "/nonexistent/dir"}, "not a directory"),
        ("/abort_request", {}, "give a request id"),
        ("/update_weight_version", {"new_version": ""}, "new_version"),
    ]:
        status, body = run(_raw(server.url, "POST", path, payload))
        assert status == 400 and fragment in body, (path, body)
    assert run(_call(server.url, lambda c: c.health()))


def test_duplicate_rid_in_batch_rejected(server):
    status, body = run(
        _raw(
            server.url,
            "POST",
            "/generate",
            {"input_ids": [[1], [2]], "rid": ["same", "same"], "sampling_params": {"max_new_tokens": 2}},
        )
    )
    assert status == 400 and "already in flight" in body


def test_abort_one_and_all(server, tok):
    params = {"max_new_tokens": 240, "ignore_eos": True}

    async def go(c):
        task = asyncio.ensure_future(c.generate(tok.encode("abc"), params, rid="long-1"))
        others = [asyncio.ensure_future(c.generate(tok.encode("x"), params, rid=f"bulk-{i}")) for i in range(3)]
        await asyncio.sleep(0.05)
        await c.abort("long-1")
        one = await task
        await c.abort(abort_all=True)
        rest = await asyncio.gather(*others)
        return one, rest

    one, rest = run(_call(server.url, go))
    assert one.aborted and len(one.output_ids) < 240 and len(one.logprobs) == len(one.output_ids)
    assert all(r.aborted for r in rest)
    assert gen(server, tok.encode("abc"), {"max_new_tokens": 3}).finish_reason in ("length", "stop")


def test_abort_matches_sglang_rids_prefixes_and_partial_replies(server, tok):
    """SGLang 0.5's /abort_request: an in-flight rid aborts every request it prefixes, an unknown rid is a
    no-op; a batch with one string rid names its items rid_0, rid_1, ...; the aborted reply is a 200 with
    the tokens and log-probs so far and finish_reason {type: abort, message, status_code, err_type}."""
    params = {"max_new_tokens": 240, "ignore_eos": True}

    async def go(c):
        group = asyncio.ensure_future(c.generate([tok.encode("ab")] * 3, params, rid="grp"))
        other = asyncio.ensure_future(c.generate(tok.encode("zz"), {"max_new_tokens": 6, "ignore_eos": True}, rid="g"))
        await asyncio.sleep(0.05)
        await c.abort("no-such-request")  # not in flight: nothing happens (and no error)
        await c.abort("grp_0")  # in flight: aborts grp_0 only ("grp_0" prefixes no other rid)
        await asyncio.sleep(0.05)
        assert not group.done()  # grp_1 and grp_2 still run
        await c.abort("grp_1")
        await c.abort("grp_2")
        return await group, await other

    (a, b, c_), other = run(_call(server.url, go))
    assert [r.rid for r in (a, b, c_)] == ["grp_0", "grp_1", "grp_2"]
    for r in (a, b, c_):
        assert r.aborted and 0 < len(r.output_ids) < 240 and len(r.logprobs) == len(r.output_ids)
        assert r.meta_info["finish_reason"] == {
            "type": "abort",
            "message": "Aborted by /abort_request",
            "status_code": None,
            "err_type": None,
        }
        assert r.meta_info["completion_tokens"] == len(r.output_ids) and r.text == tok.decode(
            r.output_ids, skip_special_tokens=True
        )
    assert not other.aborted and len(other.output_ids) == 6  # "g" is a prefix of "grp_*", never aborted itself


def test_an_aborted_reply_continues_where_it_stopped(server, tok):
    """What partial rollout relies on: prompt + partial tokens, sent again, continue the response; with
    greedy decoding the two parts equal one uninterrupted response."""
    prompt = tok.encode("12+34=")
    greedy = {"temperature": 0.0, "ignore_eos": True}
    whole = gen(server, prompt, {**greedy, "max_new_tokens": 40})

    async def go(c):
        task = asyncio.ensure_future(c.generate(prompt, {**greedy, "max_new_tokens": 40}, rid="cut"))
        # An abort of a rid not yet in flight is a no-op (as in SGLang): under load the request may reach
        # the server late, so abort until it is cut (bounded: 200 x 10 ms).
        for _ in range(200):
            await asyncio.sleep(0.01)
            if task.done():
                break
            await c.abort("cut")
        return await task

    part = run(_call(server.url, go))
    assert part.aborted and len(part.output_ids) < 40
    rest = gen(server, prompt + part.output_ids, {**greedy, "max_new_tokens": 40 - len(part.output_ids)})
    assert part.output_ids + rest.output_ids == whole.output_ids
    joined = part.logprobs + rest.logprobs
    assert max(abs(x - y) for x, y in zip(joined, whole.logprobs)) < 1e-4


# ------------------------------------------------------------------- client
def test_client_errors_name_the_url():
    with pytest.raises(ValueError, match="must start with http"):
        EngineClient("localhost:1")

    async def go():
        c = EngineClient("http://127.0.0.1:9", timeout_s=5, retries=2, backoff_s=0.01)  # port 9: discard, closed
        assert await c.health() is False
        t = time.monotonic()
        with pytest.raises(EngineUnavailable, match=r"127\.0\.0\.1:9/health.*not healthy after 0\.3 s"):
            await c.wait_healthy(timeout_s=0.3, interval_s=0.05)
        assert time.monotonic() - t < 5
        with pytest.raises(EngineUnavailable, match="after 3 attempt"):
            await c.get_model_info()  # idempotent: retried
        with pytest.raises(EngineUnavailable, match="after 1 attempt"):
            await c.generate([1, 2], {})  # never resent
        await c.close()

    run(go())


def test_cli_serves_and_stops_on_sigterm(models, capsys):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slime.backends.rollout.builtin.server",
            "--model-path",
            str(models[0]),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--seed",
            "1",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line + proc.stderr.read()
        url = match.group(1)
        out = run(_call(url, lambda c: c.generate([5, 6, 7], {"max_new_tokens": 2, "ignore_eos": True})))
        assert len(out.output_ids) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from slime.backends.rollout.builtin.server import main

    assert main(["--model-path", str(models[0] / "nope")]) == 2  # same entry point, in-process
    assert "no config.json" in capsys.readouterr().err


def test_in_memory_weight_update_and_bad_tensors(server, models, tok):
    """The colocated path (no HTTP): tensors handed to the engine object directly."""
    from safetensors.torch import load_file

    ids = tok.encode("07+07=")
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    before = gen(server, ids, params)
    other = load_file(models[1] / "model.safetensors")
    ok, msg = server.engine.update_weights_from_tensors(list(other.items()), weight_version="mem-1").result(30)
    assert ok, msg
    changed = gen(server, ids, params)
    assert changed.weight_version == "mem-1"
    ok, msg = server.engine.update_weights_from_tensors([("model.norm.weight", torch.ones(3))]).result(30)
    assert not ok and "model.norm.weight: shape (3,) != model shape (128,)" in msg
    mine = load_file(models[0] / "model.safetensors")
    ok, _ = server.engine.update_weights_from_tensors(list(mine.items()), weight_version="mem-2").result(30)
    restored = gen(server, ids, params)
    assert ok and restored.output_ids == before.output_ids and restored.weight_version == "mem-2"
    assert changed.logprobs != pytest.approx(before.logprobs, abs=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_decoder_matches_hf_forward_for_each_architecture(tmp_path, arch):
    """Prefill then decode through the lean decoder (both cache layouts, masked and unmasked steps)
    against a full HF forward pass at every step."""
    from slime.backends.rollout.builtin.decoder import LeanDecoder

    # 4 KV heads (mistral) take the per-head cache layout, 2 KV heads the row-wise one
    kinds = {
        "llama": lambda **kw: transformers.LlamaConfig(num_key_value_heads=2, **kw),
        "qwen3": lambda **kw: transformers.Qwen3Config(head_dim=48, num_key_value_heads=2, **kw),
        "mistral": lambda **kw: transformers.MistralConfig(sliding_window=None, num_key_value_heads=4, **kw),
    }
    cfg = kinds[arch](
        vocab_size=64,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=8 if arch == "mistral" else 4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    dec = LeanDecoder(model, max_slots=6, max_len=64)
    assert dec.rowwise == (arch != "mistral")
    worst = 0.0
    # ragged prompts use the masked decode path; equal lengths may skip the mask
    for lengths, same in (((3, 7, 5), False), ((5, 5, 5), True)):
        prompts = [torch.randint(0, 64, (n,)) for n in lengths]
        slots = torch.tensor([4, 0, 2])
        worst = max(worst, worst_logit_diff(model, dec, prompts, slots, steps=6, same_position=same))
    assert worst < 1e-4, worst
