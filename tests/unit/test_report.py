"""``slime-submit report`` and ``slime-submit rollouts`` on run dirs made of the files the launchers and the
runtime write (``tests.fixtures.run_records``: a real spec's run files and a real quickstart's metrics),
with saved rollouts written by the runtime's own writer (``slime.runtime.rollout.saved.write_rollout``).
What a browser makes of the page is tests/e2e/test_report.py's part.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
pytest.importorskip("matplotlib")

from slime.cli import rollout_store as store
from slime.cli.main import main
from slime.cli.report import write_report
from slime.cli.report_data import flatten, load_run, spec_diff
from slime.cli.report_viewer import CHUNK, choose
from slime.rl.sample import Sample, SampleStatus
from slime.runtime.rollout.saved import write_rollout
from tests.fixtures.run_records import finished, make_run

ROOT = Path(__file__).resolve().parents[2]
GROUPS, PER_GROUP = 3, 4


def samples(rollout_id: int, *, trainer: bool = False) -> list[Sample]:
    out = []
    for g in range(GROUPS):
        for i in range(PER_GROUP):
            n = 2 + i  # response lengths 2..5
            lps = [-0.1 * (k + 1) for k in range(n)]
            extra = {"trainer_log_probs": [x + (0.5 if k == 0 else 1e-6) for k, x in enumerate(lps)]} if trainer else {}
            meta = {"rollout_id": rollout_id}
            if g == 1:  # an agent episode: a tool call, and tool output the loss mask leaves out
                call = {"name": "calculator", "arguments": {"expression": "1+2"}, "ok": True, "output": "3"}
                spans = [{"turn_id": "t0", "response_start": 0, "response_end": 1, "weight_version": rollout_id}]
                meta["agent"] = {"stop": "answer", "turns": 2, "tool_calls": [call], "turn_spans": spans}
            out.append(
                Sample(
                    group_index=g,
                    index=g * PER_GROUP + i,
                    prompt=f"{g}+{i}=</script><b>",
                    tokens=[5, 6] + [7 + k for k in range(n)],
                    response=f"r{rollout_id}-{g}-{i}",
                    response_length=n,
                    label=str(g + i),
                    reward=float(i % 2),
                    loss_mask=[1] + [0] * (n - 2) + [1] if g == 1 else [1] * n,
                    rollout_log_probs=lps,
                    status=SampleStatus.TRUNCATED if i == 3 else SampleStatus.COMPLETED,
                    metadata=meta,
                    weight_version=rollout_id + 1,
                    extra=extra,
                )
            )
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A finished quickstart-shaped run: 13 metrics lines, 3 saved rollouts, a preflight, one restart."""
    paths = make_run(tmp_path / "runs", "quickstart-20261204-120000-abc123")
    finished(paths)
    tp = paths.task(0)
    for rid in range(3):
        write_rollout(tp.rollouts, rid, samples(rid, trainer=rid == 2))
    tp.summary.write_text(json.dumps({"eval/accuracy": 0.5, "rollout_id": 11}))
    pf = {
        "ok": True,
        "job_id": "local1",
        "ray_nodes": 1,
        "nodes": [{"rank": 0, "host": "vm", "ip": "192.0.2.2", "gpus": [], "roles": {"cpu": ["actor", "engine0"]}}],
        "slots": [{"slot": "node0:cpu", "host": "vm", "gpu": None, "bundle": 0, "roles": ["actor", "engine0"]}],
        "checks": [{"name": "ray_nodes", "ok": True, "message": "Ray sees 1 of 1 node(s)"}],
    }
    tp.preflight_json.write_text(json.dumps(pf))
    t0 = paths.read_jobs()["submitted_at"]
    rec = {"time": t0 + 50, "restart": 1, "cause": "preempted", "budget": "requeues", "rollout_id": 4, "by": "slime"}
    tp.restarts.write_text(json.dumps(rec) + "\n")
    return paths.root


def test_spec_diff_names_exactly_the_changed_fields():
    a = {"train": {"async": False, "lr": 1e-4}, "data": {"eval": [{"name": "h", "interval": 25}]}, "x": []}
    b = {"train": {"async": True, "lr": 1e-4}, "data": {"eval": [{"name": "h", "interval": 5}]}, "x": [], "y": 1}
    assert flatten(a)["data.eval[0].interval"] == 25
    assert spec_diff([a, b]) == [("train.async", [False, True]), ("data.eval[0].interval", [25, 5]), ("y", [None, 1])]
    assert spec_diff([a, a, a]) == []
    assert spec_diff([a, a, b])[0] == ("train.async", [False, False, True])


