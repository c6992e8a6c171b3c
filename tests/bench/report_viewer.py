"""Benchmark: the rollout viewers on a run with many saved samples (synthesised; not run in CI).

    python tests/bench/report_viewer.py [--rollouts 40] [--samples 256] [--response 128] [--keep DIR]

Writes a run dir (the quickstart's run files and metrics) whose ``tasks/0/rollouts`` holds rollouts x samples
through the runtime's own writer (slime/runtime/rollout/saved.py), then times the terminal viewer (a fresh
process each: the last rollout's first page, another page, every rollout sorted by reward, one sample),
``report`` with the default cap and with every sample embedded (time, HTML size), and each page in
headless Chromium (load, a page turn, a sort, opening a sample; skipped without Chromium). Numbers depend
on the machine and its load; nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def synthesise(parent: Path, rollouts: int, per: int, response: int) -> Path:
    """A finished quickstart run dir with ``rollouts`` x ``per`` saved samples of about ``response`` tokens."""
    from slime.rl.sample import Sample, SampleStatus
    from slime.runtime.rollout.saved import write_rollout
    from tests.fixtures.run_records import finished, make_run

    paths = make_run(parent, "bench-20261204-120000-beefed")
    finished(paths)
    rng = random.Random(0)
    for rid in range(rollouts):
        batch = []
        for k in range(per):
            n = rng.randint(response // 2, response * 3 // 2)
            batch.append(
                Sample(
                    group_index=k // 8,
                    index=k,
                    prompt=f"{rng.randint(0, 99):02d}+{rng.randint(0, 99):02d}= " * 4,
                    tokens=[rng.randrange(200) for _ in range(32 + n)],
                    response=" ".join(str(rng.randrange(100)) for _ in range(n // 2)),
                    response_length=n,
                    label=str(rng.randrange(200)),
                    reward=float(rng.random() < 0.4),
                    loss_mask=[1] * n,
                    rollout_log_probs=[-rng.random() * 3 for _ in range(n)],
                    status=SampleStatus.COMPLETED if rng.random() < 0.9 else SampleStatus.TRUNCATED,
                    metadata={"rollout_id": rid},
                    weight_version=rid + 1,
                )
            )
        write_rollout(paths.task(0).rollouts, rid, batch)
    return paths.root


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t


def terminal(run: Path, repeats: int) -> dict[str, float]:
    cli = [sys.executable, "-m", "slime.cli.main", "rollouts", str(run)]
    cases = {
        "open (last rollout, page 1)": [],
        "page 5": ["--page", "5"],
        "all rollouts, sorted by reward": ["--all", "--sort", "reward", "--desc"],
        "one sample in full": ["--sample", "3"],
    }
    return {name: statistics.median(wall([*cli, *extra]) for _ in range(repeats)) for name, extra in cases.items()}


def in_chromium(html: Path, profile: Path) -> dict[str, float] | None:
    """Load, page-turn and sort times measured in headless Chromium (ms), or None without it."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return None
    from tests.e2e.test_report_pages import Page

    page = Page(html, profile)
    try:
        nav = page.js(
            "const n = performance.getEntriesByType('navigation')[0]; "
            "return [n.domContentLoadedEventEnd, n.loadEventEnd]"
        )
        timed = "const t = performance.now(); document.getElementById({id}).{action}; return performance.now() - t"
        turn = page.js(timed.format(id="'rv-next'", action="click()"))
        sort = page.js(
            "const s = document.getElementById('rv-sort'); s.value = '-reward'; const t = performance.now(); "
            "s.dispatchEvent(new Event('input')); return performance.now() - t"
        )
        open_ = page.js(timed.format(id="'rv-body'", action="querySelector('tr').click()"))
        errors = page.console_errors()
        return {"DOMContentLoaded ms": nav[0], "load ms": nav[1], "page turn ms": turn, "sort ms": sort,
                "open a sample ms": open_, "console errors": len(errors)}  # fmt: skip
    finally:
        page.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--samples", type=int, default=256, help="per rollout")
    ap.add_argument("--response", type=int, default=128, help="mean response tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the run and reports here (kept)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="report-bench-"))
    t = time.perf_counter()
    run = synthesise(work / "runs", args.rollouts, args.samples, args.response)
    files = sorted((run / "tasks/0/rollouts").glob("*.parquet"))
    mib = sum(f.stat().st_size for f in files) / 2**20
    print(f"synthesised {args.rollouts * args.samples} samples in {len(files)} Parquet files ({mib:.1f} MiB) "
          f"in {time.perf_counter() - t:.1f} s: {run}")  # fmt: skip
    for name, s in terminal(run, args.repeats).items():
        print(f"terminal  {name:32s} {s:6.2f} s (fresh process, median of {args.repeats})")
    report = [sys.executable, "-m", "slime.cli.main", "report", str(run), "-o"]
    for label, extra in (("default cap", []), ("every sample", ["--max-samples", str(args.rollouts * args.samples)])):
        html = work / f"report-{label.replace(' ', '-')}.html"
        s = wall([*report, str(html), *extra])
        print(f"report    {label:32s} {s:6.2f} s, {html.stat().st_size / 2**20:.1f} MiB: {html}")
        got = in_chromium(html, work / f"chrome-{label.replace(' ', '-')}")
        print(f"chromium  {label:32s} " + (json.dumps(got) if got else "skipped (no chromium/chromedriver)"))
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
