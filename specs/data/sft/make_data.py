"""Writes train.jsonl, heldout.jsonl and heldout.parquet of specs/sft.yaml (seeded: the same files every time).

Each row is a two-turn chat in ``messages``: the user asks for a two-digit sum (``"07+12="``), the
assistant answers (``"19"``), the user says ``"reverse"`` and the assistant answers the digits of its
own answer reversed (``"91"``). The loss covers both assistant turns; a
held-out generation is scored on the last one (heldout_sum: the first turn alone, so the sum). Held-out
pairs never occur in training; heldout.parquet is heldout.jsonl's rows (kind SFTJob reads both formats).

    python specs/data/sft/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def chat(a: int, b: int) -> dict:
    answer = str(a + b)
    return {
        "messages": [
            {"role": "user", "content": f"{a:02d}+{b:02d}="},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "reverse"},
            {"role": "assistant", "content": answer[::-1]},
        ]
    }


def main() -> None:
    here, rng = Path(__file__).resolve().parent, random.Random(0)
    pairs = [(a, b) for a in range(50) for b in range(50)]
    rng.shuffle(pairs)
    train, heldout = [chat(*p) for p in pairs[:2300]], [chat(*p) for p in pairs[2300:]]
    # The first turn alone: its last reply is the sum (the skill the reversal turn does not show).
    sums = [{"messages": r["messages"][:2]} for r in heldout]
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout), ("heldout_sum.jsonl", sums)):
        (here / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(heldout), here / "heldout.parquet")


if __name__ == "__main__":
    main()
