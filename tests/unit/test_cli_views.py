"""``list`` and ``status`` at 80 columns: one line per row, the right columns kept, ``-o wide`` for all;
short run ids as targets; elapsed time, throughput and the newest eval metric.

Rendered two ways: the views through a rich ``Console`` of fixed width (as the terminal would draw
them), and the commands themselves with ``COLUMNS`` set (what a user sees; rich reads it).
Run dirs are made of the launchers' own files (tests/fixtures/run_records.py).
"""

from __future__ import annotations

import io
import json
import time

import pytest
from rich.console import Console

from launchers.status import latest_eval, throughput
from slime.cli.jobs_view import ListView, StatusView
from slime.cli.main import main
from slime.cli.tables import Col, FitTable
from tests.fixtures.run_records import METRICS, Replay, finished, make_run

pytestmark = pytest.mark.timeout(120)


def render(renderable, width: int = 80) -> list[str]:
    con = Console(width=width, file=io.StringIO(), color_system=None, highlight=False)
    con.print(renderable)
    return con.file.getvalue().rstrip("\n").split("\n")


def cli(capsys, monkeypatch, *argv: str, columns: int = 80) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    rc = main(list(argv))
    return rc, capsys.readouterr().out


@pytest.fixture
def runs(tmp_path):
    """Three runs: two finished quickstarts (one with a long name) and a three-task sweep."""
    d = tmp_path / "runs"
    long_name = "a-very-long-experiment-name-for-the-learning-rate-sweep"
    a = make_run(d, "quickstart-20260101-000000-a1b2c3", started=time.time() - 3000)
    finished(a)
    b = make_run(
        d,
        f"{long_name}-20260101-000100-a1ffee",
        started=time.time() - 2000,
        overrides=(f"name={long_name}",),
    )
    finished(b, lines=5)
    c = make_run(
        d,
        "sweep-20260101-000200-c0ffee",
        started=time.time() - 1000,
        overrides=("name=sweep", "sweep.grid={'train.optimizer.lr': [1.0e-4, 3.0e-4, 1.0e-3]}"),
    )
    for t in range(3):
        finished(c, t, lines=4 + t)
    return d, a, b, c


# ----------------------------------------------------------------------------- the fitting itself
def test_fit_table_keeps_important_columns_uses_short_forms_and_one_line_per_row():
    cols = [
        Col("ID"),
        Col("NAME", flex=True, min_width=8, cap=20),
        Col("METRIC", priority=2),
        Col("NOTE", priority=5),
        Col("EMPTY", priority=1),
    ]
    rows = [
        ["a1", "x" * 50, ("rollout/reward_mean=0.75", "reward=0.75"), "n" * 50, ""],
        ["b2", "short", ("eval/accuracy=0.5", "accuracy=0.5"), "-", ""],
    ]
    table = FitTable(cols, rows)
    # in full: 2 + 50 + 24 + 50 (+ the empty column, left out) = 126 + 3 gaps. At 80: METRIC's short
    # form and NAME's cap (20) are not enough (2+20+11+50+6 = 89), so NOTE (least important) goes;
    # the room that leaves goes back: METRIC's full form, then NAME (80-2-24-4 = 50: all of it)
    shown, short, cut = table.layout(80)
    assert [cols[i].header for i in shown] == ["ID", "NAME", "METRIC"] and short == [False] * 5 and cut == {}
    lines = render(table, 80)
    assert len(lines) == 3 and all(len(line) <= 80 for line in lines), lines
    assert lines[1].split() == ["a1", "x" * 50, "rollout/reward_mean=0.75"]
    # 60 columns: NOTE goes; METRIC gets its full form back (it comes before cut columns), NAME the
    # rest: 60 - 2 - 24 - 2 gaps = 30, cut with an ellipsis
    shown, short, cut = table.layout(60)
    assert [cols[i].header for i in shown] == ["ID", "NAME", "METRIC"] and not short[2] and cut == {1: 30}
    lines = render(table, 60)
    assert len(lines) == 3 and lines[1] == "a1  " + "x" * 29 + "…  rollout/reward_mean=0.75"
    # 45 columns: METRIC's short form (12: "accuracy=0.5") and NAME 45 - 2 - 12 - 4 = 27
    shown, short, cut = table.layout(45)
    assert short[2] and cut == {1: 27}
    # 20 columns: METRIC dropped, NAME gets what is left (16); still one line per row
    assert table.layout(20)[0] == [0, 1] and table.layout(20)[2] == {1: 16}
    lines = render(table, 20)
    assert len(lines) == 3 and all(len(line) <= 20 for line in lines) and "reward" not in lines[1]
    # wide: every column in full
    assert table.natural_width() == 2 + 50 + 24 + 50 + 5 + 4 * 2
    wide = render(FitTable(cols, rows, wide=True), table.natural_width())
    assert len(wide) == 3 and "rollout/reward_mean=0.75" in wide[1] and "n" * 50 in wide[1]


