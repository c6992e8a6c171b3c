"""Built-in rewards, custom loading (real imported modules), the factory and batch scoring."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from slime.core.registry import UnknownPlugin
from slime.rl.plugins import PluginContractError
from slime.rl.rewards import (
    BUILTIN_REWARDS,
    ENTRY_POINT_GROUP,
    REWARDS,
    batch_rewards,
    make_reward_fn,
    reward_registry,
)
from slime.rl.rewards.custom import RewardValueError
from slime.rl.rewards.extract import extract_boxed, extract_last_number, final_answer
from slime.rl.rewards.math_answer import math_equal, normalize_math
from slime.rl.rewards.string_match import f1_score
from slime.rl.sample import Sample


def score(kind: str, response: str, label: object) -> float:
    fn = make_reward_fn(kind)
    return asyncio.run(fn(Sample(response=response, label=label)))


# ---- extraction ---------------------------------------------------------------------------------


def test_boxed_extraction_handles_nesting_and_takes_the_last() -> None:
    assert extract_boxed(r"so $\boxed{\frac{1}{\sqrt{2}}}$.") == r"\frac{1}{\sqrt{2}}"
    assert extract_boxed(r"first \boxed{3}, then \boxed{ {a}+{b} }") == "{a}+{b}"
    assert extract_boxed(r"\fbox{7} then \boxed{8}") == "8"
    assert extract_boxed(r"\boxed{8} then \fbox{7}") == "7"
    assert extract_boxed(r"answer \boxed 5 done") == "5"
    assert extract_boxed(r"truncated \boxed{\frac{1}{2}") is None
    assert extract_boxed("no box here") is None


def test_last_number_and_final_answer() -> None:
    assert extract_last_number("pay $1,234.50 then 3/4 of -2 ok") == "-2"
    assert extract_last_number("ratio 3/4.") == "3/4"
    assert extract_last_number("none") is None
    assert final_answer("work... #### 42") == "42"
    assert final_answer("So the answer is: Paris\nThanks") == "Paris"
    assert final_answer(r"Answer: 3 but \boxed{4}") == "4"
    assert final_answer("  just this  ") == "just this"


# ---- math ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        (r"\frac{1}{2}", "0.5"),
        (r"\dfrac{1}{2}", "1/2"),
        (r"\frac12", "1/2"),
        ("2.0", "2"),
        ("2.50", "5/2"),
        ("1,000", "1000"),
        ("$1,000$", "1000"),
        (r"1{,}000", "1000"),
        ("x = 5", "5"),
        (r"50\%", "50"),
        (r"90^\circ", "90"),
        (r"\text{(B)}", "(B)"),
        (r"-\frac{3}{4}", "-0.75"),
        (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"),
        (".5", "0.5"),
        (r"\left( 1, 2 \right)", "(1,2)"),
    ],
)
def test_math_equal_after_normalisation(pred: str, gold: str) -> None:
    assert math_equal(pred, gold), (normalize_math(pred), normalize_math(gold))


@pytest.mark.parametrize(("pred", "gold"), [("3", "4"), ("1/3", "0.333"), ("(1,2)", "(2,1)"), ("", "")])
def test_math_unequal(pred: str, gold: str) -> None:
    assert not math_equal(pred, gold)


def test_math_reward_boxed_fallback_and_labels() -> None:
    assert score("math", r"We get \boxed{\frac{3}{6}} hmm, i.e. \boxed{\frac{1}{2}}", "0.5") == 1.0
    assert score("math", r"\boxed{2} then later \boxed{3}", "2") == 0.0  # the last box counts
    assert score("math", "so it costs 1,250 dollars", 1250) == 1.0  # last number; int label
    assert score("math", "no numbers at all", "3") == 0.0
    assert score("math", r"\boxed{7}", ["6", "7"]) == 1.0  # any of several answers
    with pytest.raises(ValueError, match="'math' reward needs sample.label"):
        score("math", r"\boxed{7}", None)


# ---- exact and f1 -------------------------------------------------------------------------------


def test_exact_reward() -> None:
    assert score("exact", "The answer is Paris.", "paris") == 1.0
    assert score("exact", "reasoning... #### 42", "42") == 1.0
    assert score("exact", r"it is \boxed{New  York}", "new york") == 1.0
    assert score("exact", "Paris, France", "Paris") == 0.0


def test_f1_squad_style() -> None:
    # "the cat sat" -> [cat, sat]; "a cat sat down" -> [cat, sat, down]
    # overlap 2: precision 2/2, recall 2/3 -> F1 = 2 * 1 * (2/3) / (1 + 2/3) = 0.8
    assert f1_score("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert f1_score("Cat, sat!", "cat sat") == 1.0  # punctuation and case ignored
    assert f1_score("dog", "cat") == 0.0
    assert f1_score("the", "a") == 0.0  # both empty after normalisation: nothing shared (slime's rule)
    assert score("f1", "the Eiffel Tower", ["Eiffel tower", "Paris"]) == 1.0
    # "big red dog" vs "red dog": overlap 2, P 2/3, R 1 -> 0.8
    assert score("f1", "big red dog", "red dog") == pytest.approx(0.8)


# ---- custom -------------------------------------------------------------------------------------


@pytest.fixture()
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real module on sys.path, imported by dotted path as a user's would be."""
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            import threading

            CALLS = []

            def by_length(sample):
                CALLS.append(threading.get_ident())
                return len(sample.response) / 10

            async def is_yes(sample):
                await asyncio.sleep(0)
                return sample.response.strip() == "yes"

            def words(sample):
                return "high"

            def two(args, sample):
                return 1.0

            def three(a, b, c):
                return 1.0

            NOT_A_FUNCTION = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_mod"


