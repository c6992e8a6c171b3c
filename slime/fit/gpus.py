"""Memory of common GPUs by name (vendor's nominal size, read as GiB), so ``cluster.gpu.name`` alone suffices."""

from __future__ import annotations

__all__ = ["GPU_MEMORY_GIB", "gpu_memory_gib", "normalize_gpu_name"]

# The vendor's nominal memory (H100 SXM "80GB" reports ~79.2 GiB to CUDA; the CUDA-context reserve
# of slime.fit.trainer covers the difference).
GPU_MEMORY_GIB: dict[str, float] = {
    "A100-40GB": 40,
    "A100-80GB": 80,
    "A800-80GB": 80,
    "H100-80GB": 80,
    "H100-94GB": 94,  # H100 NVL
    "H800-80GB": 80,
    "H20-96GB": 96,
    "H200-141GB": 141,
    "B200-180GB": 180,
    "GB200-186GB": 186,
    "L40S": 48,
    "L40": 48,
    "L4": 24,
    "A40": 48,
    "A10G": 24,
    "A10": 24,
    "RTX-A6000": 48,
    "RTX-4090": 24,
    "V100-16GB": 16,
    "V100-32GB": 32,
    "MI300X": 192,
    "MI325X": 256,
}
# Names with one size only, accepted without it.
_ALIASES = {"H100": "H100-80GB", "H800": "H800-80GB", "H200": "H200-141GB", "H20": "H20-96GB", "B200": "B200-180GB"}


def normalize_gpu_name(name: str) -> str:
    return "".join(ch for ch in name.upper() if ch.isalnum())


_BY_KEY = {normalize_gpu_name(k): k for k in GPU_MEMORY_GIB} | {normalize_gpu_name(k): v for k, v in _ALIASES.items()}


def gpu_memory_gib(name: str | None) -> float | None:
    """The memory of the GPU called ``name`` (case, dashes and spaces ignored), or None if not known."""
    if not name:
        return None
    key = _BY_KEY.get(normalize_gpu_name(name))
    return None if key is None else float(GPU_MEMORY_GIB[key])
