"""``math`` (boxed labels), ``f1``, ``gpqa`` and ``random`` score as slime's ``--rm-type`` graders.

Expected values were worked out by hand from slime's rules (THUDM/slime @624b824, ``rm_hub/``), read,
not run. The functions are imported directly: reward names come from the installed entry points, which
name this branch's new rewards only once it is installed (the last test checks pyproject's table).
"""

from __future__ import annotations

import asyncio
import random
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from slime.migrate.importer import convert_slime_args
from slime.rl.rewards.coin import random_reward
from slime.rl.rewards.gpqa import chosen_letter, gpqa_reward, gpqa_score
from slime.rl.rewards.math_answer import math_reward
from slime.rl.rewards.string_match import f1_reward, f1_score
from slime.rl.sample import Sample

ROOT = Path(__file__).resolve().parents[2]


def run(fn, response: str, label: object, metadata: dict | None = None) -> float:
    return asyncio.run(fn(Sample(response=response, label=label, metadata=metadata or {})))


# ----------------------------------------------------------------------------- math
@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("answer: \\boxed{42}", "\\boxed{42}", 1.0),  # the reported bug: slime unwraps a boxed label
        ("answer: \\boxed{42}", "$\\boxed{42}$", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", 1.0),
        ("\\boxed{41}", "\\boxed{42}", 0.0),
        ("\\boxed{42}", "", 0.0),  # slime: an empty label is never matched
        ("\\boxed{42}", "\\boxed{42", 0.0),  # a label whose box never closes matches nothing
        ("\\boxed{7}", ["\\boxed{6}", "\\boxed{7}"], 1.0),
    ],
)
def test_math_reads_a_boxed_label_by_its_box(response, label, expected):
    assert run(math_reward, response, label) == expected


# ----------------------------------------------------------------------------- f1
@pytest.mark.parametrize(
    "prediction, reference, expected",
    [
        # the whole response is scored: [answer, is, eiffel, tower] vs [eiffel, tower]: P 1/2, R 1 -> 2/3
        ("The answer is: the Eiffel Tower", "Eiffel tower", 2 / 3),
        ("Eiffel Tower!", "the eiffel tower", 1.0),
        ("yes", "no", 0.0),
        ("yes it is", "yes", 0.0),  # 'yes' on one side only: no partial credit
        ("No.", "no", 1.0),
        ("noanswer", "no answer", 0.0),
        ("the", "a", 0.0),  # nothing left to share: 0, not 1
        ("", "", 0.0),
        ("red red dog", "red dog dog", 2 / 3),  # multiset overlap {red, dog}: P 2/3, R 2/3
    ],
)
def test_f1_is_slimes_token_f1_of_the_whole_response(prediction, reference, expected):
    assert f1_score(prediction, reference) == pytest.approx(expected)


def test_f1_reward_takes_the_best_of_several_labels():
    assert run(f1_reward, "big red dog", ["cat", "red dog"]) == pytest.approx(0.8)  # P 2/3, R 1


# ----------------------------------------------------------------------------- gpqa
@pytest.mark.parametrize(
    "response, label, metadata, expected",
    [
        ("The answer is B.", "B", None, 1.0),
        ("answer: b", "B", None, 1.0),  # the pattern ignores case
        ("The answer is (b)", "B", None, 0.0),  # slime's quirk: 'is' is optional, so 'answer i' picks I
        ("Answer: C", "B", None, 0.0),
        ("<think>answer is B</think> final answer: D", "D", None, 1.0),  # only the text after </think>
        ("I think C is correct", "C", None, 1.0),
        ("Between A and D, I pick D", "D", None, 1.0),  # the last standalone capital
        ("the answer is B", 1, None, 1.0),  # an integer label is an index: 1 -> B
        ("the answer is B", 2.0, None, 0.0),
        ("it is London", "London", {"choices": ["Paris", "London"]}, 1.0),  # label text -> option B
        ("option B", "London", {"choices": ["Paris", "London"]}, 1.0),
        ("option A", "London", {"choices": ["Paris", "London"]}, 0.0),
        ("answer: C", "x", {"correct_letter": " c "}, 1.0),
        ("answer: J", "J", None, 1.0),  # ten letters A..J by default
        ("answer: K", "B", None, 0.0),  # K is no option letter and the text 'b' is not in the response
        # four choices: E is no option letter, but the label's text is found in the response (slime's fallback)
        ("I choose E", "E", {"choices": ["a", "b", "c", "d"]}, 1.0),
        ("The mitochondria, clearly.", "B", {"choices": {"x": "nucleus", "y": "Mitochondria"}}, 1.0),
        ("no letter here, it's about 3 moles", "x", {"correct_answer": "3 moles"}, 1.0),
        ("", "A", None, 0.0),
    ],
)
def test_gpqa(response, label, metadata, expected):
    assert gpqa_score(response, label, metadata) == expected
    assert run(gpqa_reward, response, label, metadata) == expected


def test_gpqa_letter_patterns_in_slimes_order():
    letters = list("ABCD")
    assert chosen_letter("option is Z, so the answer is B", letters) == "B"  # an invalid letter is passed over
    assert chosen_letter("A is correct. Answer: B", letters) == "B"  # 'answer ...' is tried first
    assert chosen_letter("nothing", letters) is None
    assert gpqa_score(None, "A") == 0.0


# ----------------------------------------------------------------------------- random
def test_random_is_a_fair_coin_that_ignores_the_response():
    random.seed(5)
    draws = [run(random_reward, "whatever", None) for _ in range(400)]
    assert set(draws) == {0.0, 1.0}
    assert 150 < sum(draws) < 250  # 400 fair flips: 200 +- 2.5 sigma


# ----------------------------------------------------------------------------- the entry points
def test_pyproject_names_each_slime_grader_and_each_loads():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["slime_submit.rewards"]
    assert {"math", "dapo", "deepscaler", "f1", "gpqa", "random", "remote"} <= set(table)
    for name, value in table.items():
        assert callable(EntryPoint(name, value, "slime_submit.rewards").load()), name


# ----------------------------------------------------------------------------- the importer
@pytest.mark.parametrize(
    "kind, reward, differs",
    [
        ("gpqa", "gpqa", None),
        ("f1", "f1", None),
        ("random", "random", None),
        ("math", "math", "slime's math scores 0 without a \\boxed{} answer"),
        ("boxed_f1", "f1", "slime's boxed_f1 scores only the last \\boxed{} content"),
    ],
)
def test_import_maps_each_grader_and_writes_out_what_differs(kind, reward, differs):
    result = convert_slime_args(f"--hf-checkpoint /m --prompt-data /p.jsonl --num-rollout 3 --rm-type {kind}")
    assert ("--rm-type", "reward.type") in result.mapped
    assert f"  type: {reward}" in result.yaml
    if differs is None:
        assert f"--rm-type {kind}" not in dict(result.differences)
    else:
        assert dict(result.differences)[f"--rm-type {kind}"].startswith(differs)
        assert f"#   --rm-type {kind}: {differs}" in result.yaml  # the import prints it in the spec
