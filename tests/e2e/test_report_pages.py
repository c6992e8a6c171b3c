"""``slime-submit report`` of real runs in headless Chromium: the quickstart (sync, async, the two compared), an
agent run and a requeued SLURM run.

Each page must load with no console error and no network request (the DevTools performance log records
every request; only the page's own file:// load is allowed), show its curves and tables (DOM checks), and
its rollout viewer must page and open a sample and its group; a screenshot of each is saved in the test's
tmp dir. Browser: Debian's ``chromium`` through ``chromium-driver`` and selenium (ci/install.sh); without
them the tests skip, saying so. Runs: short copies of the specs with ``debug.save_rollouts``; the quickstart
ones start from the session's warm-up, the SLURM one is requeued as tests/e2e/test_slurm_preemption.py does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.agent_runs import check_agent_rollouts
from tests.fixtures.quickstart import QUICKSTART, submit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
# the CPU-bound runs, one at a time (tests/conftest.py); the SLURM test goes with the other SLURM tests
LEARNING = pytest.mark.xdist_group("learning")

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 4
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def _chromium() -> tuple[str, str]:
    """(browser, driver) paths, or skip saying what is missing."""
    pytest.importorskip("selenium", reason="selenium is not installed (the test extra has it)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("headless Chromium is not installed (Debian: chromium chromium-driver; ci/install.sh)")
    return browser, driver


class Page:
    """One report opened in a fresh headless Chromium (own profile dir), with its console and network logs."""

    def __init__(self, html: Path, profile: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        browser, driver = _chromium()
        opts = webdriver.ChromeOptions()
        opts.binary_location = browser
        for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1000"):
            opts.add_argument(flag)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        self.url = html.resolve().as_uri()
        self.driver = webdriver.Chrome(options=opts, service=Service(driver))
        self.driver.get(self.url)

    def js(self, code: str):
        return self.driver.execute_script(code)

    def count(self, css: str) -> int:
        return self.js(f"return document.querySelectorAll({json.dumps(css)}).length")

    def column(self, rows_css: str, i: int) -> list[str]:
        """The text of cell ``i`` of each row ``rows_css`` selects."""
        return self.js(
            f"return [...document.querySelectorAll({json.dumps(rows_css)})].map(r => r.cells[{i}].textContent)"
        )

    def console_errors(self) -> list[dict]:
        return [e for e in self.driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]

    def requests(self) -> list[str]:
        """URLs requested since the page's own document (the browser's start page may still log before it)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                urls.append(msg["params"]["request"]["url"])
        assert self.url in urls, urls
        return urls[urls.index(self.url) + 1 :]

    def screenshot(self, path: Path) -> Path:
        height = self.js("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1400, min(int(height) + 100, 16000))
        self.js("window.scrollTo(0, 0)")
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.driver.quit()


def report(*runs: Path, out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "report", *map(str, runs), "-o", str(out), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == {"report": str(out)}
    return out


def check_page(html: Path, tmp_path: Path, *, metrics: tuple[str, ...], group_size: int) -> Page:
    """Open ``html`` and check what every report must show; returns the open page for more checks."""
    _chromium()
    page = Page(html, tmp_path / "chrome-profile")
    try:
        assert page.count("#runs table.kv") >= 1 and page.count("#preflight table.nodes tbody tr") >= 1
        assert page.count("#final table.final tbody tr") > 0
        charts = page.js("return [...document.querySelectorAll('#curves .chart')].map(e => e.dataset.metric)")
        assert set(metrics) <= set(charts), charts
        assert page.count("#curves .chart svg path") > len(charts)  # every chart drew lines
        assert page.count("#rv-body tr") > 0
        page.js("document.querySelector('#rv-body tr').click()")
        assert page.count("#rv-detail .toks .tok") > 0
        page.js("document.getElementById('rv-group-btn').click()")
        assert page.count("#rv-detail .rv-group .card") == group_size
        page.js("const s = document.getElementById('rv-size'); s.value = '25'; s.dispatchEvent(new Event('input'))")
        page.js("document.getElementById('rv-next').click()")
        shown = int(page.js("return document.getElementById('rv-count').textContent").split()[0])
        want = "page 2/" if shown > 25 else "page 1/1"
        assert want in page.js("return document.getElementById('rv-count').textContent")
        shot = page.screenshot(tmp_path / f"{html.stem}.png")
        assert page.console_errors() == [] and page.requests() == []
        print(f"screenshot: {shot}")
        return page
    except BaseException:
        page.close()
        raise


@pytest.fixture(scope="module")
def quickstart_runs(tmp_path_factory, quickstart_warmup) -> tuple[Path, Path]:
    """A short synchronous and asynchronous quickstart from the session's warm-up, rollouts saved."""
    _chromium()  # no browser: skip before paying for the runs
    start, _ = quickstart_warmup
    logs = tmp_path_factory.mktemp("report-runs")
    common = {
        **start,
        "logging.dir": str(logs),
        "rollout.num_rollouts": ROLLOUTS,
        "data.eval[0].interval": 2,
        "data.eval[0].max_prompts": 100,
        "debug.save_rollouts": True,
        "logging.progress": False,
    }
    sync, _ = submit(QUICKSTART, common, timeout=300)
    asyn, _ = submit(QUICKSTART, {**common, "train.async": True, "algorithm.tis": {"enabled": True}}, timeout=300)
    return Path(sync["run_dir"]), Path(asyn["run_dir"])


QUICKSTART_CURVES = ("rollout/reward_mean", "eval/accuracy", "train/approx_kl", "train/clipfrac")
QUICKSTART_CURVES += ("rollout/response_len_mean", "perf/train_tokens_per_s", "time/train_s", "time/rollout_s")


@LEARNING
def test_quickstart_report_in_chromium(quickstart_runs, tmp_path):
    run, _ = quickstart_runs
    html = report(run, out=tmp_path / "quickstart.html")
    page = check_page(html, tmp_path, metrics=QUICKSTART_CURVES, group_size=8)
    try:
        assert page.count("#diagnosis .ok") == 1 and page.count("#restarts table.restarts") == 0
        page.js("document.querySelector('input[name=xaxis][value=time]').click()")
        assert page.js("return document.querySelector('[data-x=time]').style.display") == ""
    finally:
        page.close()


@LEARNING
def test_async_report_and_the_sync_async_comparison(quickstart_runs, tmp_path):
    sync, asyn = quickstart_runs
    page = check_page(
        report(asyn, out=tmp_path / "async.html"),
        tmp_path,
        metrics=(*QUICKSTART_CURVES, "rollout/staleness_mean", "train/tis_clipfrac", "train/is_ratio_mean"),
        group_size=8,
    )
    page.close()
    page = check_page(
        report(sync, asyn, out=tmp_path / "compare.html"), tmp_path, metrics=QUICKSTART_CURVES, group_size=8
    )
    try:
        fields = page.column("#diff table.diff tbody tr", 0)
        assert fields == ["train.async", "algorithm.tis.enabled"]  # exactly what the second run changed
        values = [page.column("#diff table.diff tbody tr", i) for i in (1, 2)]
        assert values == [["false", "false"], ["true", "true"]]
        # both runs on every chart: two lines of the runs' colours
        colours = page.js(
            "return [...document.querySelectorAll('.chart[data-metric=\"rollout/reward_mean\"] path')]"
            ".map(p => p.style.stroke).filter(s => s)"
        )
        assert {"rgb(31, 119, 180)", "rgb(255, 127, 14)"} <= set(colours), colours
    finally:
        page.close()


@LEARNING
def test_agent_report_shows_turns_and_tool_calls(tmp_path):
    _chromium()
    short = {
        "rollout.batch_size": 4,
        "rollout.n_samples_per_prompt": 4,
        "train.global_batch_size": 16,
        "train.micro_batch_size": 16,
        "rollout.num_rollouts": 2,
        "logging.dir": str(tmp_path / "runs"),
        "debug.save_rollouts": True,
        "logging.progress": False,
    }
    out, _ = submit(REPO / "specs" / "agent-local.yaml", short, timeout=600)
    run = Path(out["run_dir"])
    rows = [json.loads(x) for x in (run / "tasks/0/metrics.jsonl").read_text().splitlines()]
    check_agent_rollouts(rows[1:])
    page = check_page(report(run, out=tmp_path / "agent.html"), tmp_path, metrics=("agent/tool_calls",), group_size=4)
    try:
        # open an episode that called the tool: its turns are marked in the token strip, its calls listed
        opened = page.js(
            "for (const tr of document.querySelectorAll('#rv-body tr')) { tr.click();"
            " if (document.querySelector('#rv-detail .rv-tools')) return true; } return false"
        )
        assert opened and page.count("#rv-detail .turn") >= 2 and page.count("#rv-detail .tok.nomask") > 0
        assert "calculator" in page.js("return document.querySelector('#rv-detail .rv-tools').textContent")
    finally:
        page.close()


def slurm_copy(tmp_path: Path, num_rollouts: int) -> Path:
    """specs/smoke-slurm.yaml shortened as tests/e2e/test_slurm_preemption.py shortens it (1 fake GPU per node,
    a checkpoint every 2 rollouts, requeues allowed), W&B offline, rollouts saved."""
    text = (REPO / "specs" / "smoke-slurm.yaml").read_text()
    swaps = [
        ("name: smoke-slurm", "name: report-requeue"),
        ("  gpus_per_node: 2\n", "  gpus_per_node: 1\n"),
        ("  cpus_per_node: 2 ", "  cpus_per_node: 1 "),
        ("num_rollouts: 2", f"num_rollouts: {num_rollouts}"),
        ("  seed: 1\n", "  seed: 1\n  checkpoint: {interval: 2, keep: 2, save_hf: false}\n"),
        ("data/arith/train.jsonl", str(REPO / "specs" / "data" / "arith" / "train.jsonl")),
        ("dir: ../runs", f"dir: {tmp_path / 'runs'}"),
        ("mode: disabled", "mode: offline"),
        ("    signal_grace_s: 60\n", "    signal_grace_s: 60\n    max_requeues: 2\n"),  # cluster.slurm
    ]
    for old, new in swaps:
        assert old in text, f"specs/smoke-slurm.yaml changed: {old!r} not found"
        text = text.replace(old, new)
    path = tmp_path / "report-requeue.yaml"
    path.write_text(text + "\ndebug:\n  save_rollouts: true\n")
    return path


def wait_for(what: str, pred, log: Path, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log.exists() else "(no log)"
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; job log tail:\n{tail}")
        time.sleep(0.2)


def last_rollout(task: Path) -> int:
    ids = []
    for line in (task / "metrics.jsonl").read_text().splitlines() if (task / "metrics.jsonl").exists() else []:
        try:
            ids.append(json.loads(line)["rollout_id"])
        except (ValueError, KeyError):
            pass  # a line being written
    return max(ids, default=-2)


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_requeued_slurm_run_report_shows_its_restart(slurm_cluster, tmp_path):
    """A job requeued once by ``scontrol requeue`` after rollout 2, resumed from its checkpoint, completed."""
    from tests.fixtures.slurm_cluster import job_records, wait_job

    _chromium()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", str(slurm_copy(tmp_path, 6)), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    run_dir, job = Path(out["run_dir"]), out["job_ids"][0]
    task, log = run_dir / "tasks" / "0", run_dir / "logs" / f"slurm-{job}.out"
    wait_for("rollout 2", lambda: last_rollout(task) >= 2, log)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    wait_for("the requeue", lambda: any(r.get("Restarts", "0") != "0" for r in job_records(job)), log, 60)
    (rec,) = wait_job(job, timeout=360)
    assert rec["JobState"] == "COMPLETED" and rec["Restarts"] == "1", log.read_text()[-4000:]
    html = report(run_dir, out=tmp_path / "slurm.html")
    page = check_page(html, tmp_path, metrics=("rollout/reward_mean", "train/loss"), group_size=2)
    try:
        assert page.column("#restarts table.restarts tbody tr", 2) == ["requeued"]
        assert page.count("#restarts .timeline svg") == 1
        assert page.count("#preflight table.nodes tbody tr") == 2  # both nodes of the job
    finally:
        page.close()
