"""The built-in engine's fast paths against their plain-torch definitions.

Covers what the engine's speed work added: oneDNN projections with pre-packed
weights (``linear.py``), the short-row softmax, the decoder's prefill that runs
the last layer's MLP on last tokens only, and seeded sampling from pre-drawn
per-request uniforms. Each is compared with the reference computation it
replaces (HF forward, ``torch.softmax``, sequential ``torch.Generator`` draws).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.backends.rollout.builtin.decoder import LeanDecoder, UnsupportedModel, _softmax_last  # noqa: E402
from slime.backends.rollout.builtin.linear import Linear, onednn_available  # noqa: E402
from slime.backends.rollout.builtin.sampling import BatchSampling, SamplingParams, sample_next  # noqa: E402
from tests.fixtures.decoder_parity import worst_logit_diff  # noqa: E402

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="oneDNN linear ops unavailable in this torch build")


# ------------------------------------------------------------------ Linear
@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [3, 40, 300])
def test_linear_paths_agree_with_matmul(bias, rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 160, generator=g)
    b = torch.randn(160, generator=g) if bias else None
    x = torch.randn(rows, 96, generator=g)
    res = torch.randn(rows, 160, generator=g)
    ref = x @ w + (0 if b is None else b)
    fast = Linear(w, b, packed=True, min_rows=1)
    plain = Linear(w, b, packed=False)
    assert fast.packed is not None and plain.packed is None
    with torch.inference_mode():
        for lin in (fast, plain):
            torch.testing.assert_close(lin(x), ref, atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(lin(x, residual=res), ref + res, atol=2e-5, rtol=1e-5)
        # below min_rows the packed Linear takes the MKL path: bitwise the plain result
        gated = Linear(w, b, packed=True, min_rows=rows + 1)
        assert torch.equal(gated(x), plain(x))


def test_linear_min_rows_follow_the_product_size():
    """oneDNN's fixed per-call cost only pays off on big enough products: the row threshold
    falls as the weight grows, down to one row for model-sized matrices."""
    small, wide, big = (Linear(torch.zeros(k, n)).min_rows for k, n in ((128, 128), (128, 768), (896, 1152)))
    assert small > wide > big == 1
    assert Linear(torch.zeros(128, 128), min_rows=0).min_rows == 1


def test_linear_without_onednn_for_other_dtypes():
    w = torch.randn(8, 4, dtype=torch.float64)
    lin = Linear(w, packed=True, min_rows=1)
    assert lin.packed is None  # only fp32 is packed
    x = torch.randn(5, 8, dtype=torch.float64)
    assert torch.equal(lin(x), x @ w)


# ------------------------------------------------------------------ softmax
@pytest.mark.parametrize("t", [1, 2, 7, 15, 16, 40])
def test_short_row_softmax_matches_torch(t):
    s = torch.randn(33, 4, t) * 5
    s[0, 0, 1:] = float("-inf")  # a masked row keeps its single key
    out = _softmax_last(s)
    torch.testing.assert_close(out, torch.softmax(s, dim=-1), atol=1e-6, rtol=1e-6)
    assert out[0, 0, 0].item() == 1.0


# ------------------------------------------------------------------ decoder
def _model(arch: str, **extra):
    kinds = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}
    cfg = kinds[arch](
        vocab_size=80,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        **extra,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("arch,extra", [("qwen2", {}), ("llama", {"attention_bias": True})])
@pytest.mark.parametrize("onednn", [False, True])
def test_decoder_matches_hf_with_and_without_onednn(arch, extra, onednn):
    """Ragged prompts (the prefill's last-token-only final layer must pick each row's own
    last token), then masked and unmasked decode steps, all against full HF forwards.
    Llama with ``attention_bias`` has an o_proj bias, which the decoder must apply."""
    if onednn and not onednn_available():
        pytest.skip("oneDNN linear ops unavailable")
    model = _model(arch, **extra)
    if extra.get("attention_bias"):
        with torch.no_grad():  # HF initialises biases to zero; make them matter
            for layer in model.model.layers:
                layer.self_attn.o_proj.bias.normal_(0, 0.5)
    dec = LeanDecoder(model, max_slots=8, max_len=64, onednn=onednn, onednn_min_rows=1)
    assert all((L.qkv.packed is not None) == onednn for L in dec.layers)
    for lengths, same in (((3, 9, 5, 1), False), ((6, 6, 6, 6), True)):
        prompts = [torch.randint(0, 80, (n,)) for n in lengths]
        slots = torch.tensor([5, 0, 2, 1])
        worst = worst_logit_diff(model, dec, prompts, slots, steps=5, same_position=same)
        assert worst < 1e-4, (lengths, worst)


def test_decoder_rejects_a_model_without_layers():
    model = _model("qwen2")
    model.config.num_hidden_layers = 0
    with pytest.raises(UnsupportedModel, match="no decoder layers"):
        LeanDecoder(model, max_slots=2, max_len=16)


# ------------------------------------------------------------------ sampling
def _sequential_draws(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.rand((1,), generator=g) for _ in range(n)])


def test_seeded_rows_use_their_own_sequential_stream():
    """Pre-drawn uniforms are exactly what one draw per step from the row's generator gives,
    so a seeded request samples the same tokens as before, whatever shares its batch."""
    vocab = 50
    bs = BatchSampling(6, vocab, torch.device("cpu"), seed=0, max_draws=8)
    seeded = SamplingParams(temperature=1.0, sampling_seed=1234)
    bs.set_rows([1, 4], [seeded, SamplingParams(temperature=0.0)], [5, 5])
    bs.set_row(3, SamplingParams(temperature=1.0))  # unseeded neighbour
    assert (bs.n_active, bs.n_seeded, bs.n_greedy) == (3, 1, 1)
    # Logits that make the sampled token a readable function of u: uniform probabilities,
    # so token = floor(u * vocab).
    logits = torch.zeros(6, vocab)
    want = _sequential_draws(1234, 5)
    for step in range(5):
        tokens, logp = sample_next(logits, bs)
        assert int(tokens[1]) == int(want[step] * vocab)
        assert logp[1].item() == pytest.approx(-torch.log(torch.tensor(float(vocab))).item(), abs=1e-6)
    # the same row admitted through the prefill path (rows given explicitly) starts over
    bs.clear_rows([1])
    assert bs.n_seeded == 0 and not bool(bs.seeded[1])
    bs.set_rows([2], [seeded], [3])
    tokens, _ = sample_next(logits[:1], bs, rows=torch.tensor([2]))
    assert int(tokens[0]) == int(want[0] * vocab)


def test_set_rows_grows_the_uniform_table_and_counts_balance():
    bs = BatchSampling(4, 10, torch.device("cpu"), seed=None, max_draws=2)
    params = [SamplingParams(temperature=0.5, top_p=0.9, sampling_seed=i) for i in range(4)]
    bs.set_rows([0, 1, 2, 3], params, [2, 9, 3, 1])
    assert bs.uniforms.shape[1] >= 9
    torch.testing.assert_close(bs.uniforms[1, :9], _sequential_draws(1, 9))
    assert (bs.n_active, bs.n_seeded, bs.n_filtered, bs.n_scaled) == (4, 4, 4, 4)
    bs.clear_rows([0, 1, 2, 3])
    assert (bs.n_active, bs.n_seeded, bs.n_filtered, bs.n_scaled, bs.n_greedy) == (0, 0, 0, 0, 0)
    assert not bs.seeded.any()
