"""Reward plug-ins written for THUDM/slime (``async def f(args, sample)``) run unchanged from a spec.

The plug-in files are real modules on ``sys.path``, written the way slime's own are (its
docs/en/get_started/customization.md section 3 and examples/retool/generate_with_retool.py:
``async def reward_func(args, sample, **kwargs)`` returning a number or a dict picked by
``--reward-key``). Nothing is faked: the spec is loaded from YAML and resolved, and the reward
function comes from ``reward_from_spec`` as the runtime builds it.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from slime.core.registry import UnknownPlugin
from slime.migrate.importer import convert_slime_args
from slime.migrate.slime_args import slime_args
from slime.rl.rewards import reward_from_spec
from slime.rl.rewards.custom import RewardFunctionError, RewardValueError
from slime.rl.sample import Sample
from slime.spec import SpecError, load_spec_text
from tests.fixtures.tiny_models import ONE_LAYER

PLUGIN = '''
import re


async def reward_func(args, sample, **kwargs):
    """+1/-1 on the boxed answer, -0.5 more for an over-long answer when sampling groups (slime style)."""
    match = re.search(r"\\\\boxed\\{(.*?)\\}", sample.response)
    pred = match.group(1) if match else ""
    score = 1.0 if pred == str(sample.label) else -1.0
    if args.n_samples_per_prompt > 1 and len(sample.response) > args.rollout_max_response_len:
        score -= 0.5
    return {"score": score, "acc": score > 0, "pred": pred}


async def reads_an_unknown_option(args, sample):
    return 1.0 if args.use_opsm else 0.0


def sync_style(args, sample):
    return float(args.custom_rm_path == "slime_style_rewards.sync_style" and args.rm_type is None)
'''


@pytest.fixture()
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "slime_style_rewards.py").write_text(PLUGIN)
    (tmp_path / "slime_imports.py").write_text(
        "from slime.utils.types import Sample\n\nasync def reward_func(args, sample):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("slime_style_rewards", "slime_imports"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def spec(reward: str, tmp_path: Path):
    text = textwrap.dedent(
        f"""\
        apiVersion: slime/v2
        kind: RLJob
        name: plug
        model: {{builtin: tiny}}
        data: {{prompts: p.jsonl}}
        rollout: {{num_rollouts: 1, max_prompt_len: 32, max_response_len: 20, n_samples_per_prompt: 4}}
        reward: {reward}
        """
    )
    (tmp_path / "s.yaml").write_text(text)
    return load_spec_text(text, file=str(tmp_path / "s.yaml")).spec


def run(fn, response: str, label: object = "7") -> float:
    return asyncio.run(fn(Sample(response=response, label=label)))


def test_a_slime_style_reward_gets_slime_named_args_and_its_dict_is_read_by_key(plugin_dir):
    fn = reward_from_spec(spec("{type: custom, custom: 'slime_style_rewards:reward_func', key: score}", plugin_dir))
    assert run(fn, "so \\boxed{7}") == 1.0
    assert run(fn, "so \\boxed{8}") == -1.0
    # longer than args.rollout_max_response_len (20) with args.n_samples_per_prompt (4) > 1: -0.5 more
    assert run(fn, "a long way round to \\boxed{7}") == 0.5


def test_the_args_hold_the_spec_under_slimes_names(plugin_dir):
    s = spec("{type: custom, custom: 'slime_style_rewards:sync_style'}", plugin_dir)
    args = slime_args(s)
    assert (args["n_samples_per_prompt"], args["rollout_max_response_len"], args["rollout_batch_size"]) == (4, 20, 16)
    assert (args["custom_rm_path"], args["rm_type"], args["lambd"]) == ("slime_style_rewards.sync_style", None, 1.0)
    assert args["rollout_stop"] == [] and args["use_kl_loss"] is False
    assert (args["use_tis"], args["tis_clip"], args["use_tensorboard"]) == (False, 2.0, False)  # the new fields
    assert run(reward_from_spec(s), "anything") == 1.0  # a plain function in slime's convention works too


def test_a_dict_without_reward_key_is_a_clear_error(plugin_dir):
    fn = reward_from_spec(spec("{type: custom, custom: 'slime_style_rewards:reward_func'}", plugin_dir))
    with pytest.raises(RewardValueError) as info:
        run(fn, "\\boxed{7}")
    assert str(info.value) == (
        "reward function 'slime_style_rewards:reward_func' returned a dict (score, acc, pred); set reward.key "
        "to the entry holding the reward (slime's --reward-key)"
    )
    fn = reward_from_spec(spec("{type: custom, custom: 'slime_style_rewards:reward_func', key: reward}", plugin_dir))
    with pytest.raises(RewardValueError, match=r"returned a dict without reward.key 'reward' \(it has: score, acc"):
        run(fn, "\\boxed{7}")


def test_a_slime_option_with_no_v1_field_is_named(plugin_dir):
    fn = reward_from_spec(spec("{type: custom, custom: 'slime_style_rewards:reads_an_unknown_option'}", plugin_dir))
    with pytest.raises(RewardFunctionError) as info:
        run(fn, "x")
    assert "raised AttributeError: args.use_opsm: slime's option 'use_opsm' has no slime/v2 field" in str(info.value)
    assert "slime_style_rewards.py:16 in reads_an_unknown_option" in str(info.value)


def test_a_plugin_importing_slimes_own_modules_is_told_what_to_import(plugin_dir):
    with pytest.raises(UnknownPlugin) as info:
        reward_from_spec(spec("{type: custom, custom: 'slime_imports:reward_func'}", plugin_dir))
    assert str(info.value).endswith(
        "the module imports THUDM/slime's own 'slime.utils', which slime-submit does not have; "
        "import Sample from slime.rl.sample instead (or drop the import)"
    )


def test_reward_key_is_refused_for_a_reward_that_returns_numbers(tmp_path):
    with pytest.raises(SpecError) as info:
        spec("{type: math, key: score}", tmp_path)
    assert "reward.key: reward.key picks the reward out of a dict, but the 'math' reward returns a number" in str(
        info.value
    )


def test_import_maps_the_plugin_and_its_reward_key():
    result = convert_slime_args(
        "--hf-checkpoint /m --prompt-data /p --num-rollout 2 --colocate "
        "--custom-rm-path examples.retool.generate_with_retool.reward_func --reward-key score"
    )
    s = load_spec_text(result.yaml, file="i.yaml").spec
    assert (s.reward.type, s.reward.custom, s.reward.key) == (
        "custom",
        "examples.retool.generate_with_retool:reward_func",
        "score",
    )
    assert ("--reward-key", "reward.key") in result.mapped


def test_the_rollout_manager_scores_with_a_slime_style_plugin(plugin_dir, tmp_path, tiny_model):
    """The runtime path: the rollout manager's reward function is the slime-style plug-in, args included."""
    from msgspec.structs import replace

    from slime.runtime.rollout_manager import RolloutManager

    model = tiny_model(seed=0, **ONE_LAYER)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+2=", "label": "3"}\n')
    s = spec("{type: custom, custom: 'slime_style_rewards:reward_func', key: score}", tmp_path)
    s = replace(s, data=replace(s.data, prompts=str(tmp_path / "p.jsonl")))
    mgr = RolloutManager(s, [], str(model))
    mgr.setup()
    assert run(mgr.reward_fn, "\\boxed{3}", "3") == 1.0
    assert run(mgr.reward_fn, "it is \\boxed{3} after a long detour", "3") == 0.5  # args were the spec's
