"""Sweep tasks → SLURM job arrays, split where the cluster's MaxArraySize demands it.

``MaxArraySize`` caps the array *index*, so N tasks become ``ceil(N / MaxArraySize)`` arrays, each
indexed from 0 with its first task number as ``SLIME_TASK_OFFSET`` (the script computes
``TASK = SLIME_TASK_OFFSET + SLURM_ARRAY_TASK_ID``). With ``sweep.max_parallel``, ``%max_parallel``
caps each array and each sub-array waits for the previous one (``--dependency=afterany:<id>``), so
the cap holds across the split.
Guaranteed: pure; every task index 0..N-1 is covered exactly once, in order.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ArrayChunk", "array_spec", "plan_arrays"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ArrayChunk:
    """One sbatch submission: tasks ``offset .. offset + count - 1`` as array indices 0..count-1."""

    offset: int
    count: int
    max_parallel: int | None
    after_previous: bool  # wait for the previous chunk (keeps max_parallel across chunks)

    @property
    def spec(self) -> str:
        """The ``--array`` value, e.g. ``0-999%4``."""
        return array_spec(self.count, self.max_parallel)

    @property
    def last(self) -> int:
        return self.offset + self.count - 1


def array_spec(count: int, max_parallel: int | None) -> str:
    rng = "0" if count == 1 else f"0-{count - 1}"
    return f"{rng}%{max_parallel}" if max_parallel else rng


def plan_arrays(n_tasks: int, max_array_size: int, max_parallel: int | None = None) -> list[ArrayChunk]:
    """Split ``n_tasks`` into arrays whose indices stay below ``max_array_size``."""
    if n_tasks < 1:
        raise ValueError(f"a sweep needs at least one task, got {n_tasks}")
    if max_array_size < 1:
        raise ValueError(f"MaxArraySize must be >= 1, got {max_array_size}")
    chunks: list[ArrayChunk] = []
    for offset in range(0, n_tasks, max_array_size):
        count = min(max_array_size, n_tasks - offset)
        chunks.append(
            ArrayChunk(
                offset=offset,
                count=count,
                max_parallel=max_parallel,
                after_previous=bool(chunks) and max_parallel is not None,
            )
        )
    return chunks
