"""Every flag of slime's own parser (the generated ``slime_flags.json``) is in exactly one class, and the
importer treats it as its class says: mapped onto a field, implied by config.json (and compared with it),
refused (exit 2 unless --drop-unmapped), dropped with a note (speed, memory, logging) or named as removed."""

from __future__ import annotations

import json
from functools import cache

import pytest
from ruamel.yaml import YAML

from slime.cli.main import main
from slime.migrate import gen_slime_flags
from slime.migrate.flag_table import CLASSES, REMOVED, classify, slime_table
from slime.migrate.flagmap import unknown_flag, unknown_megatron_option
from slime.migrate.importer import IMPLIED, convert_slime_args
from slime.migrate.slime_flags import ARCHITECTURE, DIRECT, DROPPABLE, PP_SIZE_FLAGS, REFUSED, SPECIAL, SPECIAL_FIELDS

FLAGS = slime_table()["flags"]

# A value each flag takes in a real script (the table's default where it is a usable literal), and the
# flags a mapped flag needs beside it (slime applies them only together).
SAMPLE = {
    "--rm-type": "math",
    "--loss-type": "policy_loss",
    "--advantage-estimator": "grpo",
    "--kl-loss-type": "k1",
    "--train-backend": "megatron",
    "--update-weight-mode": "full",
    "--update-weight-transport": "nccl",
    "--wandb-mode": "offline",
    "--train-env-vars": '\'{"A": "1"}\'',
    "--eval-prompt-data": "aime /d/aime.jsonl",
    "--custom-rm-path": "pkg.mod.fn",
    "--dynamic-sampling-filter-path": "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
    "--load-debug-rollout-data": "/x/{rollout_id}.pt",
    "--reward-key": "score",
    "--rollout-stop": "STOP",
    "--hf-checkpoint": "/models/m",
    "--rollout-external-engine-addrs": "10.0.0.5:30000 10.0.0.6:30000",
    "--opd-type": "megatron",
}
CONTEXT = {
    "--kl-loss-coef": "--use-kl-loss",
    "--num-critic-only-steps": "--advantage-estimator ppo",
    "--use-opd": "--opd-type megatron --opd-teacher-load /t",
    "--opd-type": "--use-opd --opd-teacher-load /t",
    "--opd-kl-coef": "--use-opd --opd-type megatron --opd-teacher-load /t",
    "--opd-teacher-load": "--use-opd --opd-type megatron",
    "--reward-key": "--custom-rm-path pkg.mod.fn",
    "--log-passrate": "--eval-prompt-data aime /d/aime.jsonl --n-samples-per-eval-prompt 4",
    **dict.fromkeys(
        (
            "--eval-interval",
            "--n-samples-per-eval-prompt",
            "--eval-temperature",
            "--eval-max-response-len",
            "--eval-top-p",
            "--eval-top-k",
        ),
        "--eval-prompt-data aime /d/aime.jsonl",
    ),
}


def _words(flag: str) -> str:
    info = FLAGS.get(flag, {"kind": "switch"})
    if info["kind"] == "switch":
        value = ""
    elif flag in SAMPLE:
        value = SAMPLE[flag]
    else:
        default = info["default"]
        value = "2" if default is None or isinstance(default, bool) or " " in str(default) else str(default)
    return f"{CONTEXT.get(flag, '')} {flag} {value}".strip()


@cache
def _imported(flag: str):
    """One conversion per flag, shared by the tests that walk the table."""
    return convert_slime_args(_words(flag))


def test_the_table_is_slime_s_parser_at_a_recorded_commit():
    table = slime_table()
    assert len(table["slime_commit"]) == 40 and table["sources"] == list(gen_slime_flags.SOURCES)
    assert {"--use-slime-router", "--megatron-to-hf-mode"} <= REMOVED  # removed upstream, found in its history
    assert REMOVED.isdisjoint(FLAGS) and len(FLAGS) > 200


def test_every_slime_flag_is_in_exactly_one_class():
    groups = {
        "direct": set(DIRECT),
        "special": set(SPECIAL) | set(PP_SIZE_FLAGS),
        "architecture": set(ARCHITECTURE),
        "refused": set(REFUSED),
        "droppable": set(DROPPABLE),
        "removed": set(REMOVED),
    }
    names = list(groups)
    for i, a in enumerate(names):  # the tables never overlap, so no flag is in two classes
        for b in names[i + 1 :]:
            assert not groups[a] & groups[b], (a, b, groups[a] & groups[b])
    assert set(SPECIAL_FIELDS) == set(SPECIAL) | set(PP_SIZE_FLAGS)
    classes = {flag: classify(flag)[0] for flag in [*FLAGS, *REMOVED]}
    assert [f for f, c in classes.items() if c not in CLASSES] == []  # 0 unclassified
    counts = {c: sum(1 for v in classes.values() if v == c) for c in CLASSES}
    assert sum(counts.values()) == len(FLAGS) + len(REMOVED) and all(counts.values()), counts


