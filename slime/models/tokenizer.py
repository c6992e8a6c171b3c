"""``load_tokenizer(path)``: the one way the runtime loads a tokenizer (rollout manager, engine, agent adapter).

A built-in tiny model's tokenizer loads with ``PreTrainedTokenizerFast`` from its
``tokenizer.json``, which, unlike ``AutoTokenizer``, does not import torch (the rollout manager
needs none); :func:`load_engine_tokenizer` gives the built-in engine the bare ``tokenizers``
pipeline, without transformers. Guaranteed: both readings give the same ids, text, special tokens
and chat template (``tests/unit/test_tokenizer_load.py``). Every other directory goes through
``AutoTokenizer`` unchanged: which class transformers picks for a real model is its business.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TINY_MARKER", "EngineTokenizer", "load_engine_tokenizer", "load_tokenizer"]

#: the file ``slime.models.tiny`` writes into every built-in model directory
TINY_MARKER = "slime_tiny.json"


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer in ``path`` (a Hugging Face model or tokenizer directory)."""
    d = Path(path)
    if (d / TINY_MARKER).is_file() and (d / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(d))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


class EngineTokenizer:
    """A built-in model's tokenizer as the engine uses it: ``encode``, ``decode``, ``bos_token_id``,
    ``eos_token_id`` and ``backend_tokenizer`` with ``PreTrainedTokenizerFast``'s meaning (the same Rust
    pipeline underneath; ``tests/unit/test_tokenizer_load.py`` compares them on every shipped string)."""

    clean_up_tokenization_spaces = False

    def __init__(self, d: Path) -> None:
        from tokenizers import Tokenizer

        self.backend_tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        config = json.loads((d / "tokenizer_config.json").read_text())
        self.bos_token_id, self.eos_token_id = (self._id(config.get(k)) for k in ("bos_token", "eos_token"))

    def _id(self, token: str | dict | None) -> int | None:
        if isinstance(token, dict):  # an AddedToken written out
            token = token.get("content")
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_engine_tokenizer(path: str | Path) -> Any:
    """The built-in engine's tokenizer: :class:`EngineTokenizer` for a built-in model whose tokenizer cleans up
    no spaces, else :func:`load_tokenizer`'s."""
    d = Path(path)
    config = d / "tokenizer_config.json"
    if (d / TINY_MARKER).is_file() and (d / "tokenizer.json").is_file() and config.is_file():
        if not json.loads(config.read_text()).get("clean_up_tokenization_spaces", False):
            return EngineTokenizer(d)
    return load_tokenizer(d)
