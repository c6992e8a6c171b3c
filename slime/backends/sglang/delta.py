"""Delta weight checkpoints: ship only the tensors that changed since the last sync, with checksums.

:func:`write_delta` writes one zstd payload per changed tensor (XOR with the old bytes by default,
mostly zeros after a small RL step; raw for new tensors) and an ``index.json`` with dtypes,
shapes, encodings and SHA-256s. :func:`apply_delta` checks every payload before decoding and every
rebuilt tensor after, and writes a complete HF directory (unchanged shards hard-linked) any engine
loads from disk. Any mismatch raises :class:`DeltaError` naming tensor and file and leaves no
output behind. zstandard (already a dependency) for speed at good ratios; SHA-256 (stdlib).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["FORMAT", "DeltaError", "DeltaStats", "apply_delta", "write_delta"]

FORMAT = "slime-delta/1"
INDEX = "index.json"
_ST_INDEX = "model.safetensors.index.json"
_SIDE_FILES = (
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


class DeltaError(ValueError):
    """A delta cannot be written or applied (corrupt payload, checksum mismatch, wrong base)."""


@dataclass(frozen=True, slots=True)
class DeltaStats:
    total: int
    changed: int
    raw_bytes: int  # bytes of the changed tensors
    payload_bytes: int  # compressed bytes written


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _to_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, dtype: str, shape: list[int]) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return flat.view(getattr(torch, dtype)).reshape(shape)


def _xor(a: bytes, b: bytes) -> bytes:
    import numpy as np

    return (np.frombuffer(a, dtype=np.uint8) ^ np.frombuffer(b, dtype=np.uint8)).tobytes()


def _weight_files(model_dir: Path) -> dict[str, str]:
    """Tensor name → shard file name of an HF safetensors checkpoint."""
    from safetensors import safe_open

    index = model_dir / _ST_INDEX
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    out: dict[str, str] = {}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise DeltaError(f"no *.safetensors weights in {model_dir}")
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            out.update(dict.fromkeys(h.keys(), f.name))
    return out


def _read_all(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for fname in sorted(set(_weight_files(model_dir).values())):
        out.update(load_file(str(model_dir / fname)))
    return out


def write_delta(
    base_dir: str | Path,
    new_dir: str | Path,
    delta_dir: str | Path,
    *,
    encoding: str = "xor",
    level: int = 3,
    version: str | None = None,
    base_version: str | None = None,
) -> DeltaStats:
    """Write the delta taking checkpoint ``base_dir`` to ``new_dir`` into ``delta_dir`` (created)."""
    import zstandard

    if encoding not in ("xor", "raw"):
        raise DeltaError(f"encoding must be 'xor' or 'raw', got {encoding!r}")
    base, new = _read_all(Path(base_dir)), _read_all(Path(new_dir))
    out = Path(delta_dir)
    (out / "tensors").mkdir(parents=True, exist_ok=False)
    compressor = zstandard.ZstdCompressor(level=level)
    entries: dict[str, dict] = {}
    raw_bytes = payload_bytes = 0
    for name in sorted(new):
        t = new[name]
        data = _to_bytes(t)
        old = base.get(name)
        if old is not None and old.dtype == t.dtype and old.shape == t.shape:
            old_data = _to_bytes(old)
            if old_data == data:
                continue
            enc, payload = encoding, (_xor(data, old_data) if encoding == "xor" else data)
        else:
            enc, payload = "raw", data
        blob = compressor.compress(payload)
        fname = f"tensors/{len(entries):06d}.zst"
        (out / fname).write_bytes(blob)
        entries[name] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "encoding": enc,
            "file": fname,
            "payload_sha256": _sha(blob),
            "sha256": _sha(data),
        }
        raw_bytes += len(data)
        payload_bytes += len(blob)
    index = {
        "format": FORMAT,
        "version": version,
        "base_version": base_version,
        "names": sorted(new),
        "tensors": entries,
    }
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return DeltaStats(total=len(new), changed=len(entries), raw_bytes=raw_bytes, payload_bytes=payload_bytes)


def _load_index(delta: Path) -> dict:
    try:
        index = json.loads((delta / INDEX).read_text())
    except (OSError, ValueError) as exc:
        raise DeltaError(f"{delta / INDEX}: cannot read the delta index ({exc})") from None
    if index.get("format") != FORMAT:
        raise DeltaError(f"{delta / INDEX}: format {index.get('format')!r} is not {FORMAT!r}")
    return index


def _rebuild_tensor(name: str, e: dict, delta: Path, base: Path, files: dict[str, str], decompressor):
    """One changed tensor from its payload (and, xor-encoded, the base tensor); every step is checked."""
    import zstandard
    from safetensors import safe_open

    blob = (delta / e["file"]).read_bytes()
    if _sha(blob) != e["payload_sha256"]:
        raise DeltaError(f"{name}: payload {delta / e['file']} fails its SHA-256 check (corrupt or truncated)")
    try:
        payload = decompressor.decompress(blob)
    except zstandard.ZstdError as exc:
        raise DeltaError(f"{name}: payload {delta / e['file']} does not decompress ({exc})") from None
    if e["encoding"] == "xor":
        if name not in files:
            raise DeltaError(f"{name}: xor-encoded but the base {base} has no such tensor")
        with safe_open(str(base / files[name]), framework="pt") as h:
            old = _to_bytes(h.get_tensor(name))
        if len(old) != len(payload):
            raise DeltaError(f"{name}: base tensor has {len(old)} bytes, delta expects {len(payload)}: wrong base")
        payload = _xor(payload, old)
    if _sha(payload) != e["sha256"]:
        raise DeltaError(f"{name}: rebuilt tensor fails its SHA-256 check (applied to the wrong base {base}?)")
    return _from_bytes(payload, e["dtype"], e["shape"])


def _write_checkpoint(tmp: Path, base: Path, files: dict[str, str], updated: dict, new_only: list[str]) -> None:
    """Fill ``tmp`` with the rebuilt checkpoint: unchanged shards are hard-linked (copied across filesystems)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    by_file: dict[str, list[str]] = {}
    for name, fname in files.items():
        by_file.setdefault(fname, []).append(name)
    for fname, file_names in sorted(by_file.items()):
        if any(n in updated for n in file_names):
            with safe_open(str(base / fname), framework="pt") as h:
                tensors = {n: updated[n] if n in updated else h.get_tensor(n) for n in file_names}
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        else:
            try:
                os.link(base / fname, tmp / fname)
            except OSError:
                shutil.copyfile(base / fname, tmp / fname)
    if new_only:
        save_file(
            {n: updated[n] for n in new_only}, str(tmp / "model-delta-new.safetensors"), metadata={"format": "pt"}
        )
    if (base / _ST_INDEX).is_file() or new_only:
        weight_map = {**files, **dict.fromkeys(new_only, "model-delta-new.safetensors")}
        (tmp / _ST_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1) + "\n")
    for side in _SIDE_FILES:
        if (base / side).is_file():
            shutil.copyfile(base / side, tmp / side)


