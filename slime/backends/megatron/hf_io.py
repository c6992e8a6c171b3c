"""Read and write HF safetensors checkpoints tensor by tensor.

A trainer rank reads only the tensors of its own pipeline stage (every rank of a
node holding the whole file would multiply host memory by the ranks). Export writes size-capped shards plus the standard
``model.safetensors.index.json``, so ``from_pretrained``, SGLang and the built-in
engine load the result. Only safetensors are read: torch pickles can run code.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from slime.diagnosis.beats import beat

__all__ = ["HF_SIDE_FILES", "copy_side_files", "read_tensors", "weight_map", "write_index", "write_shards"]

# Files next to the weights that an engine needs to serve the checkpoint.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
INDEX = "model.safetensors.index.json"


def weight_map(model_dir: str | Path) -> dict[str, Path]:
    """Tensor name → the safetensors file holding it."""
    d = Path(model_dir)
    index = d / INDEX
    if index.is_file():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{index}: not a valid safetensors index ({exc})") from None
        return {name: d / f for name, f in mapping.items()}
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors weights in {d} (torch .bin checkpoints are not read; "
            f"convert them with save_pretrained(safe_serialization=True))"
        )
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            out.update(dict.fromkeys(handle.keys(), f))
    return out


def read_tensors(model_dir: str | Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """The named tensors (all when ``names`` is None) from an HF checkpoint dir, on CPU."""
    from safetensors import safe_open

    where = weight_map(model_dir)
    wanted = list(where) if names is None else list(names)
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        if name in where:
            by_file.setdefault(where[name], []).append(name)
    out: dict[str, torch.Tensor] = {}
    for f, file_names in by_file.items():
        with safe_open(str(f), framework="pt", device="cpu") as handle:
            for name in file_names:
                out[name] = handle.get_tensor(name)
    return out


def write_shards(
    out_dir: str | Path,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    prefix: str = "model",
    max_shard_bytes: int = 4 << 30,
) -> dict[str, str]:
    """Write ``(name, tensor)`` pairs into ``{prefix}-NNNNN.safetensors`` files; return name → file name."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mapping: dict[str, str] = {}
    pending: dict[str, torch.Tensor] = {}
    size = 0
    count = 0

    def flush() -> None:
        nonlocal pending, size, count
        if pending:
            fname = f"{prefix}-{count:05d}.safetensors"
            save_file(pending, str(out / fname), metadata={"format": "pt"})
            beat("weight sync")  # a sync's export, shard by shard (outside a sync no phase takes it)
            mapping.update(dict.fromkeys(pending, fname))
            count += 1
            pending, size = {}, 0

    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if pending and size + nbytes > max_shard_bytes:
            flush()
        pending[name] = tensor.detach().to("cpu").contiguous()
        size += nbytes
    flush()
    return mapping


def write_index(out_dir: str | Path, mapping: Mapping[str, str]) -> Path:
    """Write ``model.safetensors.index.json`` for ``mapping`` (total size read from the files)."""
    out = Path(out_dir)
    total = sum((out / f).stat().st_size for f in set(mapping.values()))
    path = out / INDEX
    path.write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(mapping.items()))}, indent=1) + "\n"
    )
    return path


def copy_side_files(src_dir: str | Path, out_dir: str | Path) -> list[str]:
    """Copy config/tokenizer files an engine needs from ``src_dir``; return their names."""
    copied = []
    for name in HF_SIDE_FILES:
        src = Path(src_dir) / name
        if src.is_file():
            shutil.copyfile(src, Path(out_dir) / name)
            copied.append(name)
    return copied