def test_custom_sync_and_async(user_module: str) -> None:
    import my_rewards_mod  # type: ignore[import-not-found]

    sync_fn = make_reward_fn("custom", custom=f"{user_module}:by_length")
    assert asyncio.run(sync_fn(Sample(response="abcd"))) == pytest.approx(0.4)
    # documented: a sync scorer runs in a worker thread, not on the event loop's thread
    assert my_rewards_mod.CALLS and my_rewards_mod.CALLS[-1] != threading.get_ident()

    async_fn = make_reward_fn("custom", custom=f"{user_module}:is_yes")
    assert asyncio.run(async_fn(Sample(response=" yes "))) == 1.0  # bool -> 1.0
    assert asyncio.run(async_fn(Sample(response="no"))) == 0.0
    # a dotted path as the type is treated as custom
    assert asyncio.run(make_reward_fn(f"{user_module}:is_yes")(Sample(response="yes"))) == 1.0


def test_custom_errors_name_the_path(user_module: str) -> None:
    with pytest.raises(RewardValueError, match="'my_rewards_mod:words' returned str 'high'"):
        asyncio.run(make_reward_fn("custom", custom=f"{user_module}:words")(Sample()))
    with pytest.raises(PluginContractError, match="cannot be called with one argument or two; expected def f"):
        make_reward_fn("custom", custom=f"{user_module}:three")
    with pytest.raises(PluginContractError, match=r"takes \(args, sample\), slime's convention, but no spec values"):
        make_reward_fn("custom", custom=f"{user_module}:two")  # without the spec: use reward_from_spec
    with pytest.raises(PluginContractError, match="not callable \\(got int\\)"):
        make_reward_fn("custom", custom=f"{user_module}:NOT_A_FUNCTION")
    with pytest.raises(UnknownPlugin, match="has no attribute 'missing'"):
        make_reward_fn("custom", custom=f"{user_module}:missing")
    with pytest.raises(UnknownPlugin, match="cannot import module 'no_such_mod_xyz'"):
        make_reward_fn("custom", custom="no_such_mod_xyz:f")


