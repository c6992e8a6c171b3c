"""``slime.migrate.sft.sft_import``: slime's SFT launch flags (as its ``scripts/run-*-sft.sh`` pass them) become
a ``kind: SFTJob`` spec that validates, and a half-SFT or differently averaged loss is refused naming the flag.

The flag lists are written here (after the flags of slime's SFT scripts, not copied from them); the
spec is composed the way ``import-slime-args`` will once the lead wires the call in: the generic import,
then ``sections`` set and ``unset`` dropped.
"""

from __future__ import annotations

import io

import pytest
from ruamel.yaml import YAML

from slime.migrate.bashargs import read_script
from slime.migrate.flagmap import parse_flags
from slime.migrate.importer import convert_slime_args
from slime.migrate.sft import SFT_ROLLOUT, SftImportError, sft_import
from slime.spec import load_spec_text

SCRIPT = f"""python3 train_async.py \\
   --actor-num-nodes 1 --actor-num-gpus-per-node 4 --rollout-num-gpus 4 \\
   --hf-checkpoint /models/base \\
   --rollout-function-path {SFT_ROLLOUT} \\
   --prompt-data /data/chats.parquet --input-key messages --rollout-shuffle \\
   --num-epoch 3 --rollout-batch-size 128 --global-batch-size 128 \\
   --loss-type sft_loss --loss-mask-type qwen3 --calculate-per-token-loss \\
   --disable-compute-advantages-and-returns --debug-train-only \\
   --val-data /data/val.jsonl --val-interval 10 \\
   --lr 1e-5 --lr-decay-style cosine --min-lr 1e-6
"""


def _flags(text: str):
    script = read_script(text)
    return parse_flags(script.words)[0], script.entry


def _compose(text: str, name: str = "sft-import") -> str:
    """The generic import with the SFT sections applied (the call site the lead adds to the importer)."""
    flags, entry = _flags(text)
    got = sft_import(flags, entry=entry)
    yaml = YAML()
    doc = yaml.load(convert_slime_args(text, name).yaml)
    for path in got.unset:
        *parents, leaf = path.split(".")
        node = doc
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
    for path, value in got.sections.items():
        *parents, leaf = path.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()


def test_an_sft_script_imports_to_a_valid_sft_job():
    flags, entry = _flags(SCRIPT)
    got = sft_import(flags, entry=entry)
    assert got is not None
    assert got.sections["kind"] == "SFTJob" and got.sections["rollout.epochs"] == 3
    assert got.sections["data.input_key"] == "messages" and got.sections["data.apply_chat_template"] is True
    assert got.sections["train.async"] is False
    assert got.sections["data.eval"] == [{"name": "val", "path": "/data/val.jsonl", "interval": 10}]
    assert set(got.consumed) == {
        "--rollout-function-path",
        "--loss-type",
        "--calculate-per-token-loss",
        "--disable-compute-advantages-and-returns",
        "--debug-train-only",
        "--loss-mask-type",
        "--input-key",
        "--num-epoch",
        "--val-data",
        "--val-interval",
    }
    notes = dict(got.notes)
    assert "engines start only to serve data.eval" in notes["--debug-train-only"]
    spec = load_spec_text(_compose(SCRIPT), file="imported.yaml").spec
    assert spec.kind == "SFTJob" and spec.rollout.epochs == 3 and spec.data.eval[0].name == "val"
    assert spec.algorithm.sft_warmup_steps == 0 and spec.reward.type == "exact" and not spec.train.async_


def test_flags_of_an_rl_script_are_not_an_sft_job():
    flags, entry = _flags("python3 train.py --rollout-batch-size 8 --loss-type policy_loss")
    assert sft_import(flags, entry=entry) is None


@pytest.mark.parametrize(
    ("drop", "add", "flag", "words"),
    [
        ("--loss-type sft_loss", "", "--loss-type", ["makes samples without rewards", "policy_loss"]),
        (f"--rollout-function-path {SFT_ROLLOUT}", "", "--rollout-function-path", ["generated rollouts"]),
        ("--calculate-per-token-loss", "", "--calculate-per-token-loss", ["each sample's token mean", "add"]),
        ("", "--n-samples-per-prompt 4", "--n-samples-per-prompt", ["once per epoch"]),
        ("", "--val-input-key text", "--val-input-key", ["differs from --input-key 'messages'"]),
    ],
)
def test_an_sft_script_the_job_would_train_differently_is_refused_naming_the_flag(drop, add, flag, words):
    text = SCRIPT.replace(drop, "") if drop else SCRIPT
    text = text.replace("--lr 1e-5", f"{add} --lr 1e-5")
    flags, entry = _flags(text)
    with pytest.raises(SftImportError) as err:
        sft_import(flags, entry=entry)
    assert err.value.flag == flag and str(err.value).startswith(f"{flag}: ")
    for w in words:
        assert w in str(err.value)