# ----------------------------------------------------------------------------- list
def test_list_at_80_columns_is_one_line_per_run_with_short_ids(runs, capsys, monkeypatch):
    d, a, b, c = runs
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d))
    lines = out.rstrip("\n").split("\n")
    assert rc == 0
    assert all(len(line) <= 80 for line in lines), out
    title, header, *rows = lines
    assert "newest first" in title and header.split()[:3] == ["ID", "NAME", "STATE"]
    assert len(rows) == 3, out  # one line per run, newest first
    assert [r.split()[0] for r in rows] == ["c0ffee", "a1ffee", "a1b2c3"]
    assert rows[0].split()[2] == "succeeded" and "…" in rows[1]  # the long name is cut, not wrapped
    assert rows[1].split()[1].startswith("a-very-long-experiment")
    # the same through a fixed-width rich console
    doc_rc, doc = cli(capsys, monkeypatch, "list", "--dir", str(d), "--json")
    view = ListView(str(d), json.loads(doc)["runs"])
    assert len(render(view, 80)) == 2 + 3


def test_list_wide_shows_every_column_in_full(runs, capsys, monkeypatch):
    d, a, b, c = runs
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d), "-o", "wide")
    lines = out.rstrip("\n").split("\n")
    assert rc == 0 and len(lines) == 5
    header = lines[1].split()
    assert header == ["ID", "NAME", "STATE", "TASKS", "STEP", "STARTED", "JOBS", "LAUNCHER", "RUN", "DIR"]
    assert b.root.name in out and "a-very-long-experiment-name-for-the-learning-rate-sweep " in out
    assert max(len(line) for line in lines) > 80


def test_list_json_is_unchanged_by_the_table(runs, capsys, monkeypatch):
    d, *_ = runs
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d), "--json", columns=40)
    doc = json.loads(out)
    assert set(doc) == {"dir", "runs"}
    assert set(doc["runs"][0]) == {
        "name",
        "run_dir",
        "launcher",
        "job_ids",
        "state",
        "started",
        "last_step",
        "tasks",
        "preflight_only",
        "problem",
        "report",
        "chain",
    }
    assert [r["tasks"] for r in doc["runs"]] == [3, 1, 1]
    assert [r["report"] for r in doc["runs"]] == [None] * 3  # no report.html written yet


def test_list_report_links_each_runs_report_page(runs, capsys, monkeypatch):
    d, a, b, c = runs
    (a.root / "report.html").write_text("<html></html>")  # what `slime-submit report` writes by default
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d), "--report")
    lines = out.rstrip("\n").split("\n")
    assert rc == 0 and all(len(line) <= 80 for line in lines), out
    title, header, *rows, hint = lines
    assert header.split()[:3] == ["ID", "NAME", "STATE"] and header.split()[-1] == "REPORT"
    assert [r.split()[0] for r in rows] == ["c0ffee", "a1ffee", "a1b2c3"]
    assert [r.split()[-1] for r in rows] == ["-", "-", "report.html"]  # narrow: the short form
    assert "slime-submit report ID --open" in hint
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d), "--report", "-o", "wide")
    assert (a.root / "report.html").resolve().as_uri() in out.split("\n")[-3]  # wide: the whole file:// URI
    doc = json.loads(cli(capsys, monkeypatch, "list", "--dir", str(d), "--json")[1])
    assert [r["report"] for r in doc["runs"]] == [None, None, str(a.root / "report.html")]
    rc, out = cli(capsys, monkeypatch, "list", "--dir", str(d))
    assert "REPORT" not in out  # without --report the table is as before