def test_report_of_one_run_has_every_section_and_nothing_external(run: Path, tmp_path: Path):
    out = write_report([run], tmp_path / "r.html")
    page = out.read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)  # nothing to fetch
    for section in ("runs", "diff", "curves", "preflight", "restarts", "diagnosis", "final", "rollouts"):
        assert f'<section id="{section}">' in page
    charts = set(re.findall(r'<div class="chart" data-metric="([^"]+)" data-axis="rollout_id">', page))
    rows = [json.loads(x) for x in (run / "tasks/0/metrics.jsonl").read_text().splitlines()]
    assert {"rollout/reward_mean", "train/approx_kl", "train/clipfrac", "time/step_s"} <= charts
    assert "sft/loss" not in charts and "sft/loss" in page  # logged once: in the table, not a curve
    assert charts <= {k for r in rows for k in r}
    assert 'data-axis="time"' in page  # and against cumulative step time
    assert "preempted @ rollout 4" in page and "1 restart(s)" in page  # the timeline and its table
    assert "Ray sees 1 of 1 node(s)" in page and "engine0" in page
    assert "Nothing failed" in page
    assert "</script><b>" not in page  # a prompt's text never closes the page's script elements


def test_viewer_embeds_an_index_and_chunks_of_every_saved_sample(run: Path, tmp_path: Path):
    page = write_report([run], tmp_path / "r.html").read_text()
    blocks = dict(re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.S))
    index = json.loads(blocks["rv-index"])
    assert len(index["rows"]) == 3 * GROUPS * PER_GROUP
    chunks = [json.loads(v) for k, v in blocks.items() if k.startswith("rv-chunk-")]
    assert sum(map(len, chunks)) == len(index["rows"]) and max(map(len, chunks)) <= CHUNK
    col = {c: i for i, c in enumerate(index["cols"])}
    last = [r for r in index["rows"] if r[col["rollout"]] == 2][5]
    rec = chunks[last[col["chunk"]]][last[col["pos"]]]
    assert rec["prompt"].endswith("</script><b>")  # escaped in the page, intact once parsed
    assert rec["dlp"][0] == pytest.approx(0.5) and abs(rec["dlp"][1]) < 1e-5  # trainer - engine, per token
    assert json.loads(blocks["rv-meta"])["sources"][0]["trainer_lp"] is True
    agent = next(c for ch in chunks for c in ch if c["meta"].get("agent") and len(c["mask"]) > 2)
    assert agent["meta"]["agent"]["tool_calls"][0]["output"] == "3" and 0 in agent["mask"]


def test_viewer_cap_embeds_whole_rollouts_spread_first_to_last():
    ids = list(range(10))
    assert choose(ids, dict.fromkeys(ids, 10), 100) == ids
    assert choose(ids, dict.fromkeys(ids, 10), 30) == [0, 4, 9]
    assert choose(ids, dict.fromkeys(ids, 10), 5) == [9]  # even one does not fit: the last (cut)


def test_report_caps_the_embedded_samples(run: Path, tmp_path: Path):
    page = write_report([run], tmp_path / "r.html", max_samples=GROUPS * PER_GROUP).read_text()
    index = json.loads(re.search(r'id="rv-index">(.*?)</script>', page, re.S).group(1))
    assert {r[1] for r in index["rows"]} == {2}  # the last rollout only
    page = write_report([run], tmp_path / "r.html", rollouts=[0]).read_text()
    index = json.loads(re.search(r'id="rv-index">(.*?)</script>', page, re.S).group(1))
    assert {r[1] for r in index["rows"]} == {0}


def test_two_runs_are_compared_field_by_field(tmp_path: Path):
    runs = tmp_path / "runs"
    a = make_run(runs, "quickstart-20261204-120000-aaaaaa")
    b = make_run(
        runs, "quickstart-20261204-120001-bbbbbb", overrides=("train.async=true", "algorithm.tis.enabled=true")
    )
    for p in (a, b):
        finished(p)
    page = write_report([a.root, b.root], tmp_path / "cmp.html").read_text()
    diff = re.search(r'<table class="diff">(.*?)</table>', page, re.S).group(1)
    assert re.findall(r"<tr><td>([^<]+)</td>", diff) == ["train.async", "algorithm.tis.enabled"]
    assert "quickstart (aaaaaa)" in page and "quickstart (bbbbbb)" in page
    assert [r.label for r in map(load_run, (a.root, b.root))] == ["quickstart (aaaaaa)", "quickstart (bbbbbb)"]


def test_a_failed_task_is_diagnosed(run: Path, tmp_path: Path):
    tp = run / "tasks" / "0"
    state = json.loads((tp / "state.json").read_text())
    (tp / "state.json").write_text(json.dumps({**state, "state": "failed", "exit_code": 3, "error": "lost sn2"}))
    (tp / "logs").mkdir(exist_ok=True)
    (tp / "logs" / "vm.out").write_text("starting\nerror: lost sn2 (10.77.0.12) during training\n")
    page = write_report([run], tmp_path / "r.html").read_text()
    diag = page[page.index('<section id="diagnosis">') : page.index('<section id="final">')]
    assert "failed (exit code 3): lost sn2" in diag and "error: lost sn2 (10.77.0.12)" in diag


