"""``model.tokenizer`` reaches the engines, not only the rollout manager.

The rollout manager encodes prompts with ``model.tokenizer``; engines decode responses (the text the
reward reads). Both engines now use it when it is another directory than the model's: the built-in
engine loads it (``tokenizer_path``), SGLang gets ``--tokenizer-path``. The tokenizer used here differs
from the model's in one observable way: two vocabulary entries ('a' and 'b') are swapped.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from msgspec.structs import replace

from slime.backends.rollout.builtin.backend import engine_kwargs
from slime.backends.sglang.launch import LaunchError, engine_commands
from slime.spec import SpecError
from slime.spec.load import load_spec
from tests.fixtures.tiny_models import ONE_LAYER

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tiny_model):
    model = tiny_model(seed=0, **ONE_LAYER)
    tok = tmp_path_factory.mktemp("tok")
    for f in model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tok / f.name)
    data = json.loads((tok / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (tok / "tokenizer.json").write_text(json.dumps(data))
    return model, tok


def test_the_builtin_engine_decodes_with_model_tokenizer(dirs):
    from slime.backends.rollout.builtin.generator import Engine

    model, tok = dirs
    own = Engine(model, max_running_requests=2)
    other = Engine(model, tokenizer_path=tok, max_running_requests=2)
    ids = own.tokenizer.encode("ab", add_special_tokens=False)
    assert own.tokenizer.decode(ids) == "ab"
    assert other.tokenizer.decode(ids) == "ba"  # the same token ids read with the other tokenizer
    assert (own.tokenizer_path, other.tokenizer_path) == (str(model), str(tok))


def test_engine_kwargs_pass_model_tokenizer_only_when_it_is_another_dir(dirs, tmp_path):
    model, tok = dirs
    spec = load_spec(ROOT / "specs" / "quickstart.yaml").spec
    assert "tokenizer_path" not in engine_kwargs(spec)
    other = load_spec(ROOT / "specs" / "quickstart.yaml", overrides=[f"model.tokenizer={tok}"]).spec
    assert engine_kwargs(other)["tokenizer_path"] == str(tok)


def test_sglang_engines_get_tokenizer_path(tmp_path):
    spec_file = ROOT / "specs" / "grpo-multinode.yaml"
    plain = load_spec(spec_file).tasks[0].spec
    assert all("--tokenizer-path" not in c.argv for c in engine_commands(plain))  # derived: the model's own
    spec = load_spec(spec_file, overrides=[f"model.tokenizer={tmp_path}"]).tasks[0].spec
    for c in engine_commands(spec):
        i = c.argv.index("--tokenizer-path")
        assert c.argv[i + 1] == str(tmp_path)
    with pytest.raises(SpecError) as info:  # validate refuses a rollout.sglang.args tokenizer-path
        load_spec(spec_file, overrides=["rollout.sglang.args.tokenizer-path=/x"])
    assert "rollout.sglang.args.tokenizer-path: slime-submit sets --tokenizer-path itself" in str(info.value)
    sglang = replace(plain.rollout.sglang, args={"tokenizer-path": "/x"})
    bad = replace(plain, rollout=replace(plain.rollout, sglang=sglang))
    with pytest.raises(LaunchError) as exc:  # and so does the launch, for a spec that skipped validate
        engine_commands(bad)
    assert str(exc.value) == (
        "rollout.sglang.args.tokenizer-path: slime sets --tokenizer-path itself from the spec and layout; "
        "remove it (change model.tokenizer instead)"
    )
