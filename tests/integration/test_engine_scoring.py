"""SGLang's scoring form on the built-in engine: ``/generate`` with ``return_logprob`` and ``logprob_start_len``.

The reply's ``meta_info.input_token_logprobs`` has SGLang's shape (one ``[log-prob, token id, text]`` per
``input_ids[logprob_start_len:]``, the first log-prob None) and its values match a direct Hugging Face
forward of the model at the request's temperature to 1e-5 (fp32 on CPU), alone or in a ragged batch,
with or without new tokens. Bad starts get a 400 naming the field. This is what the on-policy
distillation teacher (``algorithm.opd.type: engine``) answers.
"""

from __future__ import annotations

import asyncio
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
aiohttp = pytest.importorskip("aiohttp")

from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from tests.fixtures.tiny_models import SMALL  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model(seed=5, **SMALL)


@pytest.fixture(scope="module")
def server(model_dir):
    srv = start_server(model_dir, host="127.0.0.1", port=0, seed=0)
    yield srv
    srv.stop()


def post(server, payload) -> tuple[int, object]:
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(server.url + "/generate", json=payload) as r:
                return r.status, json.loads(await r.text())

    return asyncio.run(go())


def direct(model_dir, ids: list[int], start: int, temperature: float) -> list[float]:
    """log p(ids[t] | ids[:t]) for t in (start, len), from the model's own forward."""
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, start:-1].float()
    if temperature > 0:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[start + 1 :])[:, None]).squeeze(1).tolist()


SEQS = [[5, 17, 33, 2, 90, 41, 7, 7, 120], [3, 44, 10], [200, 1, 9, 9, 60, 61, 62, 63, 64, 65, 66, 12, 13]]


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
def test_input_log_probs_match_a_direct_forward_in_a_ragged_batch(server, model_dir, temperature):
    starts = [4, 0, 9]
    status, out = post(
        server,
        {
            "input_ids": SEQS,
            "sampling_params": {"max_new_tokens": 0, "temperature": temperature},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": starts,
        },
    )
    assert status == 200, out
    for ids, k, item in zip(SEQS, starts, out):
        triples = item["meta_info"]["input_token_logprobs"]
        assert [t[1] for t in triples] == ids[k:] and triples[0][0] is None
        assert all(isinstance(t[2], str) for t in triples)
        got = torch.tensor([t[0] for t in triples[1:]])
        assert (got - torch.tensor(direct(model_dir, ids, k, temperature))).abs().max() <= 1e-5
        assert item["output_ids"] == [] and item["meta_info"]["finish_reason"]["type"] == "length"


def test_scoring_alongside_generation_and_the_default_start(server, model_dir):
    ids = SEQS[0]
    params = {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}
    status, out = post(
        server, {"input_ids": ids, "sampling_params": params, "return_logprob": True, "logprob_start_len": 2}
    )
    assert status == 200, out
    lps = [t[0] for t in out["meta_info"]["input_token_logprobs"][1:]]
    assert torch.allclose(torch.tensor(lps), torch.tensor(direct(model_dir, ids, 2, 0.0)), atol=1e-5)
    assert len(out["output_ids"]) == 3 and len(out["meta_info"]["output_token_logprobs"]) == 3
    # SGLang's default start (-1): only the last input token, without a log-prob
    status, out = post(server, {"input_ids": ids, "sampling_params": params, "return_logprob": True})
    assert status == 200 and out["meta_info"]["input_token_logprobs"] == [[None, ids[-1], None]]
    status, out = post(server, {"input_ids": ids, "sampling_params": params, "logprob_start_len": 0})
    assert status == 200 and "input_token_logprobs" not in out["meta_info"]  # no return_logprob: ignored


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"logprob_start_len": 3}, "logprob_start_len (3) is not below the number of input tokens (3)"),
        ({"logprob_start_len": -2}, "logprob_start_len must be an integer >= -1"),
        ({"logprob_start_len": "0"}, "logprob_start_len must be an integer"),
        ({"input_ids": [[1, 2], [3, 4]], "logprob_start_len": [0]}, "logprob_start_len has 1 entries"),
    ],
)
def test_bad_starts_get_400(server, extra, fragment):
    payload = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0}, "return_logprob": True, **extra}
    status, out = post(server, payload)
    assert status == 400 and fragment in out["error"]["message"], out
