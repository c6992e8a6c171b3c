"""``python -m slime.train RUN_DIR [--task N] [--json]``: run one task's RL training.

Started by the bootstrap on node rank 0 with ``RAY_ADDRESS`` set (it then uses
the job's Ray cluster); without ``RAY_ADDRESS`` it starts a private local Ray
(single-node specs), which is handy for re-running a task by hand.
``--json`` prints ``{"run_dir": ..., "final_metrics": {...}}`` on stdout at the
end (the summary table then goes to stderr). Exit codes: see
``slime.runtime.driver`` (0 ok, 1 bug, 2 bad input, 3 infrastructure, 75
stopped after a checkpoint: requeue).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slime.train", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="run directory made by slime-submit")
    ap.add_argument("--task", type=int, default=0, help="task index (sweep point), default 0")
    ap.add_argument("--json", action="store_true", help="print the final metrics as JSON on stdout")
    args = ap.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"error: run dir {args.run_dir} does not exist", file=sys.stderr)
        return 2
    from slime.runtime.driver import run

    return run(args.run_dir, args.task, json_output=args.json)


if __name__ == "__main__":
    sys.exit(main())
