"""Saved rollouts: every trained sample of a rollout in one Parquet file, and reading them back.

``debug.save_rollouts`` writes ``tasks/<i>/rollouts/rollout_<id:06d>.parquet`` after each rollout;
``debug.mode: train_only`` reads them back (never the sidecars) and trains on those samples, in order.
Sidecar ``trainer_<id:06d>.r<dp>.parquet``: data-parallel rank ``dp``'s samples (``row`` in the
file, ``group_index``, ``index``) with ``trainer_log_probs``, the trainer's per response token before it
updates on them; :func:`trainer_log_probs` joins by that identity (no match: engine-only). Parquet: pandas
and friends read it; float64 round-trips log-probs and rewards exactly. Guaranteed: each file is complete
or absent; samples read equal those written. Not kept: scores/advantages, dropped groups (docs/design-notes.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from slime.rl.sample import Sample, SampleStatus

__all__ = [
    "TrainerRow",
    "read_rollout",
    "read_trainer",
    "rollout_path",
    "saved_ids",
    "trainer_log_probs",
    "trainer_path",
    "write_rollout",
    "write_trainer",
]


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
            ("teacher_log_probs", floats),
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
        "teacher_log_probs": [float(x) for x in s.teacher_log_probs],
        "weight_version": s.weight_version,
        "token_versions": list(s.token_versions),
        "label_json": json.dumps(s.label),
        "metadata_json": json.dumps(s.metadata),
        "extra_json": json.dumps(s.extra),
    }


def write_rollout(directory: Path | str, rollout_id: int, samples: Sequence[Sample]) -> Path:
    """Write ``samples`` as rollout ``rollout_id`` (atomically; its old sidecars go); returns the file."""
    import pyarrow as pa

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rows = [_row(rollout_id, s) for s in samples]
    table = pa.Table.from_pylist(rows, schema=_schema())
    for stale in _trainer_files(directory, rollout_id):  # an earlier attempt's: not of these samples
        stale.unlink(missing_ok=True)
    return _write(table, rollout_path(directory, rollout_id))


def _write(table: Any, dest: Path) -> Path:
    """``table`` to ``dest`` through a hidden temp file in the same directory (complete or absent)."""
    import pyarrow.parquet as pq

    tmp = dest.with_name(f".{dest.name}.tmp")
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
                teacher_log_probs=list(row.get("teacher_log_probs") or []),  # files from before OPD engines: none
                status=SampleStatus(status),
                metadata=json.loads(row["metadata_json"]),
                weight_version=row["weight_version"],
                token_versions=list(row["token_versions"]),
                extra=json.loads(row["extra_json"]),
            )
        )
    return out


# ----------------------------------------------------------------------------- the trainer's sidecars
class TrainerRow(NamedTuple):
    """One sample's entry in a sidecar: who it is, and the trainer's log-prob of each response token."""

    group_index: int | None
    index: int | None
    log_probs: list[float]

    def of(self, group_index: int | None, index: int | None, response_length: int) -> list[float] | None:
        """The log-probs when this entry is of that sample (same ids, one per response token), else None."""
        same = (self.group_index, self.index) == (group_index, index)
        return list(self.log_probs) if same and len(self.log_probs) == response_length else None


def trainer_path(directory: Path | str, rollout_id: int, dp_rank: int) -> Path:
    """Not ``rollout_*.parquet``: a glob of the rollouts (pandas, DuckDB) must not mix in the sidecars."""
    return Path(directory) / f"trainer_{rollout_id:06d}.r{dp_rank}.parquet"


def _trainer_files(directory: Path, rollout_id: int) -> list[Path]:
    """Rollout ``rollout_id``'s sidecars, by data-parallel rank."""
    found = []
    for p in Path(directory).glob(f"trainer_{rollout_id:06d}.r*.parquet"):
        rank = p.name.removesuffix(".parquet").rsplit(".r", 1)[-1]
        if rank.isdigit():
            found.append((int(rank), p))
    return [p for _, p in sorted(found)]


def write_trainer(directory: Path | str, rollout_id: int, dp_rank: int, rows: Sequence[dict[str, Any]]) -> Path:
    """Write data-parallel rank ``dp_rank``'s sidecar of rollout ``rollout_id`` (atomically). ``rows``: dicts
    with ``row``, ``group_index``, ``index`` and ``trainer_log_probs`` (one per response token)."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("rollout_id", pa.int64()),
            ("row", pa.int64()),
            ("group_index", pa.int64()),
            ("index", pa.int64()),
            ("trainer_log_probs", pa.list_(pa.float64())),
        ]
    )
    keys = ("row", "group_index", "index")
    doc = [
        {"rollout_id": rollout_id, **{k: r.get(k) for k in keys}, "trainer_log_probs": list(r["trainer_log_probs"])}
        for r in rows
    ]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return _write(pa.Table.from_pylist(doc, schema=schema), trainer_path(directory, rollout_id, dp_rank))


def read_trainer(directory: Path | str, rollout_id: int) -> dict[int, TrainerRow]:
    """Every sidecar entry of rollout ``rollout_id`` by its row in the rollout's file ({} without
    sidecars); a row in several sidecars keeps the lowest data-parallel rank's entry."""
    import pyarrow.parquet as pq

    out: dict[int, TrainerRow] = {}
    for path in _trainer_files(Path(directory), rollout_id):
        cols = ("row", "group_index", "index", "trainer_log_probs")
        for row, g, i, lps in zip(*(c.to_pylist() for c in pq.read_table(path, columns=list(cols)).columns)):
            if row is not None and lps is not None:
                out.setdefault(row, TrainerRow(g, i, lps))
    return out


def trainer_log_probs(directory: Path | str, rollout_id: int, samples: Sequence[Sample]) -> list[list[float] | None]:
    """The trainer's log-probs of each of ``samples`` (those :func:`read_rollout` gives, in their order):
    the sidecar entry of the same row whose ids and length match the sample, else None (engine-only)."""
    entries = read_trainer(directory, rollout_id)
    out: list[list[float] | None] = []
    for row, s in enumerate(samples):
        entry = entries.get(row)
        out.append(entry.of(s.group_index, s.index, s.response_length) if entry is not None else None)
    return out
