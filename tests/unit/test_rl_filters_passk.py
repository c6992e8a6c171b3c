"""Group filters (``slime.rl.filters``) and pass@k (``slime.rl.passk``) against hand-computed values."""

from __future__ import annotations

import sys
import textwrap
from math import comb
from types import SimpleNamespace

import pytest

from slime.rl.filters import FILTERS, FilterError, Verdict, load_filter, nonzero_std
from slime.rl.passk import mean_pass_at_k, pass_at_k
from slime.rl.plugins import FilterResult
from slime.rl.sample import Sample
from slime.spec.types import BUILTIN_FILTERS


def group(*rewards):
    return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]


# ------------------------------------------------------------------ pass@k
@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 1, 1, 0.25),  # k = 1: the fraction correct
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 3, 2, 1.0),  # n - c = 1 < k: any 2 of them include a right one
        (8, 2, 4, 11 / 14),  # 1 - C(6,4)/C(8,4) = 1 - 15/70
        (5, 1, 5, 1.0),
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_form_everywhere():
    for n in range(1, 17):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_mean_pass_at_k_and_bad_arguments():
    # two prompts of 4 samples: 1 right and 0 right -> pass@2 = (0.5 + 0) / 2
    assert mean_pass_at_k([(4, 1), (4, 0)], 2) == pytest.approx(0.25)
    assert mean_pass_at_k([], 1) == 0.0
    with pytest.raises(ValueError, match="pass@5 needs 1 <= k <= n samples \\(n = 4\\)"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="5 correct samples out of 4"):
        pass_at_k(4, 5, 1)


# ------------------------------------------------------------------ filters
def test_the_builtin_filters_are_the_ones_the_spec_accepts():
    assert set(FILTERS.names()) == set(BUILTIN_FILTERS)


def test_nonzero_std_keeps_mixed_groups_and_names_flat_ones_by_reward():
    assert nonzero_std(group(1.0, 0.0, 0.0)) == FilterResult(True)
    assert nonzero_std(group(1.0, 1.0, 1.0)) == FilterResult(False, "zero_std_1.0")
    assert nonzero_std(group(0.0, 0.0)) == FilterResult(False, "zero_std_0.0")
    assert nonzero_std(group(-1.0, -1.0)).reason == "zero_std_-1.0"  # dapo's -1: all wrong
    assert not nonzero_std(group(0.5, 0.5 + 1e-9)).keep  # std below 1e-6 counts as flat
    assert load_filter("nonzero_std")(group(1.0, 0.0)) == Verdict(True)
    fallback = load_filter("nonzero_std_with_fallback")
    assert fallback(group(1.0, 1.0)) == Verdict(False, "zero_std_1.0", True) and fallback(group(0.0, 1.0)).keep


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "my_filters.py").write_text(
        textwrap.dedent(
            """
            from types import SimpleNamespace

            def long_enough(samples):
                return all(s.response_length >= 2 for s in samples)

            def with_reason(samples):
                return (samples[0].reward > 0, "first_wrong")

            def slime_style(args, samples):
                keep = len(samples) == args.n_samples_per_prompt
                return SimpleNamespace(keep=keep, reason="short_group", keep_when_insufficient=True)

            def broken(samples):
                raise KeyError("reward")

            def weird(samples):
                return 3

            async def too_async(samples):
                return True

            def no_args():
                return True
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_filters", None)


def test_user_filters_in_both_conventions_and_every_verdict_shape(plugin_module):
    samples = [Sample(index=0, reward=1.0, response_length=3), Sample(index=1, reward=0.0, response_length=1)]
    assert load_filter("my_filters:long_enough")(samples) == Verdict(False, "rejected")
    assert load_filter("my_filters:with_reason")(samples) == Verdict(True, "first_wrong")
    slime = load_filter("my_filters:slime_style", args=SimpleNamespace(n_samples_per_prompt=2))
    assert slime(samples) == Verdict(True, "short_group", True)
    assert slime(samples[:1]) == Verdict(False, "short_group", True)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my_filters:broken", "group filter 'my_filters:broken' raised KeyError: 'reward'"),
        ("my_filters:weird", "group filter 'my_filters:weird' returned 3; return a bool"),
    ],
)
def test_a_failing_filter_is_the_users_error_named(plugin_module, name, message):
    with pytest.raises(FilterError, match=message.replace("(", "\\(")):
        load_filter(name)(group(1.0, 0.0))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("my_filters:too_async", "must be a plain function, not async"),
        ("my_filters:no_args", "takes neither \\(samples\\) nor slime's \\(args, samples\\)"),
    ],
)
def test_a_filter_of_the_wrong_shape_is_refused_at_load(plugin_module, name, message):
    with pytest.raises(FilterError, match=message):
        load_filter(name)
    assert issubclass(FilterError, ValueError)  # exit 2: the user's code
