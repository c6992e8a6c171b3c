"""import-slime-args reproduces the maths slime trains with, or says loudly where it cannot.

Each case here is a place where slime's default (flag absent) or a slime flag means something
different from slime/v2's default: the imported spec must say what slime computes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slime.migrate.importer import convert_slime_args
from slime.rl.losses import policy_loss
from slime.spec import load_spec_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slime_scripts"
BASE = "--hf-checkpoint /m --prompt-data /p.jsonl --num-rollout 3 --colocate --rm-type math "


def reward_of(flags: str):
    result = convert_slime_args(BASE.replace("--rm-type math ", "") + flags)
    return result, spec_of(result).reward.type


def spec_of(result):
    return load_spec_text(result.yaml, file="imported.yaml").spec


def yaml_line(result, key_text: str) -> str:
    return next(ln for ln in result.yaml.splitlines() if ln.strip().startswith(key_text))


# ----------------------------------------------------------------------------- loss aggregation
def test_slime_default_averages_per_sample():
    result = convert_slime_args(BASE)
    assert spec_of(result).algorithm.loss_agg == "seq_mean_token_mean"
    assert "unless --calculate-per-token-loss (flag absent)" in yaml_line(result, "loss_agg:")


def test_calculate_per_token_loss_is_a_global_token_mean():
    result = convert_slime_args(BASE + "--calculate-per-token-loss")
    assert spec_of(result).algorithm.loss_agg == "token_mean"
    assert "--calculate-per-token-loss (line 1)" in yaml_line(result, "loss_agg:")
    assert ("--calculate-per-token-loss", "algorithm.loss_agg") in result.mapped


def test_seq_mean_token_mean_is_what_slime_computes_by_default():
    """slime's default reducer (loss.py, notes section 6): sum over samples of each sample's masked token
    mean, divided by the step's sample count. Hand-computed on two samples of 2 and 3 trained tokens."""
    # per-token losses -A*r with r = 1 (logp == old): -A. Sample 0: A = 1 on 2 tokens; sample 1: A = -2 on 3.
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logp = torch.zeros(2, 3)
    # slime: (mean(-1, -1) + mean(2, 2, 2)) / 2 samples = (-1 + 2) / 2 = 0.5
    loss, _ = policy_loss(logp, logp, adv, mask, agg="seq_mean_token_mean")
    assert loss.item() == pytest.approx(0.5)
    # --calculate-per-token-loss: (-1 - 1 + 2 + 2 + 2) / 5 tokens = 0.8
    loss, _ = policy_loss(logp, logp, adv, mask, agg="token_mean")
    assert loss.item() == pytest.approx(0.8)


# ----------------------------------------------------------------------------- KL
def test_kl_loss_type_default_is_slimes_k1_not_ours():
    result = convert_slime_args(BASE + "--use-kl-loss --kl-loss-coef 0.01 --ref-load /ref")
    s = spec_of(result)
    assert (s.algorithm.kl_loss_type, s.algorithm.kl_loss_coef) == ("k1", 0.01)
    assert "slime's --kl-loss-type default (flag absent)" in yaml_line(result, "kl_loss_type:")


def test_kl_loss_type_given_is_kept():
    result = convert_slime_args(BASE + "--use-kl-loss --kl-loss-coef 0.01 --kl-loss-type low_var_kl --ref-load /r")
    assert spec_of(result).algorithm.kl_loss_type == "low_var_kl"


def test_reward_kl_with_another_estimator_is_said_to_differ():
    """slime estimates the reward KL (--kl-coef) with --kl-loss-type too; slime/v2 uses k1 there."""
    flags = BASE.replace("--colocate", "--colocate --advantage-estimator ppo") + "--kl-coef 0.05 --ref-load /r "
    assert "--kl-loss-type" not in str(convert_slime_args(flags).differences)  # k1 (slime's default): the same
    result = convert_slime_args(flags + "--kl-loss-type k3")
    assert dict(result.differences)["--kl-loss-type k3"] == (
        "slime also estimates the KL folded into the reward (--kl-coef) with k3; slime/v2 estimates that "
        "one with k1 (algorithm.kl_loss_type applies to the KL loss only), so the reward penalty differs"
    )

    assert "Differs from slime" in result.yaml


# ----------------------------------------------------------------------------- reward types
@pytest.mark.parametrize("kind", ["dapo", "deepscaler"])
def test_dapo_and_deepscaler_keep_their_own_grader(kind):
    result, reward = reward_of(f"--rm-type {kind} --reward-key score")
    assert reward == kind
    assert ("--rm-type", "reward.type") in result.mapped


def test_dapo_needs_slimes_score_key():
    result, _ = reward_of("--rm-type dapo --reward-key score")
    assert ("--reward-key", "reward.type dapo (its +1/-1 score)") in result.mapped
    assert "--rm-type dapo" not in dict(result.differences)
    result, _ = reward_of("--rm-type dapo --reward-key acc")
    assert dict(result.unmapped)["--reward-key"] == (
        "slime would reward dapo's 'acc'; slime/v2's dapo reward is its score (+1/-1)"
    )
    result, _ = reward_of("--rm-type dapo")
    assert dict(result.differences)["--rm-type dapo"].startswith("slime needs --reward-key score with it")