# ----------------------------------------------------------------------------- status
def test_status_shows_elapsed_throughput_and_eval_in_one_line_per_task(runs, capsys, monkeypatch):
    d, a, b, c = runs
    rc, out = cli(capsys, monkeypatch, "status", "c0f", "--dir", str(d))
    lines = out.rstrip("\n").split("\n")
    assert rc == 0 and all(len(line) <= 80 for line in lines), out
    first, second, header, *rows = lines
    assert first.startswith("sweep succeeded") and second.startswith("id c0ffee  run dir ")
    # every column that fits, REASON left out: no task has one
    assert header.split() == ["TASK", "STATE", "ROLLOUT", "ELAPSED", "METRIC", "EVAL", "THROUGHPUT"]
    assert len(rows) == 3
    # task 1 ran 5 metrics lines: rollouts 0..3 done of 12, 3m20s, the last eval (rollout 3)
    assert rows[1].split()[:6] == ["1", "succeeded", "4/12", "3m20s", "reward=0.007812", "accuracy=0.02"]
    assert rows[1].split()[7] == "tok/s"


def test_status_json_keeps_its_shape_and_adds_the_new_fields(runs, capsys, monkeypatch):
    d, a, *_ = runs
    rc, out = cli(capsys, monkeypatch, "status", str(a.root), "--json")
    doc = json.loads(out)
    (t,) = doc["tasks"]
    assert {"task", "state", "reason", "job_id", "step", "rollout_id", "metric", "restarts", "source"} <= set(t)
    assert (t["step"], t["rollout_id"], t["num_rollouts"]) == (12, 11, 12)
    assert t["elapsed_s"] == pytest.approx(200.0, abs=0.01)
    assert t["eval"] == {"name": "eval/accuracy", "value": 0.016, "rollout_id": 11}
    assert t["throughput"]["unit"] == "tok/s" and t["throughput"]["name"] == "response tokens / step time"
    # over the last 5 lines: sum(response_len_mean * 16 prompts * 8 samples) / sum(time/step_s)
    recs = [json.loads(x) for x in METRICS.read_text().splitlines()[-5:]]
    want = sum(r["rollout/response_len_mean"] * 128 for r in recs) / sum(r["time/step_s"] for r in recs)
    assert t["throughput"]["value"] == pytest.approx(want)


def test_throughput_prefers_the_runtimes_perf_metric_and_eval_is_found_past_the_tail(tmp_path):
    d = tmp_path / "runs"
    paths = make_run(d, "quickstart-20260101-000000-aaaaaa")
    tp = paths.task(0)
    eval_line = {"rollout_id": 0, "step": 1, "eval/heldout/accuracy": 0.5, "eval/heldout/reward": 0.4}
    filler = [{"rollout_id": k, "step": k + 1, "rollout/reward_mean": 0.1, "pad": "x" * 900} for k in range(1, 200)]
    tp.metrics.write_text("".join(json.dumps(r) + "\n" for r in [eval_line, *filler]))
    assert tp.metrics.stat().st_size > 128 * 1024  # beyond the 64 KiB the other fields read
    assert latest_eval(tp) == {"name": "eval/heldout/accuracy", "value": 0.5, "rollout_id": 0}
    perf = [{"rollout_id": 3, "perf/train/tokens_per_s": 10.0, "perf/tokens_per_s": 99.0, "time/step_s": 1.0}]
    assert throughput(tp, perf) == {"name": "perf/tokens_per_s", "value": 99.0, "unit": "tok/s"}
    assert throughput(tp, [{"rollout_id": 3, "perf/rollout/samples_per_s": 4.0}])["unit"] == "samples/s"
    assert throughput(tp, [{"rollout_id": -1, "time/sft_s": 3.0}]) is None


