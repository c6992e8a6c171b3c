"""Simulation: the bootstrap's rendezvous and port-block choice at 100-1,000 nodes, threads as nodes.

    python tests/bench/rendezvous_scale.py [--nodes 100 250 500 1000] [--other-jobs 4] [--head-delay 2]

Each node is a thread running the real code of ``slime.core.rendezvous`` (files in a temp dir
standing in for the shared run dir) and ``slime.core.ports.claim_block`` (claim files per host):
node 0 claims its block, takes ``--head-delay`` s (its ``ray start``) and publishes the head record;
every other node starts within ``--launch-skew`` s (srun does not start them at once), waits for
the head record with ``Rendezvous.wait_head`` at the poll interval the bootstrap uses for that many
nodes (``head_poll_s``), claims its own block, and writes its node record; node 0 polls until all
records are there. Ports are not bound: each host already runs ``--other-jobs`` other slime jobs
holding the first block of their own keys, which is what makes a block busy. Measured per N: time
from the head record to all nodes joined, reads of the head record (the shared filesystem's load
while nodes wait), nodes whose first block was taken (collisions) and blocks tried beyond the first
(retries). Nothing runs Ray; Ray's own join is the N-node bench (tests/bench/bootstrap.py --nodes).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from slime.core import ports  # noqa: E402
from slime.core.rendezvous import Rendezvous, head_poll_s  # noqa: E402


class Counting(Rendezvous):
    """The real rendezvous, counting reads of the head record (what N waiting nodes cost the filesystem)."""

    lock = threading.Lock()
    head_reads = 0

    def head(self):
        with Counting.lock:
            Counting.head_reads += 1
        return super().head()


def busy_ports(host: str, other_jobs: int, rng: random.Random) -> set[int]:
    """The ports of the blocks ``other_jobs`` other slime jobs hold on ``host`` (their keys' first blocks)."""
    taken: set[int] = set()
    for j in range(other_jobs):
        block = next(ports.candidates(f"other-{host}-{j}-{rng.random()}"))
        taken.update(block.all_ports())
    return taken


def simulate(n: int, *, other_jobs: int, head_delay: float, skew: float, poll: float, seed: int) -> dict:
    rng = random.Random(seed)
    Counting.head_reads = 0
    stats = {"collisions": 0, "retries": 0}
    stats_lock = threading.Lock()
    with tempfile.TemporaryDirectory(prefix="rdv-sim-") as tmp:
        rdv = Counting(Path(tmp) / "rendezvous", "900001.0")
        rdv.dir.mkdir()
        claims = Path(tmp) / "ports"
        key, stop = "900001-0", threading.Event()
        busy = {r: busy_ports(f"node{r}", other_jobs, rng) for r in range(n)}
        first = next(ports.candidates(key)).base

        def claim(rank: int):
            c = ports.claim_block(key, host=f"node{rank}", directory=claims, is_free=lambda p: p not in busy[rank])
            tried = (c.block.base - first) // ports.BLOCK % (len(list(ports.candidates(key))))
            with stats_lock:
                stats["collisions"] += c.block.base != first
                stats["retries"] += tried
            return c

        def worker(rank: int, start: float) -> None:
            time.sleep(start)
            head = rdv.wait_head(time.monotonic() + 120, stop, poll=poll)
            assert head is not None
            c = claim(rank)
            rdv.write_node(rank, state="joined", ports=c.block.to_json())

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(r, rng.uniform(0, skew)), daemon=True) for r in range(1, n)]
        for t in threads:
            t.start()
        c = claim(0)
        time.sleep(head_delay)
        published = time.monotonic()
        rdv.publish_head(host="node0", ip="10.0.0.1", port=c.block.gcs)
        rdv.write_node(0, state="joined", ports=c.block.to_json())
        while len(list(rdv.dir.glob("node-*.json"))) < n:
            time.sleep(0.05)
        joined = time.monotonic()
        stop.set()
        for t in threads:
            t.join()
    return {
        "nodes": n,
        "poll_s": poll,
        "joined_s": joined - published,
        "total_s": joined - t0,
        "head_reads": Counting.head_reads,
        "reads_per_s": Counting.head_reads / max(joined - t0, 1e-9),
        **stats,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--other-jobs", type=int, default=4, help="other slime jobs already on every host")
    ap.add_argument("--head-delay", type=float, default=2.0, help="seconds the head's ray start takes")
    ap.add_argument("--launch-skew", type=float, default=1.0, help="nodes start within this many seconds")
    ap.add_argument("--fixed-poll", type=float, default=None, help="poll at this interval whatever N (the old way)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"rendezvous simulation ({args.other_jobs} other jobs per host, head ready after {args.head_delay:g} s)"
    )
    for col in ("nodes", "poll (s)", "head→all joined (s)", "head-record reads", "reads/s", "collisions", "retries"):
        table.add_column(col, justify="right")
    for n in args.nodes:
        poll = args.fixed_poll if args.fixed_poll is not None else head_poll_s(n)
        r = simulate(
            n, other_jobs=args.other_jobs, head_delay=args.head_delay, skew=args.launch_skew, poll=poll, seed=args.seed
        )
        table.add_row(
            str(n),
            f"{poll:.2f}",
            f"{r['joined_s']:.2f}",
            str(r["head_reads"]),
            f"{r['reads_per_s']:.0f}",
            str(r["collisions"]),
            str(r["retries"]),
        )
        Console().print(f"N={n}: done", style="dim")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
