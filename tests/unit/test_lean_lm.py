"""slime.models.lean_lm against transformers: the same logits, gradients and tensor names for every family it
covers (llama, mistral, qwen2, qwen3, tied and untied, with and without attention biases), HF's fallback for
what it does not cover, and no transformers modeling import when it loads a built-in model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.models.lean_lm import LeanCausalLM, lean_config, load_causal_lm, load_lean  # noqa: E402

COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)


def _configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "qwen2-tied": Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen2": Qwen2Config(**COMMON),
        "qwen3-bias": Qwen3Config(**COMMON, head_dim=16, attention_bias=True),
        "qwen3": Qwen3Config(**COMMON, head_dim=8),
        "llama-bias": LlamaConfig(**COMMON, attention_bias=True),
        "mistral": MistralConfig(**COMMON, sliding_window=None),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each family saved by transformers with every tensor re-drawn (norms and biases too)."""
    root = tmp_path_factory.mktemp("lean")
    out = {}
    for i, (name, cfg) in enumerate(_configs().items()):
        torch.manual_seed(i)
        m = transformers.AutoModelForCausalLM.from_config(cfg)
        with torch.no_grad():
            for p in m.parameters():
                p.normal_(0.0, 0.5)
        m.save_pretrained(root / name)
        out[name] = root / name
    return out


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 11), generator=g)  # token 0 is the padding row of the embedding
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    return ids, mask


@pytest.mark.parametrize("name", list(_configs()))
def test_logits_gradients_and_names_equal_transformers(checkpoints, name):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoints[name]), dtype=torch.float32)
    lean, why = load_lean(checkpoints[name])
    assert isinstance(lean, LeanCausalLM), why
    assert not lean.training  # as from_pretrained returns a model
    assert list(lean.state_dict()) == list(hf.state_dict())
    assert [n for n, _ in lean.named_parameters()] == [n for n, _ in hf.named_parameters()]
    ids, mask = _batch(lean.config.vocab_size)
    for am in (None, mask):
        a, b = hf(input_ids=ids, attention_mask=am).logits, lean(ids, am).logits
        valid = (torch.ones_like(ids) if am is None else am).bool()
        torch.testing.assert_close(b[valid], a[valid], rtol=1e-5, atol=1e-5)
        assert torch.isfinite(b).all()  # padding rows too: each query sees at least itself
    hf.train(), lean.train()
    for m in (hf, lean):
        logp = torch.log_softmax(m(input_ids=ids, attention_mask=mask).logits.float(), -1)
        (logp.gather(-1, ids[..., None])[..., 0] * mask).sum().backward()
    grads = dict(hf.named_parameters())
    for n, p in lean.named_parameters():
        torch.testing.assert_close(p.grad, grads[n].grad, rtol=1e-4, atol=1e-5, msg=n)
    if lean.config.tie_word_embeddings:  # the head's gradient reaches every row of the shared matrix
        assert lean.lm_head.weight is lean.model.embed_tokens.weight
        assert len(list(lean.parameters())) == len(list(hf.parameters()))
    else:  # the embedding's padding row gets no gradient, as in HF (token 0 is in the batch)
        assert (ids == 0).any() and float(lean.model.embed_tokens.weight.grad[0].abs().sum()) == 0.0


def test_backbone_is_the_critics_base_model(checkpoints):
    from slime.backends.train.critic import ValueModel

    critic = ValueModel.from_pretrained(checkpoints["qwen2-tied"])
    assert isinstance(critic.backbone, torch.nn.Module) and type(critic.backbone).__name__ == "Backbone"
    ids, mask = _batch(64)
    v = critic(ids, mask)
    assert v.shape == ids.shape and float(v.abs().max()) == 0.0  # the zero value head


def test_the_generation_config_and_rotary_buffer_come_along(tiny_model):
    d = tiny_model()
    lean, why = load_lean(d)
    assert lean is not None, why
    gen = json.loads((d / "generation_config.json").read_text())
    assert lean.generation_config.eos_token_id == gen["eos_token_id"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d))
    torch.testing.assert_close(lean.model.rotary_emb.inv_freq, hf.model.rotary_emb.inv_freq, rtol=0, atol=0)
    assert lean.model.rotary_emb.inv_freq.device.type == "cpu"  # not left on the meta device


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"model_type": "gemma"}, "model_type 'gemma'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "RoPE type 'llama3'"),
        ({"hidden_act": "gelu"}, "non-SiLU"),
        ({"mlp_bias": True}, "biased MLP"),
        ({"attention_dropout": 0.1}, "attention dropout"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding attention window"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding attention window"),
    ],
)
def test_what_it_does_not_cover_is_named(change, why):
    raw = {"model_type": "qwen2", **COMMON, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, **change}
    config, reason = lean_config(raw)
    assert config is None and why in reason


def test_uncovered_checkpoints_load_through_transformers(checkpoints, tmp_path):
    import shutil

    d = tmp_path / "renamed"
    shutil.copytree(checkpoints["qwen2"], d)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    tensors["model.extra.weight"] = torch.zeros(2)  # a tensor the lean module has no place for
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert load_lean(d)[0] is None and "unexpected ['model.extra.weight']" in load_lean(d)[1]
    model = load_causal_lm(d)
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_a_built_in_model_loads_without_transformers_modeling_code(tiny_model):
    code = (
        "import sys; from slime.models.lean_lm import load_causal_lm; "
        f"m = load_causal_lm({str(tiny_model())!r}); "
        "print(type(m).__name__, sorted(k for k in sys.modules if k.startswith(('transformers', 'torch._dynamo'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    # neither transformers (~5.5 core-s) nor torch._dynamo (~2.5 core-s, pulled in by building on the meta device)
    assert out[0] == "LeanCausalLM" and out[1].strip() == "[]", out
