"""The built-in tiny model: offline loading, determinism, tokenizer round trips, chat template."""

from __future__ import annotations

import json
import os
import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from slime.models.tiny import SPECIAL_TOKENS, build_tiny_model, ensure_builtin_model  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def tok(tiny):
    return transformers.AutoTokenizer.from_pretrained(tiny)


def test_checkpoint_files_and_offline_load(tiny):
    names = set(os.listdir(tiny))
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    cfg = model.config
    assert (
        cfg.model_type,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.max_position_embeddings,
    ) == ("qwen2", 128, 4, 4, 2, 256)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.7e6 < n_params < 0.9e6
    out = model(torch.tensor([[5, 6, 7]])).logits
    assert out.shape == (1, 3, cfg.vocab_size) and torch.isfinite(out).all()


def test_same_seed_identical_tensors_other_seed_differs(tiny, tmp_path):
    again = load_file(build_tiny_model(tmp_path / "again", seed=0) / "model.safetensors")
    first = load_file(tiny / "model.safetensors")
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = load_file(build_tiny_model(tmp_path / "other", seed=1) / "model.safetensors")
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_build_leaves_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2, kv_heads=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    "text",
    [
        "07+12=19",
        '{"name": "search", "arguments": {"query": "a b", "k": [1, 2.5, null, true]}}',
        '<tool_call>\n{"name": "f"}\n</tool_call>\t~`!@#$%^&*()_-[]{}|\\;:\'<>,.?/',
        "  leading and trailing spaces  \n\n",
        "unicode: héllo ✓ 漢字",
    ],
)
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    if text.isascii():
        assert len(ids) == len(text)  # one token per ASCII character


def test_special_tokens(tok):
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    assert sorted(ids.values()) == list(range(len(SPECIAL_TOKENS)))
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    enc = tok.encode("<|im_start|>user\nhi<|im_end|><eos>", add_special_tokens=False)
    assert enc[0] == ids["<|im_start|>"] and enc[-2:] == [ids["<|im_end|>"], ids["<eos>"]]
    assert tok.decode(enc, skip_special_tokens=True) == "user\nhi"
    assert tok.encode("ab") == tok.encode("ab", add_special_tokens=False)  # no BOS added


def test_generation_config_stops_on_eos_and_im_end(tiny, tok):
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}


def test_chat_template(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "07+12="}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n07+12=<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert tok.decode(ids) == text


def test_chat_template_tools_round_trip(tok):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "user", "content": "add 1 and 2"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}],
        },
        {"role": "tool", "content": "3"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '"name": "add"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>' in text
    assert "<tool_response>\n3\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_llama_arch(tmp_path):
    path = build_tiny_model(tmp_path / "llama", arch="llama", hidden=64, layers=2)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "llama"
    tok = transformers.AutoTokenizer.from_pretrained(path)
    assert tok.decode(tok.encode("12+30=42", add_special_tokens=False)) == "12+30=42"


def test_bad_shapes_and_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="arch='gpt2'"):
        build_tiny_model(tmp_path / "x", arch="gpt2")
    with pytest.raises(ValueError, match="heads % kv_heads"):
        build_tiny_model(tmp_path / "y", heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="valid names: tiny, tiny-agent"):
        ensure_builtin_model("huge", tmp_path)
    with pytest.raises(ValueError, match="init_std must be > 0"):
        build_tiny_model(tmp_path / "z", init_std=0.0)


def test_tiny_agent_is_tiny_at_the_fan_in_init_scale(tmp_path, monkeypatch):
    """Same shape, tokenizer and template; the weight matrices' spread is 1/sqrt(hidden), not 0.02."""
    monkeypatch.setenv("SLIME_CACHE_DIR", str(tmp_path / "cache"))
    plain, agent = ensure_builtin_model("tiny", tmp_path), ensure_builtin_model("tiny-agent", tmp_path)
    marks = [json.loads((d / "slime_tiny.json").read_text()) for d in (plain, agent)]
    assert marks[0]["init_std"] == 0.02 and marks[1]["init_std"] == pytest.approx(128**-0.5)
    assert {k: v for k, v in marks[0].items() if k != "init_std"} == {
        k: v for k, v in marks[1].items() if k != "init_std"
    }
    assert (plain / "tokenizer.json").read_text() == (agent / "tokenizer.json").read_text()
    for d, std in ((plain, 0.02), (agent, 128**-0.5)):
        weights = load_file(str(d / "model.safetensors"))
        q = weights["model.layers.0.self_attn.q_proj.weight"]
        assert float(q.std()) == pytest.approx(std, rel=0.05)


def test_ensure_builtin_model_idempotent_and_concurrent(tmp_path):
    results, errors = [], []

    def build():
        try:
            results.append(ensure_builtin_model("tiny", tmp_path))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results[0] == results[1] == tmp_path / "tiny"
    stamp = (tmp_path / "tiny" / "model.safetensors").stat().st_mtime_ns
    assert ensure_builtin_model("tiny", tmp_path) == tmp_path / "tiny"
    assert (tmp_path / "tiny" / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no temp dirs left behind


def test_a_built_model_is_kept_across_runs_and_copied_not_rebuilt(tmp_path, monkeypatch):
    """The first run builds and keeps the build in the shared cache; the next run copies it (identical files,
    no build), and a cache of another torch version is not used."""
    import slime.models.tiny as tiny

    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path / "cache"))
    first = ensure_builtin_model("tiny", tmp_path / "run1")
    (kept,) = (tmp_path / "cache").iterdir()
    assert kept.name == tiny.build_key("tiny") and kept.name.startswith("tiny-")

    def no_build(*_a, **_k):
        raise AssertionError("rebuilt although the shared cache has it")

    monkeypatch.setattr(tiny, "build_tiny_model", no_build)
    second = ensure_builtin_model("tiny", tmp_path / "run2")
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir()) and "model.safetensors" in files
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)
    assert [p.name for p in (tmp_path / "run2").iterdir()] == ["tiny"]  # no temp dirs left behind

    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda pkg: "0.0-other" if pkg == "torch" else real(pkg))
    assert tiny.build_key("tiny") != kept.name  # another torch: another key, so the next run builds
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_builtin_model("tiny", tmp_path / "run3")


def test_a_shared_cache_that_cannot_be_written_only_costs_a_build(tmp_path, monkeypatch):
    import slime.models.tiny as tiny

    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path / "a-file" / "cache"))
    got = ensure_builtin_model("tiny", tmp_path / "run")
    assert (got / "model.safetensors").is_file() and [p.name for p in (tmp_path / "run").iterdir()] == ["tiny"]
