"""One gloo rank of the smoke's engine check: the Megatron backend on CPU, as a training job runs it.

``python -m slime.backends.megatron.smoke_rank REQUEST.json RANK PORT`` (started by
:mod:`slime.backends.smoke_check`): HF -> Megatron conversion (log-probs against the engine's), one
optimizer step on the synthetic advantages (an SFT job's: its SFT loss; parameters must change), the HF
weight export.
It records the stage it is in and what it measured in ``rank<R>.json`` as it goes, so a crash is
charged to the right stage. CPU only (:mod:`slime.backends.megatron.cpu`).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


class _Record:
    """``rank<R>.json``: the current stage and every measured value, rewritten at each step."""

    def __init__(self, path: Path) -> None:
        self.path, self.data = path, {"stage": None}

    def at(self, stage: str, **values: Any) -> None:
        self.data.update(values, stage=stage)
        self.path.write_text(json.dumps(self.data))


def _batch(out: Path, rows: slice, kind: str):
    """This rank's rows; an SFT job's batch is ``kind="sft"`` (its masked NLL, no advantages), as it trains."""
    import torch

    from slime.backends.base import TrainBatch

    b = torch.load(out / "batch.pt")
    batch = TrainBatch(
        tokens=b["tokens"][rows],
        attention_mask=b["attention_mask"][rows],
        response_mask=b["response_mask"][rows],
        advantages=None if kind == "sft" else b["advantages"][rows],
        kind=kind,
    )
    return batch, b["engine_logp"][rows], list(range(b["tokens"].shape[0]))[rows]


def _train(backend: Any, batch: Any, record: _Record) -> Any:
    """One optimizer step; parameters must change and the loss be finite. Returns the log-probs after it."""
    import torch

    before = {n: p.detach().clone() for n, p in backend.gpt.named_parameters()}
    metrics = backend.train_step(batch, step=0)
    changed = sum(not torch.equal(before[n], p.detach()) for n, p in backend.gpt.named_parameters())
    after = backend.log_probs(batch, temperature=1.0)
    moved = float(((after - batch.old_log_probs).abs() * batch.response_mask).max())
    loss = metrics["sft_loss" if batch.kind == "sft" else "loss"]
    record.at(
        record.data["stage"],
        loss=loss,
        grad_norm=metrics["grad_norm"],
        params_changed=changed,
        params_total=len(before),
        logp_moved=moved,
        loss_finite=math.isfinite(loss),
    )
    return after


def main(argv: list[str]) -> None:
    req, rank, port = json.loads(Path(argv[0]).read_text()), int(argv[1]), int(argv[2])
    out = Path(req["out"])
    record = _Record(out / f"rank{rank}.json")
    record.at(req["stages"]["convert"])
    from slime.backends.megatron.cpu import cpu_shim

    cpu_shim()
    import msgspec
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend
    from slime.spec.types import Spec

    spec = msgspec.convert(req["spec"], Spec)
    backend = MegatronTrainBackend()
    info = RankInfo(rank=rank, world_size=req["world"], master_addr="127.0.0.1", master_port=port, device="cpu")
    backend.init(spec, info, out / "model", role="actor")
    dp, dp_size = backend.data_parallel_coords()
    rows = slice(dp, None, dp_size)
    batch, engine_logp, row_ids = _batch(out, rows, "sft" if spec.kind == "SFTJob" else "rl")
    logp = backend.log_probs(batch, temperature=1.0)
    diff = float(((logp - engine_logp).abs() * batch.response_mask).max())
    record.at(req["stages"]["train"], conversion_diff=diff, rows=row_ids)
    batch.old_log_probs = logp
    after = _train(backend, batch, record)
    torch.save(after, out / f"rank{rank}-logp.pt")
    record.at(req["stages"]["export"])
    backend.export_weights(out / "export")
    record.at("done")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