def apply_delta(base_dir: str | Path, delta_dir: str | Path, out_dir: str | Path) -> DeltaStats:
    """Rebuild the full checkpoint from ``base_dir`` + ``delta_dir`` into ``out_dir`` (must not exist)."""
    import zstandard

    base, delta, out = Path(base_dir), Path(delta_dir), Path(out_dir)
    index = _load_index(delta)
    entries: dict[str, dict] = index["tensors"]
    files = _weight_files(base)
    names = set(index["names"])
    if names - set(files) - set(entries) or set(files) - names:
        raise DeltaError(
            f"{delta}: the delta's tensor names do not match base {base} "
            f"(missing from both: {sorted(names - set(files) - set(entries))[:5]}, "
            f"dropped: {sorted(set(files) - names)[:5]})"
        )
    decompressor = zstandard.ZstdDecompressor()
    updated: dict[str, torch.Tensor] = {
        name: _rebuild_tensor(name, e, delta, base, files, decompressor) for name, e in entries.items()
    }
    new_only = sorted(n for n in updated if n not in files)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_checkpoint(tmp, base, files, updated, new_only)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    raw = sum(len(_to_bytes(t)) for t in updated.values())
    return DeltaStats(
        total=len(names),
        changed=len(entries),
        raw_bytes=raw,
        payload_bytes=sum((delta / e["file"]).stat().st_size for e in entries.values()),
    )
