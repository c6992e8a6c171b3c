"""``load_tokenizer(path)``: the one way the runtime loads a tokenizer (rollout manager, engine, agent adapter).

The built-in tiny models' tokenizer (``slime.models.tiny``: a ``tokenizers`` byte-level pipeline, no Python
tokenizer class of its own) loads with ``PreTrainedTokenizerFast`` straight from its ``tokenizer.json``.
That does not import torch; ``AutoTokenizer``'s module does (measured: 5.5 core-s for AutoTokenizer with
torch against 0.2 for ``tokenizers``, and ~2 s of a run's start-up, in a process that otherwise needs no
torch: the rollout manager, started with every run).

Guaranteed: for a built-in tiny model both readings give the same ids, text, special tokens and chat
template (``tests/unit/test_tokenizer_load.py`` checks every shipped prompt). Every other directory (a
user's model, a checkpoint's ``final_model/``) goes through ``AutoTokenizer`` exactly as before: which class
transformers picks for a real model (e.g. by ``model_type``) is its business, not guessed here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TINY_MARKER", "load_tokenizer"]

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