@pytest.fixture()
def raising_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's reward module whose functions raise, directly or from a helper / library call."""
    path = tmp_path / "my_raising_rewards.py"
    path.write_text(
        "import json\n"
        "def raises(sample):\n"
        "    d = {}\n"
        "    return d['score']\n"
        "def helper(text):\n"
        "    return json.loads(text)\n"
        "def via_library(sample):\n"
        "    return helper(sample.response)\n"
        "async def bad_value(sample):\n"
        "    raise ValueError('no answer found')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # this test's file, not one imported by an earlier test
    monkeypatch.delitem(sys.modules, "my_raising_rewards", raising=False)
    return path


@pytest.mark.parametrize(
    "attr, raised, line, func",
    [
        ("raises", "KeyError: 'score'", 4, "raises"),  # sync, in a worker thread
        # the innermost frame of the user's code, not json's
        ("via_library", "JSONDecodeError: Expecting value", 6, "helper"),
        ("bad_value", "ValueError: no answer found", 10, "bad_value"),  # async
    ],
)
def test_a_raising_custom_reward_is_a_user_error_naming_it_and_where(
    raising_module: Path, attr: str, raised: str, line: int, func: str
) -> None:
    from slime.core.errors import ExitCode
    from slime.rl.rewards.custom import RewardFunctionError
    from slime.runtime.failures import classify

    fn = make_reward_fn("custom", custom=f"my_raising_rewards:{attr}")
    with pytest.raises(RewardFunctionError) as info:
        asyncio.run(batch_rewards(fn, [Sample(response="not json")]))
    text = str(info.value)
    assert text.startswith(f"reward function 'my_raising_rewards:{attr}' raised {raised}")
    assert f"(at {raising_module}:{line} in {func})" in text
    assert classify(info.value) == ExitCode.SPEC  # not "an internal error (a bug)"


# ---- factory and batch --------------------------------------------------------------------------


def test_factory_validates_its_arguments() -> None:
    assert {"exact", "math", "f1", "remote", "custom"} <= set(REWARDS.names())
    with pytest.raises(ValueError, match="'remote' needs reward.url"):
        make_reward_fn("remote")
    with pytest.raises(ValueError, match="reward.url is only used with reward.type 'remote', not 'math'"):
        make_reward_fn("math", url="http://127.0.0.1:1/")
    with pytest.raises(ValueError, match="'custom' needs reward.custom"):
        make_reward_fn("custom")
    with pytest.raises(ValueError, match="reward.custom is only used with reward.type 'custom'"):
        make_reward_fn("f1", custom="a:b")
    with pytest.raises(UnknownPlugin, match="unknown reward 'maht' \\(did you mean 'math'\\?\\)"):
        make_reward_fn("maht")
    with pytest.raises(ValueError, match="reward.url must be an http"):
        make_reward_fn("remote", url="ftp://host/score")
    with pytest.raises(ValueError, match="max_retries must be an integer >= 0, got None"):
        make_reward_fn("remote", url="http://127.0.0.1:1/")  # no default of its own: the spec's
    with pytest.raises(ValueError, match="reward.key is only used with reward.type 'custom' or 'remote'"):
        make_reward_fn("dapo", key="score")


def test_the_builtin_table_is_the_registry_and_the_specs_choices() -> None:
    import typing

    from slime.spec.types import Reward

    assert set(REWARDS.names()) >= set(BUILTIN_REWARDS)
    annotated = typing.get_type_hints(Reward, include_extras=True)["type"]
    assert set(typing.get_args(typing.get_args(annotated)[0])) == set(BUILTIN_REWARDS)


def test_installed_entry_points_add_names_but_never_replace_a_builtin(user_module: str) -> None:
    from importlib.metadata import EntryPoint

    installed = [
        EntryPoint("by_length", f"{user_module}:by_length", ENTRY_POINT_GROUP),
        EntryPoint("math", f"{user_module}:is_yes", ENTRY_POINT_GROUP),
    ]
    registry = reward_registry(installed)
    assert registry.names() == sorted({*BUILTIN_REWARDS, "by_length"})
    assert registry.get("math") is REWARDS.get("math")
    assert registry.get("by_length").__name__ == "by_length"


def test_registered_name_is_wrapped_like_custom(user_module: str) -> None:
    REWARDS.register("test_by_length", f"{user_module}:by_length")
    try:
        fn = make_reward_fn("test_by_length")
        assert asyncio.run(fn(Sample(response="abcdefghij"))) == 1.0
    finally:
        REWARDS._entries.pop("test_by_length")


def test_batch_rewards_bounds_concurrency_keeps_order_and_assigns() -> None:
    in_flight = 0
    peak = 0

    async def slow(sample: Sample) -> float:
        nonlocal in_flight, peak
        i = sample.index or 0
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01 * (5 - i % 5))  # later samples finish first
        in_flight -= 1
        return float(i)

    samples = [Sample(index=i) for i in range(10)]
    out = asyncio.run(batch_rewards(slow, samples, concurrency=3))
    assert out == [float(i) for i in range(10)]
    assert [s.reward for s in samples] == out
    assert peak == 3


def test_batch_rewards_raises_the_first_error_and_assigns_nothing() -> None:
    async def boom(sample: Sample) -> float:
        if sample.index == 2:
            raise RuntimeError("scorer crashed on sample 2")
        await asyncio.sleep(0.01)
        return 1.0

    samples = [Sample(index=i) for i in range(4)]
    with pytest.raises(RuntimeError, match="scorer crashed on sample 2"):
        asyncio.run(batch_rewards(boom, samples, concurrency=2))
    assert all(s.reward is None for s in samples)
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1"):
        asyncio.run(batch_rewards(boom, samples, concurrency=0))