def test_store_reads_what_the_runtime_wrote(run: Path):
    rdir = run / "tasks/0/rollouts"
    assert store.saved_rollouts(rdir) == [0, 1, 2] and store.count_rows(rdir, 1) == GROUPS * PER_GROUP
    index = store.read_index(rdir, [1])
    assert [(r.group, r.index, r.length) for r in index[:4]] == [(0, 0, 2), (0, 1, 3), (0, 2, 4), (0, 3, 5)]
    kept = store.select(index, store.Filter(min_reward=0.5, min_len=4), "-len")
    assert [(r.index, r.length) for r in kept] == [(3, 5), (7, 5), (11, 5)]
    (s,) = store.read_samples(rdir, [(1, 5)])
    assert s["response"] == "r1-1-1" and s["loss_mask"] == [1, 0, 1] and s["trainer_lp"] is None
    assert store.read_samples(rdir, [(2, 0)])[0]["trainer_lp"][0] == pytest.approx(-0.1 + 0.5)


def test_vocab_decodes_a_byte_level_tokenizer_json(tmp_path: Path):
    tok = {
        "model": {"type": "BPE", "vocab": {"a": 0, "Ġb": 1, "Ċ": 2}},
        "decoder": {"type": "ByteLevel"},
        "added_tokens": [{"id": 3, "content": "<eos>"}],
    }
    (tmp_path / "final_model").mkdir()
    (tmp_path / "final_model" / "tokenizer.json").write_text(json.dumps(tok))
    assert store.vocab(tmp_path, {}) == {0: "a", 1: " b", 2: "\n", 3: "<eos>"}
    assert store.vocab(tmp_path / "nothing", {}) is None


def test_rollouts_command_filters_sorts_and_pages(run: Path, capsys):
    rc = main(["rollouts", str(run), "--rollout", "1", "--sort", "reward", "--desc", "--page-size", "4", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["matched"] == GROUPS * PER_GROUP and doc["pages"] == 3
    assert [s["reward"] for s in doc["samples"]] == [1.0] * 4
    rc = main(["rollouts", str(run), "--group", "2", "--max-len", "3", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["rollouts"] == [2] and [s["index"] for s in doc["samples"]] == [8, 9]
    assert main(["rollouts", str(run), "--rollout", "7"]) == 2
    assert "rollout 7 is not saved" in capsys.readouterr().err


def test_rollouts_command_draws_a_sample_and_a_group(run: Path, capsys):
    assert main(["rollouts", str(run), "--sample", "5"]) == 0
    out = capsys.readouterr().out
    assert "r2-1-1" in out and "calculator" in out and "turn t0" in out and "|diff|" in out
    assert main(["rollouts", str(run), "--group", "0", "--side-by-side"]) == 0
    out = capsys.readouterr().out
    assert all(f"r2-0-{i}" in out for i in range(PER_GROUP))
    assert main(["rollouts", str(run), "--side-by-side"]) == 2


def test_report_command_writes_into_the_run_dir(run: Path, capsys):
    assert main(["report", str(run), "--json"]) == 0
    out = Path(json.loads(capsys.readouterr().out)["report"])
    assert out == run / "report.html" and out.stat().st_size > 0
    assert main(["report", str(run / "nope")]) == 2


def test_the_cli_parser_imports_neither_matplotlib_nor_pyarrow():
    code = (
        "import sys\nfrom slime.cli.main import main\nrc = main(['report', '--help'])\n"
        "print('HEAVY', sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'pyarrow', 'pandas'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "HEAVY []" in out.stdout, out


def test_a_finished_local_run_and_a_kept_smoke_run_print_their_report(run: Path, capsys):
    from slime.cli.report import print_finished, smoke_report

    (run / "tasks/0/summary.json").unlink()
    print_finished(run, 0)  # no summary.json: not finished
    print_finished(run, 1)
    assert capsys.readouterr().out == "" and not (run / "report.html").exists()
    (run / "tasks/0/summary.json").write_text("{}")
    print_finished(run, 0)
    assert capsys.readouterr().out.startswith(f"report: {run / 'report.html'}")
    assert smoke_report(run) == str(run / "report.html") and smoke_report(None) is None


def test_a_sweep_run_draws_one_series_per_task(tmp_path: Path):
    paths = make_run(tmp_path / "runs", "sweep-lr-seed-20261204-120000-5eeeee", spec="specs/sweep.yaml")
    tasks = paths.task_indices()
    assert len(tasks) >= 2
    for i in tasks[:2]:
        finished(paths, i)
    page = write_report([paths.root], tmp_path / "r.html").read_text()
    assert "sweep-lr-seed (5eeeee) task 0" in page and "sweep-lr-seed (5eeeee) task 1" in page
    assert "task 1 sweep point" in page  # the sweep point's fields


def test_without_the_runtime_extra_both_commands_say_what_to_install(run: Path, monkeypatch, capsys):
    import slime.cli.report as report_cli

    monkeypatch.setattr(report_cli, "missing_modules", lambda names=("matplotlib", "pyarrow"): list(names))
    assert main(["report", str(run)]) == 2 and main(["rollouts", str(run)]) == 2
    err = capsys.readouterr().err
    assert "report needs matplotlib and pyarrow" in err and "saved rollouts needs pyarrow" in err
    assert "slime-submit[runtime]" in err and not (run / "report.html").exists()
