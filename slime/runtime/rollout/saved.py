"""Saved rollouts: every trained sample of a rollout in one Parquet file, and reading them back.

``debug.save_rollouts`` writes ``tasks/<i>/rollouts/rollout_<id:06d>.parquet`` after each rollout;
``debug.mode: train_only`` reads them back and trains on exactly those samples, in order.
Why Parquet via pyarrow: users open it with pandas and friends without our code; typed list columns
hold tokens and masks; float64 round-trips log-probs and rewards exactly, as replay needs.
Guaranteed: a file is complete or absent; reading gives samples equal to those written. Not kept:
scores/advantages (recomputed), dropped groups. Columns: docs/design-notes.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slime.rl.sample import Sample, SampleStatus

__all__ = ["read_rollout", "rollout_path", "saved_ids", "write_rollout"]


def rollout_path(directory: Path | str, rollout_id: int) -> Path:
    return Path(directory) / f"rollout_{rollout_id:06d}.parquet"


def saved_ids(directory: Path | str) -> list[int]:
    """The rollout ids saved in ``directory``, ascending."""
    out = []
    for p in Path(directory).glob("rollout_*.parquet"):
        stem = p.stem.removeprefix("rollout_")
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


def _schema():
    import pyarrow as pa

    ints, floats = pa.list_(pa.int64()), pa.list_(pa.float64())
    return pa.schema(
        [
            ("rollout_id", pa.int64()),
            ("group_index", pa.int64()),
            ("index", pa.int64()),
            ("prompt", pa.string()),
            ("prompt_tokens", ints),
            ("response", pa.string()),
            ("response_tokens", ints),
            ("reward", pa.float64()),
            ("status", pa.string()),
            ("loss_mask", pa.list_(pa.int8())),
            ("rollout_log_probs", floats),
            ("weight_version", pa.int64()),
            ("token_versions", ints),
            ("label_json", pa.string()),
            ("metadata_json", pa.string()),
            ("extra_json", pa.string()),
        ]
    )


def _row(rollout_id: int, s: Sample) -> dict[str, Any]:
    cut = len(s.tokens) - s.response_length
    return {
        "rollout_id": rollout_id,
        "group_index": s.group_index,
        "index": s.index,
        "prompt": s.prompt if isinstance(s.prompt, str) else json.dumps(s.prompt),
        "prompt_tokens": list(s.tokens[:cut]),
        "response": s.response,
        "response_tokens": list(s.tokens[cut:]),
        "reward": s.reward,
        "status": SampleStatus(s.status).value,
        "loss_mask": list(s.loss_mask),
        "rollout_log_probs": [float(x) for x in s.rollout_log_probs],
        "weight_version": s.weight_version,
        "token_versions": list(s.token_versions),
        "label_json": json.dumps(s.label),
        "metadata_json": json.dumps(s.metadata),
        "extra_json": json.dumps(s.extra),
    }


def write_rollout(directory: Path | str, rollout_id: int, samples: Sequence[Sample]) -> Path:
    """Write ``samples`` as rollout ``rollout_id`` (atomically); returns the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rows = [_row(rollout_id, s) for s in samples]
    table = pa.Table.from_pylist(rows, schema=_schema())
    dest = rollout_path(directory, rollout_id)
    tmp = directory / f".{dest.name}.tmp"
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def read_rollout(directory: Path | str, rollout_id: int) -> list[Sample]:
    """The samples saved as rollout ``rollout_id`` in ``directory``, in their saved order.

    ``FileNotFoundError`` names the file and the rollouts that are there."""
    import pyarrow.parquet as pq

    path = rollout_path(directory, rollout_id)
    if not path.is_file():
        have = saved_ids(directory)
        span = f"rollouts {have[0]}..{have[-1]} ({len(have)} files)" if have else "no saved rollout"
        raise FileNotFoundError(
            f"{path} does not exist: debug.load_rollouts {directory} holds {span}; a train_only run reads "
            "rollout_<id>.parquet for each of its rollout.num_rollouts rollouts"
        )
    out = []
    for row in pq.read_table(path).to_pylist():
        status = row["status"]
        out.append(
            Sample(
                group_index=row["group_index"],
                index=row["index"],
                prompt=row["prompt"],
                tokens=list(row["prompt_tokens"]) + list(row["response_tokens"]),
                response=row["response"],
                response_length=len(row["response_tokens"]),
                label=json.loads(row["label_json"]),
                reward=row["reward"],
                loss_mask=[int(x) for x in row["loss_mask"]],
                rollout_log_probs=list(row["rollout_log_probs"]),
                status=SampleStatus(status),
                metadata=json.loads(row["metadata_json"]),
                weight_version=row["weight_version"],
                token_versions=list(row["token_versions"]),
                extra=json.loads(row["extra_json"]),
            )
        )
    return out
