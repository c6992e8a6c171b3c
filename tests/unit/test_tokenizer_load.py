"""``slime.models.tokenizer.load_tokenizer``: the built-in tiny tokenizer read without ``AutoTokenizer`` (no torch)
is the same tokenizer ``AutoTokenizer`` gives; every other directory still goes through ``AutoTokenizer``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model()


def test_the_tiny_tokenizer_reads_the_same_both_ways(tiny):
    from transformers import AutoTokenizer

    from slime.agent.tools import get_tools
    from slime.models.tokenizer import load_tokenizer

    fast, auto = load_tokenizer(tiny), AutoTokenizer.from_pretrained(tiny)
    assert type(fast).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert type(auto) is not type(fast)  # transformers 5 picks Qwen2Tokenizer by model_type: a real second reading
    for attr in ("eos_token_id", "pad_token_id", "bos_token_id", "all_special_tokens", "chat_template"):
        assert getattr(fast, attr) == getattr(auto, attr), attr
    assert fast.get_vocab() == auto.get_vocab()
    texts = []
    for f in sorted((REPO / "specs" / "data").rglob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            texts += [str(row.get("prompt", "")), str(row.get("label", ""))]
    texts += ["héllo → 世界\n\ttab", "<|im_start|>user\n1+2<|im_end|>\n<eos>", '<tool_call>{"a": 1}</tool_call>']
    assert len(texts) > 100
    for t in texts:
        ids = fast.encode(t, add_special_tokens=False)
        assert ids == auto.encode(t, add_special_tokens=False), t
        assert fast.encode(t) == auto.encode(t), t
        assert fast.decode(ids) == auto.decode(ids) == t
    tools = [t.openai_schema() for t in get_tools(["calculator"])]
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "07+12="},
        {"role": "assistant", "content": "19"},
    ]
    for kw in ({}, {"tools": tools}):
        for gen in (False, True):
            want = auto.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
            assert fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw) == want


def test_the_tiny_tokenizer_loads_without_torch_and_others_through_auto_tokenizer(tiny, tmp_path):
    code = (
        "import sys; from slime.models.tokenizer import load_tokenizer; "
        f"t = load_tokenizer({str(tiny)!r}); print(type(t).__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split()[-1] == "False", out.stdout + out.stderr
    # without the built-in marker (a checkpoint's final_model/, a user's model): AutoTokenizer decides
    from transformers import AutoTokenizer

    from slime.models.tokenizer import TINY_MARKER, load_tokenizer

    plain = tmp_path / "plain"
    shutil.copytree(tiny, plain)
    (plain / TINY_MARKER).unlink()
    assert type(load_tokenizer(plain)) is type(AutoTokenizer.from_pretrained(plain))


def test_the_engines_tokenizer_reads_like_the_fast_tokenizer_without_transformers(tiny, tmp_path):
    from slime.models.tokenizer import TINY_MARKER, EngineTokenizer, load_engine_tokenizer, load_tokenizer

    eng, fast = load_engine_tokenizer(tiny), load_tokenizer(tiny)
    assert isinstance(eng, EngineTokenizer)
    assert (eng.bos_token_id, eng.eos_token_id) == (fast.bos_token_id, fast.eos_token_id)
    assert eng.eos_token_id is not None and eng.bos_token_id is not None
    texts = [json.loads(x).get("prompt", "") for x in (REPO / "specs/data/arith/train.jsonl").read_text().splitlines()]
    texts += ["héllo → 世界\n\ttab", "<|im_start|>user\n1+2<|im_end|>\n<eos>", " lead and trail "]
    for t in texts:
        for special in (False, True):
            ids = fast.encode(t, add_special_tokens=special)
            assert eng.encode(t, add_special_tokens=special) == ids, t
            for skip in (False, True):
                assert eng.decode(ids, skip_special_tokens=skip) == fast.decode(ids, skip_special_tokens=skip), t
    code = (
        "import sys; from slime.models.tokenizer import load_engine_tokenizer; "
        f"t = load_engine_tokenizer({str(tiny)!r}); "
        "print(type(t).__name__, any(k.startswith('transformers') for k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["EngineTokenizer", "False"], out.stdout + out.stderr
    # a tokenizer that cleans up spaces, or a directory that is not a built-in model: load_tokenizer's reading
    for name, edit in (("cleanup", "config"), ("plain", "marker")):
        d = tmp_path / name
        shutil.copytree(tiny, d)
        if edit == "marker":
            (d / TINY_MARKER).unlink()
        else:
            cfg = json.loads((d / "tokenizer_config.json").read_text())
            (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "clean_up_tokenization_spaces": True}))
        assert not isinstance(load_engine_tokenizer(d), EngineTokenizer), name