@pytest.mark.parametrize(
    "kind, reward, differs",
    [
        ("math", "math", "slime's math scores 0 without a \\boxed{} answer"),
        ("deepscaler", "deepscaler", "the </think> and \\boxed{} rules are slime's, but answers are graded"),
        ("f1", "f1", None),
        ("boxed_f1", "f1", "slime's boxed_f1 scores only the last \\boxed{} content of the response"),
        ("remote_rm --rm-url http://rm:1/s", "remote", None),
        ("boxed_remote_rm --rm-url http://rm:1/s", "remote", None),
    ],
)
def test_grader_differences_are_written_out(kind, reward, differs):
    result, got = reward_of(f"--rm-type {kind}")
    assert got == reward
    flag = f"--rm-type {kind.split()[0]}"
    if differs is None:
        assert flag not in dict(result.differences)
    else:
        assert dict(result.differences)[flag].startswith(differs)
        assert "scored differently: see 'Differs from slime' below" in yaml_line(result, "type:")
        assert f"#   {flag}: {differs}" in result.yaml


@pytest.mark.parametrize("kind", ["boxed_math", "boxed_deepscaler", "boxed_dapo"])
def test_boxed_graders_without_an_equivalent_are_not_mapped(kind):
    result, reward = reward_of(f"--rm-type {kind}")
    assert reward == "exact" and "reward.type" in dict(result.placeholders)
    assert dict(result.unmapped)["--rm-type"] == (
        f"slime's '{kind}' grades only the \\boxed{{}} content of the response (boxed_math and "
        "boxed_deepscaler then almost never score); slime/v2 has no such variant: port it as reward.type: custom"
    )


# ----------------------------------------------------------------------------- a command that ends early
EARLY_END = """\
#!/bin/bash
PERF_ARGS=(
   --tensor-model-parallel-size 2
)
python3 train.py \\
   --hf-checkpoint /m \\
   --prompt-data /p.jsonl \\
   --num-rollout 3 --colocate --rm-type dapo --reward-key score
   --rollout-batch-size 64 \\
   --n-samples-per-prompt 4
   ${PERF_ARGS[@]}
echo done
"""


def test_a_line_after_the_command_that_looks_like_a_continuation_is_named():
    """Line 8 lacks its trailing backslash: bash ends the command there and runs lines 9-10 and 11 as
    commands of their own, so slime never sees those flags. The import keeps them out and says so."""
    result = convert_slime_args(EARLY_END)
    s = spec_of(result)
    assert (s.rollout.batch_size, s.rollout.n_samples_per_prompt, s.train.parallel.tensor) == (16, 1, 1)
    unmapped = dict(result.unmapped)
    assert unmapped["line 9: --rollout-batch-size 64 --n-samples-per-prompt 4"] == (
        "not part of the train.py command, which ends on line 8 (no trailing '\\'): bash runs this line as a "
        "command of its own and slime never sees these flags; if they are meant for train.py, end line 8 with '\\'"
    )
    assert "line 11: --tensor-model-parallel-size 2" in unmapped
    assert "#   line 9: --rollout-batch-size 64" in result.yaml


def test_a_well_continued_command_gets_no_such_warning():
    text = EARLY_END.replace("score\n", "score \\\n").replace("prompt 4\n", "prompt 4 \\\n")
    result = convert_slime_args(text)
    assert not any(flag.startswith("line ") for flag, _ in result.unmapped)
    s = spec_of(result)
    assert (s.rollout.batch_size, s.rollout.n_samples_per_prompt, s.train.parallel.tensor) == (64, 4, 2)


# ----------------------------------------------------------------------------- length limits
def test_slime_filters_no_prompt_unless_told():
    result = convert_slime_args(BASE + "--rollout-max-response-len 64")
    assert dict(result.differences)["--rollout-max-prompt-len (absent)"].startswith("slime keeps every prompt")
    result = convert_slime_args(BASE + "--rollout-max-response-len 64 --rollout-max-context-len 4096")
    assert spec_of(result).rollout.max_prompt_len == 4096 - 64
    assert "(absent)" not in str(result.differences)
    assert "slime filters no prompt (flag absent): the longest that leaves" in yaml_line(result, "max_prompt_len:")
    result = convert_slime_args(BASE + "--rollout-max-prompt-len 100 --rollout-max-response-len 64")
    assert spec_of(result).rollout.max_prompt_len == 100 and "(absent)" not in str(result.differences)


def test_slime_caps_no_response_unless_told():
    result = convert_slime_args(BASE + "--rollout-max-prompt-len 100")
    assert dict(result.differences)["--rollout-max-response-len (absent)"] == (
        "slime sends no max_new_tokens (the engine's default applies); slime/v2 stops responses at "
        "rollout.max_response_len (1024 unless set)"
    )


def test_slimes_own_kimi_script_ends_early_and_is_said_to():
    """Found importing THUDM/slime's scripts: run-kimi-k2-Instruct.sh lacks a backslash (fixture: an excerpt)."""
    path = FIXTURES / "run-kimi-k2-instruct-excerpt.sh"
    result = convert_slime_args(path.read_text())
    early = {f: why for f, why in result.unmapped if f.startswith("line ")}
    assert list(early) == [
        "line 31: ${MODEL_ARGS[@]} --hf-checkpoint $BASE_DIR/Kimi-K2-Instruct/ --save-interval 20 ... (12 more words)"
    ]
    assert "which ends on line 30 (no trailing '\\')" in early[next(iter(early))]
    assert "model.path" in dict(result.placeholders)  # what bash would run has no --hf-checkpoint
    fixed = path.read_text().replace("1024 * 1024))\n", "1024 * 1024)) \\\n")
    s = spec_of(convert_slime_args(fixed))
    assert s.model.path.endswith("$BASE_DIR/Kimi-K2-Instruct")  # (relative: resolved against the spec's dir)
    assert (s.rollout.batch_size, s.train.num_steps_per_rollout) == (128, 4)
