"""Writes train.jsonl and heldout.jsonl of specs/agent-code.yaml (seeded: the same files every time).

Two kinds of task, each a short program for the ``python`` tool: a product ``37*48=`` (program
``print(37*48)``) and a range sum ``sum(1..48)=`` (program ``print(sum(range(1, 48 + 1)))``). The
tiny model cannot multiply or sum in its head (results up to 6 digits), so the tool is needed.
Each row: ``prompt``, ``label`` (what the program prints) and ``program`` (the reference program,
kept as row metadata: the SFT warm-up's demonstration runs it through the tool).

    python specs/data/code/make_data.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def task(kind: str, a: int, b: int = 0) -> dict:
    """One row; its label is what its program prints (tests/e2e/test_agent_code.py runs some to check)."""
    if kind == "product":
        prompt, program, value = f"{a}*{b}=", f"print({a}*{b})", a * b
    else:
        prompt, program, value = f"sum(1..{a})=", f"print(sum(range(1, {a} + 1)))", a * (a + 1) // 2
    return {"prompt": prompt, "label": str(value), "program": program}


def main() -> None:
    here, rng = Path(__file__).resolve().parent, random.Random(0)
    products = rng.sample([task("product", a, b) for a in range(2, 100) for b in range(2, 100)], 1100)
    sums = rng.sample([task("sum", k) for k in range(2, 1201)], 1100)
    # Held-out prompts never occur in training: 100 of each kind.
    train, heldout = products[:1000] + sums[:1000], products[1000:] + sums[1000:]
    rng.shuffle(train)
    rng.shuffle(heldout)
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (here / name).write_text("".join(json.dumps(r) + "\n" for r in part))


if __name__ == "__main__":
    main()
