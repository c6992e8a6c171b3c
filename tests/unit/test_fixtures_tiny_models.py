"""The session's tiny-model factory (tests/fixtures/tiny_models.py): one directory per distinct shape,
defaults bound first, and what it returns is what build_tiny_model writes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from tests.fixtures.tiny_models import SMALL, TinyModels


def test_one_build_per_shape_with_defaults_bound(tmp_path):
    models = TinyModels(tmp_path)
    default = models()
    assert models(seed=0) == default and models(seed=0, hidden=128) == default
    assert models(seed=1) != default
    small = models(**SMALL)
    assert small not in (default, models(seed=1))
    assert len(list(tmp_path.iterdir())) == 3  # default, seed 1, SMALL: nothing built twice
    config = json.loads((small / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (32, 2, 1)


def test_the_shared_fixture_is_the_same_directory_every_time(tiny_model):
    assert tiny_model(seed=3, **SMALL) == tiny_model(**SMALL, seed=3)
    assert (tiny_model() / "model.safetensors").is_file()
