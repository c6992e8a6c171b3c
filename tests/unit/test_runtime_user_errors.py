"""Failures that are the user's to fix reach them as one clear message and exit 2, not "a bug":
an unwritable or full checkpoint dir, a damaged checkpoint at resume, and which checkpoint a
(re)started run resumes from. The driver is built from a run dir and exercised up to the point each
check runs (before Ray: ``Job.connect`` fails the test if reached). Trainer groups, which need Ray,
are stood in for by objects with the same ``call``/``ranks`` surface."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest
import ray.exceptions as rex
from msgspec.structs import replace

from slime.core.errors import ExitCode
from slime.runtime.checkpoint import STATE_FILE, CheckpointError, CheckpointStore
from slime.runtime.driver import Driver
from slime.runtime.failures import checkpoint_save_error, classify
from slime.runtime.job import Job
from slime.runtime.train_state import ResumePoint, TrainState, restore_checkpoint, save_checkpoint
from slime.spec import load_spec
from tests.fixtures.tiny_models import ONE_LAYER

REPO = Path(__file__).resolve().parents[2]
STATE = {"format": 1, "rollout_id": 0, "step": 1, "weight_version": 2, "world_size": 1, "manager": {"data": {}}}


def save(store: CheckpointStore, rollout_id: int) -> Path:
    """A checkpoint written the way the driver writes one (rank file into the temp dir, then commit)."""
    tmp = store.begin(rollout_id)
    (tmp / "actor-rank0.pt").write_bytes(b"weights" * 100)
    return store.commit(tmp, rollout_id, {**STATE, "rollout_id": rollout_id})


def driver_for(tmp_path: Path, monkeypatch, *, ckpt_dir: Path, load: Path | None = None) -> Driver:
    """A Driver of a run dir holding the quickstart with this checkpoint dir (and ``load``), whose
    setup fails the test if it goes on past the checkpoint checks (towards Ray)."""
    from slime.core.paths import RunPaths

    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    ck = replace(spec.train.checkpoint, dir=str(ckpt_dir), load=str(load) if load else None)
    spec = replace(
        spec,
        train=replace(spec.train, checkpoint=ck),
        logging=replace(spec.logging, wandb=replace(spec.logging.wandb, mode="disabled")),
    )
    tp = RunPaths(tmp_path / "run").task(0)
    tp.dir.mkdir(parents=True)
    tp.resolved.write_text(json.dumps({"task": 0, "spec": msgspec.to_builtins(spec)}))
    monkeypatch.setattr(Job, "connect", lambda self: pytest.fail("setup went on past the checkpoint checks"))
    return Driver(tmp_path / "run", 0)


# ---- an unwritable checkpoint dir is found at setup -----------------------------------------------


def test_a_checkpoint_dir_that_cannot_be_created_fails_at_setup_naming_it(tmp_path, monkeypatch):
    (tmp_path / "afile").write_text("")  # a file as the parent: mkdir fails, for root too
    bad = tmp_path / "afile" / "ckpt"
    with pytest.raises(CheckpointError) as info:
        CheckpointStore(bad).check_writable()
    text = str(info.value)
    assert f"train.checkpoint.dir {bad} is not writable" in text and "Not a directory" in text
    assert classify(info.value) == ExitCode.SPEC
    # the driver checks it before anything else starts (Ray, engines, training)
    with pytest.raises(CheckpointError, match="is not writable"):
        driver_for(tmp_path, monkeypatch, ckpt_dir=bad).setup()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only dir anyway")
def test_a_read_only_checkpoint_dir_fails_at_setup(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="Permission denied"):
            CheckpointStore(ro / "ckpt").check_writable()
    finally:
        ro.chmod(0o700)


def test_the_writable_check_leaves_nothing_behind(tmp_path):
    CheckpointStore(tmp_path / "new" / "ckpt").check_writable()
    assert list((tmp_path / "new" / "ckpt").iterdir()) == []


# ---- an OSError during a save is not a bug ----------------------------------------------------------


def test_an_os_error_while_saving_names_the_checkpoint_dir_and_is_no_bug(tmp_path):
    full = OSError(28, "No space left on device")
    assert classify(full) == ExitCode.BUG  # unmapped, it would be reported as a bug
    for exc in (full, rex.RayTaskError("TrainerRank.save", "remote traceback", full)):
        err = checkpoint_save_error(exc, tmp_path / "ck", 7)
        assert isinstance(err, CheckpointError) and classify(err) == ExitCode.SPEC
        assert f"rollout 7 in {tmp_path / 'ck'} (train.checkpoint.dir)" in str(err)
        assert "No space left on device" in str(err) and "free disk space" in str(err)
    # torch.save in a rank reports a full disk as a RuntimeError
    torch_full = RuntimeError(
        "[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file data/3: file write failed"
    )
    assert "file write failed" in str(checkpoint_save_error(torch_full, tmp_path, 7))
    # infrastructure and real bugs keep their own classification
    assert checkpoint_save_error(ConnectionError("peer gone"), tmp_path, 7) is None
    assert checkpoint_save_error(RuntimeError("bug"), tmp_path, 7) is None


class _Group:
    """Stands in for a TrainerGroup (Ray actors): every rank call raises ``exc``."""

    ranks = [object()]

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def call(self, method: str, *args):
        self.method = method
        raise self.exc


def test_a_save_failure_is_mapped_and_its_temp_dir_removed(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    actor = _Group(rex.RayTaskError("TrainerRank.save", "tb", OSError(28, "No space left on device")))
    with pytest.raises(CheckpointError, match=f"cannot save the checkpoint of rollout 4 in {tmp_path}"):
        save_checkpoint(store, TrainState(rollout_id=4), [actor])
    assert actor.method == "save" and list(tmp_path.iterdir()) == []


# ---- a damaged checkpoint at resume -----------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]"])
def test_a_damaged_state_json_names_the_dir_and_the_usable_ones(tmp_path, monkeypatch, content):
    store = CheckpointStore(tmp_path, keep=3)
    save(store, 1)
    save(store, 2)
    bad = save(store, 3)
    (bad / STATE_FILE).write_text(content)
    assert store.latest() == bad  # not skipped silently: the error below says so
    assert [r for r, _ in store.usable()] == [1, 2]
    with pytest.raises(CheckpointError) as info:
        store.read_state(bad)
    text = str(info.value)
    assert f"cannot resume from checkpoint {bad}: it is damaged" in text and STATE_FILE in text
    assert f"delete or move aside {bad}" in text and f"newest complete one left ({tmp_path / '2'})" in text
    assert classify(info.value) == ExitCode.SPEC
    # the driver reads it at setup, before Ray and the engines start
    with pytest.raises(CheckpointError, match="it is damaged"):
        driver_for(tmp_path / "x", monkeypatch, ckpt_dir=tmp_path).setup()


def test_a_damaged_load_checkpoint_says_to_change_train_checkpoint_load(tmp_path, monkeypatch):
    other = CheckpointStore(tmp_path / "elsewhere", keep=3)
    save(other, 5)
    bad = save(other, 6)
    (bad / STATE_FILE).write_text("")
    with pytest.raises(CheckpointError) as info:
        driver_for(tmp_path, monkeypatch, ckpt_dir=tmp_path / "mine", load=bad).setup()
    text = str(info.value)
    assert "empty" in text and "point train.checkpoint.load at a complete checkpoint" in text
    assert str(tmp_path / "elsewhere" / "5") in text


def test_a_truncated_rank_file_at_resume_names_the_dir_and_what_to_do(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    save(store, 1)
    bad = save(store, 2)
    point = ResumePoint.find(store, None)
    assert point == ResumePoint(bad, {**STATE, "rollout_id": 2}, from_load=False)
    cause = CheckpointError(f"cannot load {bad / 'actor-rank0.pt'}: truncated, corrupted or unreadable")
    state = TrainState()
    with pytest.raises(CheckpointError) as info:
        restore_checkpoint(point, state, [_Group(rex.RayTaskError("TrainerRank.load", "remote traceback", cause))])
    text = str(info.value)
    assert f"cannot resume from checkpoint {bad}: it is damaged (cannot load {bad / 'actor-rank0.pt'}" in text
    assert (
        f"delete or move aside {bad}; the run then resumes from the newest complete one left ({tmp_path / '1'})" in text
    )
    assert state == TrainState()  # nothing restored
    # anything else from the ranks is not relabelled
    with pytest.raises(rex.RayTaskError):
        restore_checkpoint(point, state, [_Group(rex.RayTaskError("TrainerRank.load", "tb", RuntimeError("a bug")))])


# ---- which checkpoint a (re)started run resumes from ------------------------------------------------


def test_a_requeued_run_resumes_from_its_own_newest_checkpoint_not_from_load(tmp_path):
    start = save(CheckpointStore(tmp_path / "pretrained", keep=1), 9)
    store = CheckpointStore(tmp_path / "mine", keep=2)
    assert store.resume_point(None) is None  # fresh
    assert store.resume_point(str(start)) == start  # first start: load is the starting point
    save(store, 3)
    own = save(store, 5)
    assert store.resume_point(str(start)) == own  # requeued: its own progress wins
    assert store.resume_point(None) == own


def test_the_driver_resumes_from_its_own_checkpoint_when_load_is_set(tmp_path, monkeypatch):
    start = save(CheckpointStore(tmp_path / "pretrained", keep=1), 9)
    store = CheckpointStore(tmp_path / "mine", keep=2)
    own = save(store, 5)
    (own / STATE_FILE).write_text(json.dumps({"rollout_id": 5}))  # stops setup right after the choice
    with pytest.raises(CheckpointError, match=f"checkpoint {own}: it is damaged") as info:
        driver_for(tmp_path, monkeypatch, ckpt_dir=tmp_path / "mine", load=start).setup()
    assert "lacks ['manager', 'step', 'weight_version']" in str(info.value)


# ---- the SFT warm-up needs a label on every row ----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tiny_model):
    return tiny_model(seed=0, **ONE_LAYER)


def manager(tmp_path: Path, tokenizer_dir: Path, rows: list[str], *, warmup: int, label_key: str | None = "label"):
    from slime.runtime.rollout_manager import RolloutManager

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(r + "\n" for r in rows))
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    spec = replace(
        spec,
        data=replace(spec.data, prompts=str(prompts), label_key=label_key, eval=()),
        algorithm=replace(spec.algorithm, sft_warmup_steps=warmup),
        reward=replace(spec.reward, type="f1"),
    )
    return RolloutManager(spec, [], str(tokenizer_dir)), prompts


@pytest.mark.parametrize("bad", ['{"prompt": "3+4=", "label": null}', '{"prompt": "3+4=", "label": []}'])
def test_a_row_without_a_label_fails_at_setup_when_the_warmup_needs_labels(tmp_path, tokenizer_dir, bad):
    from slime.data.jsonl import DatasetError

    rows = ['{"prompt": "1+2=", "label": "3"}', bad]
    mgr, prompts = manager(tmp_path, tokenizer_dir, rows, warmup=2)
    with pytest.raises(DatasetError, match=f"{prompts}:2: 'label' is (null|\\[\\]), but algorithm.sft_warmup_steps"):
        mgr.setup()  # at setup: before any warm-up step trains on the text "None"
    # without a warm-up, unlabelled rows are fine (a reward that needs no label may use them)
    manager(tmp_path, tokenizer_dir, rows, warmup=0)[0].setup()


def test_a_warmup_without_a_label_key_fails_at_setup(tmp_path, tokenizer_dir):
    mgr, _ = manager(tmp_path, tokenizer_dir, ['{"prompt": "1+2="}'], warmup=2, label_key=None)
    with pytest.raises(ValueError, match="sft_warmup_steps > 0 needs labels: set data.label_key"):
        mgr.setup()


def test_warmup_samples_are_the_labels(tmp_path, tokenizer_dir):
    rows = ['{"prompt": "1+2=", "label": ["3", "03"]}', '{"prompt": "2+2=", "label": "4"}']
    mgr, _ = manager(tmp_path, tokenizer_dir, rows, warmup=2)
    out = mgr.sft_samples(2)
    answers = sorted(mgr.tokenizer.decode(s["tokens"][-s["response_length"] : -1]) for s in out)
    assert answers == ["3", "4"]