def test_status_wide_and_a_narrow_terminal(runs, capsys, monkeypatch):
    d, a, *_ = runs
    rc, out = cli(capsys, monkeypatch, "status", "a1b", "--dir", str(d), "-o", "wide")
    assert "rollout/reward_mean=0" in out and "eval/accuracy=0.016" in out and "SOURCE" in out
    rc, out = cli(capsys, monkeypatch, "status", "a1b", "--dir", str(d), columns=50)
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 4 and all(len(line) <= 50 for line in lines), out
    assert lines[3].split()[:3] == ["0", "succeeded", "12/12"]


def test_status_view_of_a_running_task_at_80_columns(tmp_path):
    paths = make_run(tmp_path / "runs", "quickstart-20260101-000000-abcdef")
    replay = Replay(paths, delay=0.05)
    try:
        replay.join()
        from launchers import get_launcher

        doc = get_launcher("local").status(paths).to_json()
    finally:
        replay.stop()
    lines = render(StatusView(doc, footer="[dim]every 2s[/]"), 80)
    assert len(lines) == 5 and all(len(line) <= 80 for line in lines)
    assert lines[3].split()[:3] == ["0", "succeeded", "12/12"] and lines[4] == "every 2s"


# ----------------------------------------------------------------------------- short ids
def test_short_ids_prefixes_and_names_are_targets_everywhere(runs, capsys, monkeypatch):
    d, a, b, c = runs
    for target in ("a1b2c3", "a1b", a.root.name):
        rc, out = cli(capsys, monkeypatch, "status", target, "--dir", str(d), "--json")
        assert rc == 0 and json.loads(out)["run_dir"] == str(a.root), target
    rc, out = cli(capsys, monkeypatch, "logs", "c0ffee", "--dir", str(d), "--task", "2", "--json")
    assert rc == 0 and json.loads(out)["run_dir"] == str(c.root)
    rc, out = cli(capsys, monkeypatch, "cancel", "c0ffee", "--dir", str(d), "--json")
    assert rc == 0 and "nothing to cancel" in json.loads(out)["message"]
    rc, out = cli(capsys, monkeypatch, "rerun", "a1b2", "--dir", str(d), "--dry-run", "--json")
    message = json.loads(out)["message"]  # the run was found; these made-up runs have no lock.json
    assert rc == 3 and f"{a.root} has no lock.json" in message


def test_an_ambiguous_prefix_is_a_usage_error_listing_the_matches(runs, capsys, monkeypatch):
    d, a, b, c = runs
    rc, out = cli(capsys, monkeypatch, "status", "a1", "--dir", str(d), "--json")
    doc = json.loads(out)
    assert rc == 2 and doc["error"] == "usage"
    assert "matches 2 runs" in doc["message"] and "a1b2c3" in doc["message"] and "a1ffee" in doc["message"]
    rc, out = cli(capsys, monkeypatch, "status", "zz", "--dir", str(d), "--json")
    assert rc == 2 and "short id" in json.loads(out)["message"]


def test_a_job_id_listed_in_jobs_json_goes_before_a_digit_short_id(tmp_path, capsys, monkeypatch):
    d = tmp_path / "runs"
    digits = make_run(d, "quickstart-20260101-000000-123456")
    listed = make_run(d, "quickstart-20260101-000100-abcdef", job_ids=["1234"])
    rc, out = cli(capsys, monkeypatch, "status", "1234", "--dir", str(d), "--json")
    assert rc == 0 and json.loads(out)["run_dir"] == str(listed.root)
    rc, out = cli(capsys, monkeypatch, "status", "12345", "--dir", str(d), "--json")
    assert rc == 0 and json.loads(out)["run_dir"] == str(digits.root)
