"""JSONL prompt datasets (errors name file:line, seeded order, exact resume) and the arithmetic task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slime.data.arith import make_row, split_pairs, write_dataset
from slime.data.jsonl import DatasetError, PromptDataset

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.fixture
def ten(tmp_path) -> Path:
    return _write(tmp_path / "ten.jsonl", [{"prompt": f"{i:02d}+00=", "label": str(i), "src": "t"} for i in range(10)])


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    "lines, match",
    [
        (['{"prompt": "a", "label": "1"}', "{not json"], r"bad\.jsonl:2: invalid JSON"),
        (['{"prompt": "a", "label": "1"}', "", "[1, 2]"], r"bad\.jsonl:3: each line must be a JSON object"),
        ([{"question": "a", "label": "1"}], r"bad\.jsonl:1: missing key 'prompt' \(row has \['label', 'question'\]\)"),
        ([{"prompt": "a", "label": "1"}, {"prompt": "b"}], r"bad\.jsonl:2: missing key 'label'.*null for unlabelled"),
        ([{"prompt": 5, "label": "1"}], r"bad\.jsonl:1: 'prompt' must be a string or a list of chat messages"),
        ([{"prompt": "", "label": "1"}], r"bad\.jsonl:1: 'prompt' is an empty string"),
        ([{"prompt": [{"role": "user", "content": "hi"}], "label": 1}], r"bad\.jsonl:1: .*enable apply_chat_template"),
        ([{"prompt": [{"content": "hi"}], "label": 1}], r"bad\.jsonl:1: 'prompt' must be a string or a non-empty list"),
        (["", "  "], r"bad\.jsonl: the dataset has no usable rows"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, lines, match):
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(DatasetError, match=match):
        PromptDataset(path)


def test_missing_file_and_missing_tokenizer(tmp_path, ten):
    with pytest.raises(DatasetError, match="no such file"):
        PromptDataset(tmp_path / "nope.jsonl")
    with pytest.raises(DatasetError, match="need a tokenizer"):
        PromptDataset(ten, apply_chat_template=True)


def test_keys_metadata_and_blank_lines(tmp_path):
    path = _write(
        tmp_path / "d.jsonl", [{"q": "1+1=", "a": "2", "meta": {"id": 7}, "x": 1}, "", {"q": "2+2=", "a": "4", "x": 2}]
    )
    ds = PromptDataset(path, input_key="q", label_key="a", shuffle=False)
    assert len(ds) == 2
    assert (ds[1].prompt, ds[1].text, ds[1].label, ds[1].line, ds[1].index) == ("2+2=", "2+2=", "4", 3, 1)
    assert ds[0].metadata == {"meta": {"id": 7}, "x": 1}
    ds = PromptDataset(path, input_key="q", label_key=None, metadata_key="meta", shuffle=False)
    assert ds[0].metadata == {"id": 7} and ds[1].metadata == {} and ds[0].label is None


# ------------------------------------------------------------- order/resume
def test_order_is_a_function_of_seed_and_epoch(ten):
    a, b = PromptDataset(ten, seed=3), PromptDataset(ten, seed=3)
    assert a.order(0) == b.order(0) and a.order(1) == b.order(1)
    assert sorted(a.order(0)) == list(range(10))
    assert a.order(0) != a.order(1)  # reshuffled each epoch
    assert PromptDataset(ten, seed=4).order(0) != a.order(0)
    assert PromptDataset(ten, shuffle=False).order(5) == list(range(10))


def test_batches_cross_epochs_and_cover_each_epoch(ten):
    ds = PromptDataset(ten, seed=0)
    seen = [r.label for r in ds.next_batch(4) + ds.next_batch(4) + ds.next_batch(4)]
    assert sorted(seen[:10]) == sorted(str(i) for i in range(10))  # epoch 0 complete, no repeats
    assert (ds.epoch, ds.index) == (1, 2)
    assert seen[10:] == [ds[i].label for i in ds.order(1)[:2]]


def test_resume_from_state_continues_exactly(ten):
    uninterrupted = PromptDataset(ten, seed=7)
    expected = [[r.index for r in uninterrupted.next_batch(3)] for _ in range(8)]
    first = PromptDataset(ten, seed=7)
    got = [[r.index for r in first.next_batch(3)] for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint round trip
    resumed = PromptDataset(ten, seed=7)
    resumed.load_state_dict(state)
    got += [[r.index for r in resumed.next_batch(3)] for _ in range(5)]
    assert got == expected


def test_resume_refuses_mismatched_state(ten, tmp_path):
    state = PromptDataset(ten, seed=7).state_dict()
    with pytest.raises(DatasetError, match="seed=7 but this dataset has seed=8"):
        PromptDataset(ten, seed=8).load_state_dict(state)
    short = _write(tmp_path / "short.jsonl", [{"prompt": "a", "label": "b"}] * 3)
    with pytest.raises(DatasetError, match="size=10 but this dataset has size=3"):
        PromptDataset(short, seed=7).load_state_dict(state)
    with pytest.raises(DatasetError, match="out of range"):
        PromptDataset(ten, seed=7).load_state_dict({"epoch": 0, "index": 10})
    with pytest.raises(DatasetError, match="lacks integer 'epoch'"):
        PromptDataset(ten).load_state_dict({"index": 1})


# ------------------------------------------------------------ chat template
def test_chat_template_and_prompt_length_filter(tmp_path):
    pytest.importorskip("transformers")
    from slime.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    path = _write(
        tmp_path / "chat.jsonl",
        [
            {"prompt": "07+12=", "label": "19"},
            {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": "1+1="}], "label": "2"},
            {"prompt": "x" * 200, "label": "long"},
        ],
    )
    ds = PromptDataset(path, tokenizer=tok, apply_chat_template=True, max_prompt_tokens=100, shuffle=False)
    assert len(ds) == 2 and ds.dropped == 1
    assert ds[0].text == "<|im_start|>user\n07+12=<|im_end|>\n<|im_start|>assistant\n"
    assert ds[1].text.startswith("<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\n1+1=")


# --------------------------------------------------------------- arithmetic
def test_arith_split_is_disjoint_complete_and_seeded():
    train, held = split_pairs(seed=0)
    assert (len(train), len(held)) == (2000, 500)
    prompts = [r["prompt"] for r in train + held]
    assert len(set(prompts)) == 2500
    assert split_pairs(seed=0) == (train, held)
    assert split_pairs(seed=1)[1] != held
    assert make_row(7, 12) == {"prompt": "07+12=", "label": "19"}
    for row in train[:50]:
        a, b = row["prompt"][:-1].split("+")
        assert int(a) + int(b) == int(row["label"]) and 0 <= int(a) <= 49 and len(row["prompt"]) == 6


def test_shipped_arith_files_match_the_generator(tmp_path):
    shipped = REPO / "specs" / "data" / "arith"
    train, held = write_dataset(tmp_path, seed=0)
    assert (shipped / "train.jsonl").read_text() == train.read_text()
    assert (shipped / "heldout.jsonl").read_text() == held.read_text()
    ds = PromptDataset(shipped / "heldout.jsonl")
    assert len(ds) == 500


def test_arith_cli(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "slime.data.arith", str(tmp_path / "out"), "--heldout", "100"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert len((tmp_path / "out" / "heldout.jsonl").read_text().splitlines()) == 100
    bad = subprocess.run(
        [sys.executable, "-m", "slime.data.arith", str(tmp_path / "o2"), "--heldout", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "heldout must be between" in bad.stderr
