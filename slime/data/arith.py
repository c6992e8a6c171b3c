"""The quickstart task: two-operand addition, ``"07+12="`` -> ``"19"``.

Operands run over 0..49; a fixed, seeded split holds out 500 of the 2,500 ordered pairs for
evaluation. Split and row order depend only on ``seed``, so the shipped files
(``specs/data/arith/{train,heldout}.jsonl``) are reproducible with
``python -m slime.data.arith specs/data/arith``. Rows are ``{"prompt": "07+12=", "label": "19"}``,
operands zero-padded so every prompt has the same length.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

__all__ = ["main", "make_row", "split_pairs", "write_dataset"]

MAX_OPERAND = 49
HELDOUT = 500


def make_row(a: int, b: int) -> dict:
    return {"prompt": f"{a:02d}+{b:02d}=", "label": str(a + b)}


def split_pairs(seed: int = 0, heldout: int = HELDOUT, max_operand: int = MAX_OPERAND):
    """Return (train_rows, heldout_rows): disjoint, covering every pair, order fixed by ``seed``."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < heldout < len(pairs):
        raise ValueError(f"heldout must be between 1 and {len(pairs) - 1}, got {heldout}")
    random.Random(seed).shuffle(pairs)
    return [make_row(a, b) for a, b in pairs[heldout:]], [make_row(a, b) for a, b in pairs[:heldout]]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def write_dataset(out_dir: str | os.PathLike, *, seed: int = 0, heldout: int = HELDOUT) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``heldout.jsonl`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, held = split_pairs(seed, heldout)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "heldout.jsonl", held)
    return out / "train.jsonl", out / "heldout.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slime.data.arith", description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heldout", type=int, default=HELDOUT)
    args = ap.parse_args(argv)
    try:
        train, held = write_dataset(args.out_dir, seed=args.seed, heldout=args.heldout)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {train} and {held}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
