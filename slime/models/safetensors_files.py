"""``safetensors_files(path)``: the weight files of an HF checkpoint directory, in the order to read them.

One reading of a checkpoint's layout for every loader (the built-in engine's weight updates, the lean model):
``model.safetensors.index.json`` names the shards, else ``model.safetensors``, else every ``*.safetensors``.
Raises ``ValueError`` naming what is wrong; callers wrap it in their own error type.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["safetensors_files"]


def safetensors_files(path: Path) -> list[Path]:
    if not path.is_dir():
        raise ValueError(f"model_path {str(path)!r} is not a directory")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{index}: not a valid safetensors index ({exc})") from None
        files = sorted({path / f for f in weight_map.values()})
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(path)!r}")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"missing shard files: {', '.join(missing)}")
    return files
