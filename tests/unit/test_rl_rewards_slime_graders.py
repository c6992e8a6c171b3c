"""The ``dapo`` and ``deepscaler`` rewards score as slime's graders of the same name, on hand-computed cases.

Expected values were worked out by hand from the rules in each module's docstring (slime @624b824,
``rm_hub/math_dapo_utils.py`` and ``rm_hub/deepscaler.py``), not by running slime.
"""

from __future__ import annotations

import asyncio

import pytest

from slime.rl.rewards import make_reward_fn
from slime.rl.rewards.dapo import normalize_final_answer
from slime.rl.rewards.deepscaler import last_boxed
from slime.rl.sample import Sample
from slime.spec import load_spec_text


def score(kind: str, response: str, label: object) -> float:
    return asyncio.run(make_reward_fn(kind)(Sample(response=response, label=label)))


# ----------------------------------------------------------------------------- dapo
@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("Let me think. So 6 x 7.\nAnswer: 42", "42", 1.0),
        ("Answer: 41", "42", -1.0),  # wrong: -1, not 0
        ("The result is 42.", "42", -1.0),  # no 'Answer:' line: [INVALID]
        ("Answer: 3\nno, wait.\nAnswer: 5", "5", 1.0),  # the last one counts
        ("Answer: 3\nno, wait.\nAnswer: 5", "3", -1.0),
        ("answer : 7", "7.0", 1.0),  # case-insensitive; the label compared as an integer
        ("Answer: 1,000", "1000", 1.0),  # thousands commas of a number dropped
        ("Answer: x = 12", "12", 1.0),  # the text after the last '='
        ("Answer: 5 dollars", "5", 1.0),  # ' ' removed, then the unit 'dollars'
        ("Answer: $\\boxed{9}$", "9", 1.0),  # $...$ kept, box unwrapped, $ dropped
        ("Answer: \\text{17}", "17", 1.0),
        ("Answer: 42 " + "x" * 300, "42", -1.0),  # only the last 300 characters are read
        ("x" * 500 + "Answer: 42", "42", 1.0),
        ("Answer: 42", ["7", "42"], 1.0),  # a list label: any of them
    ],
)
def test_dapo(response, label, expected):
    assert score("dapo", response, label) == expected


def test_dapo_normalisation_steps():
    assert normalize_final_answer("\\frac12") == "\\frac{1}{2}"
    assert normalize_final_answer("\\sqrt3") == "\\sqrt{3}"
    assert normalize_final_answer("a banana ") == "banan"  # 'a ' is dropped before spaces (Minerva's rule)
    assert normalize_final_answer("90^\\circ") == "90"
    assert normalize_final_answer("1,2") == "12"  # digits once commas are gone
    assert normalize_final_answer("(1,2)") == "(1,2)"


def test_dapo_label_that_is_not_a_number_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        score("dapo", "Answer: x+1", "x+1")
    assert str(info.value) == (
        "the 'dapo' reward compares integer answers, but the label 'x+1' is not a number; "
        "use reward.type math (or a custom reward) for this data"
    )


# ----------------------------------------------------------------------------- deepscaler
@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("<think>so 2+2</think> The answer is \\boxed{4}.", "4", 1.0),
        ("<think>so 2+2</think> The answer is \\boxed{5}.", "4", 0.0),
        ("The answer is \\boxed{4}.", "4", 0.0),  # no </think>: nothing counts
        ("<think>maybe \\boxed{4}</think> I am not sure.", "4", 0.0),  # the box is inside the thinking
        ("<think>a</think>\\boxed{3}<think>b</think>\\boxed{4}", "4", 1.0),  # after the LAST </think>
        ("<think>a</think>\\boxed{4}<think>b</think>no box", "4", 0.0),
        ("### Task ###Response \\boxed{4} ###Response \\boxed{9}", "4", 1.0),  # between 1st and 2nd
        ("</think> 4", "4", 0.0),  # no fall-back to the last number
        ("</think> \\fbox{4}", "4", 0.0),  # \fbox is not read
        ("</think> \\boxed 4", "4", 0.0),  # braces required
        ("</think> \\boxed{\\frac{1}{2}", "1/2", 0.0),  # never closed (truncated)
        ("</think> \\boxed{\\dfrac{1}{2}}", "0.5", 1.0),  # graded like math: exact fractions
        ("</think> \\boxed{4}", "\\boxed{4}", 1.0),  # a boxed label is read by its box
        ("</think> \\boxed{4}", "", 0.0),  # an empty label matches nothing
        ("</think> \\boxed{4}", ["3", "4"], 1.0),
    ],
)
def test_deepscaler(response, label, expected):
    assert score("deepscaler", response, label) == expected


def test_last_boxed_is_strict():
    assert last_boxed("\\boxed{a{b}c} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\boxed x {2}") is None  # the last \boxed has no brace right after it


# ----------------------------------------------------------------------------- spec
@pytest.mark.parametrize("kind", ["dapo", "deepscaler"])
def test_spec_accepts_the_reward_types(kind):
    text = "apiVersion: slime/v2\nkind: RLJob\nname: x\nmodel: {builtin: tiny}\ndata: {prompts: p.jsonl}\n"
    spec = load_spec_text(
        text + f"reward: {{type: {kind}}}\nrollout: {{num_rollouts: 1, max_prompt_len: 64, max_response_len: 64}}\n",
        file="s.yaml",
    ).spec
    assert spec.reward.type == kind