@pytest.mark.parametrize("flag", sorted([*FLAGS, *REMOVED]))
def test_each_flag_is_treated_as_its_class_says(flag):
    """mapped -> result.mapped; implied -> implied; refused/removed -> refused; droppable -> a note only."""
    cls, detail = classify(flag)
    result = _imported(flag)
    mapped, refused, unmapped = dict(result.mapped), dict(result.refused), dict(result.unmapped)
    if cls == "mapped":
        assert flag in mapped and flag not in unmapped, (result.mapped, result.unmapped)
        assert mapped[flag].startswith(detail), (mapped[flag], detail)
    elif cls == "implied":
        assert mapped[flag].startswith(IMPLIED)
    elif cls in ("refused", "removed"):
        assert refused[flag] == detail and not result.accepted() and result.accepted(drop_unmapped=True)
    else:
        assert unmapped[flag] == detail and flag not in refused and result.accepted()


@pytest.mark.parametrize("flag", sorted([*FLAGS, *REMOVED]))
def test_no_flag_lands_in_engine_args_unless_the_engine_has_it(flag):
    result = _imported(flag)
    for _, path in result.mapped:
        if path.startswith("train.megatron.args."):
            assert unknown_megatron_option(path.rsplit(".", 1)[1]) is None, path
        if path.startswith("rollout.sglang.args."):
            assert unknown_flag(path.rsplit(".", 1)[1]) is None, path


@pytest.mark.parametrize("flag", sorted(set(DIRECT) & set(FLAGS)))
def test_each_direct_flag_lands_on_its_field(flag):
    """The test that shows each directly mapped flag: the value the script gives is at the spec path."""
    result = _imported(flag)
    path = dict(result.mapped)[flag]
    node = YAML(typ="safe").load(result.yaml)
    for part in path.split("."):
        node = node[part]
    kind = DIRECT[flag][1]
    given = _words(flag).split()[-1]
    want = {"bool": True, "int": int(given) if kind == "int" else None}.get(kind)
    if kind == "float":
        want = float(given)
    elif kind == "list":
        want = SAMPLE.get(flag, given).split()
    elif kind == "str":
        want = given
    assert node == want, (path, node)


def test_the_generator_reads_add_argument_and_reset_arg_calls():
    source = """
def add_things(parser):
    parser.add_argument("--alpha", type=int, default=3)
    parser.add_argument("--beta", action="store_true")
    parser.add_argument("--gamma", nargs="+", default=None)
    reset_arg(parser, "--lr", type=float, default=1e-6)
    parser.add_argument(name_from_a_variable, type=int)
"""
    flags = gen_slime_flags.flags_in(source, "x.py")
    assert flags["--alpha"] == {
        "source": "x.py",
        "group": "add_things",
        "kind": "value",
        "default": 3,
        "via": "add_argument",
    }
    assert flags["--beta"]["kind"] == "switch" and flags["--gamma"]["kind"] == "values"
    assert flags["--lr"]["via"] == "reset_arg" and flags["--lr"]["default"] == 1e-6
    assert set(flags) == {"--alpha", "--beta", "--gamma", "--lr"}


def test_the_table_on_disk_is_json_the_generator_wrote():
    table = json.loads(gen_slime_flags.OUT.read_text())
    assert set(table) == {"slime_commit", "sources", "flags", "removed"}
    assert all(set(v) == {"last_seen"} for v in table["removed"].values())


def test_cli_refuses_a_flag_that_changes_what_is_trained_unless_dropped(tmp_path, capsys):
    """An OPD script whose teacher comes from a server the job does not start: exit 2 naming the mode;
    --drop-unmapped writes the spec without it."""
    script = tmp_path / "opd.sh"
    script.write_text("--hf-checkpoint /m --use-opd --opd-type sglang --colocate\n")
    out = tmp_path / "job.yaml"
    assert main(["import-slime-args", str(script), "-o", str(out)]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "refused: --use-opd (slime's sglang OPD type scores with a teacher SGLang server" in err
    assert "--drop-unmapped" in err
    assert main(["import-slime-args", str(script), "-o", str(out), "--drop-unmapped"]) == 0 and out.exists()


def test_the_reference_page_lists_every_flag_with_its_class():
    from slime.migrate.flag_table import reference_markdown

    page = reference_markdown()
    for flag in [*FLAGS, *REMOVED]:
        cls, _ = classify(flag)
        assert f"| `{flag}` | {cls} |" in page
    assert f"| mapped | {sum(1 for f in FLAGS if classify(f)[0] == 'mapped')} |" in page
