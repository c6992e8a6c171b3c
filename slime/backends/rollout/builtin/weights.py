"""Load weights into an already built model, in place: from an HF safetensors checkpoint or from tensors.

Used by ``/update_weights_from_disk``: the trainer writes an HF checkpoint and the
engine copies its tensors into the live model. Everything is validated before
the first copy (names, shapes, completeness), so a bad checkpoint leaves the
running weights untouched and yields one message listing what is wrong.
Tied output embeddings (absent from the file) are accepted. Only safetensors
files are read (``model.safetensors`` or a ``model.safetensors.index.json``
shard set); torch pickles are refused because loading them can run code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from slime.models.safetensors_files import safetensors_files

__all__ = ["WeightLoadError", "load_hf_weights", "load_named_tensors"]

_SUPPORTED_FORMATS = (None, "auto", "safetensors")


class WeightLoadError(ValueError):
    """The checkpoint cannot be loaded into this model; the model was not modified."""


def _shard_files(path: Path) -> list[Path]:
    try:
        return safetensors_files(path)
    except ValueError as exc:
        raise WeightLoadError(str(exc)) from None


def _copy_checked(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str, *, require_all: bool, problems: list[str]
) -> int:
    """Validate every tensor against ``model`` first; copy only if nothing is wrong."""
    # remove_duplicate=False: a tied lm_head.weight is listed (and may be in the file).
    params = dict(model.named_parameters(remove_duplicate=False))
    required = set(params)
    params.update(dict(model.named_buffers(remove_duplicate=False)))
    for name, tensor in tensors.items():
        target = params.get(name)
        if target is None:
            problems.append(f"unexpected tensor {name!r}")
        elif tuple(target.shape) != tuple(tensor.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)} != model shape {tuple(target.shape)}")
    if require_all:
        if getattr(model.config, "tie_word_embeddings", False):
            required.discard("lm_head.weight")
        absent = sorted(required - tensors.keys())
        if absent:
            shown = ", ".join(absent[:5]) + (f" and {len(absent) - 5} more" if len(absent) > 5 else "")
            problems.append(f"{len(absent)} parameter(s) missing: {shown}")
    if problems:
        raise WeightLoadError(f"cannot load weights from {source}: " + "; ".join(problems[:10]))
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
    return len(tensors)


def load_named_tensors(model: torch.nn.Module, named, *, require_all: bool = False) -> int:
    """Copy ``(name, tensor)`` pairs (HF parameter names) into ``model``; a subset is allowed."""
    tensors = {}
    for item in named:
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor)
        ):
            raise WeightLoadError("named tensors must be (name, torch.Tensor) pairs")
        tensors[item[0]] = item[1]
    if not tensors:
        raise WeightLoadError("no tensors given")
    return _copy_checked(model, tensors, "the given tensors", require_all=require_all, problems=[])


def load_hf_weights(model: torch.nn.Module, path: str | Path, load_format: str | None = None) -> int:
    """Copy every tensor of the checkpoint at ``path`` into ``model``; return how many."""
    from safetensors import safe_open

    if load_format not in _SUPPORTED_FORMATS:
        raise WeightLoadError(f"load_format {load_format!r} is not supported; use 'auto' or 'safetensors'")
    files = _shard_files(Path(path))
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118
                    tensors[name] = handle.get_tensor(name)
        except (OSError, RuntimeError, ValueError) as exc:
            raise WeightLoadError(f"cannot read {f}: {exc}") from None
    return _copy_checked(model, tensors, repr(str(path)), require_all=True, problems=[])
