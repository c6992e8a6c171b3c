"""Trajectory merging: turns of an agent session -> training samples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.agent.trajectory import TrajectoryTree, Turn, merge_turns


def lp(*xs: float) -> list[float]:
    return [float(x) for x in xs]


def check_shapes(s) -> None:
    assert len(s.loss_mask) == len(s.tokens) - s.prompt_length
    assert len(s.rollout_log_probs) == len(s.loss_mask)
    assert set(s.loss_mask) <= {0, 1}


def test_clean_append_masks_env_tokens_and_keeps_logprobs():
    tree = TrajectoryTree("s1")
    p1 = tree.add_turn(Turn([1, 2, 3], [10, 11], lp(-0.1, -0.2), weight_version=0))
    p2 = tree.add_turn(Turn([1, 2, 3, 10, 11, 20, 21], [12], lp(-0.3), weight_version=1))
    assert (p1.kind, p2.kind, p2.parent) == ("root", "extend", p1.turn_id)
    [s] = tree.samples(reward=1.5)
    check_shapes(s)
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 12]
    assert s.prompt_length == 3
    assert s.loss_mask == [1, 1, 0, 0, 1]
    assert s.rollout_log_probs == lp(-0.1, -0.2, 0, 0, -0.3)
    assert s.weight_versions == [0, 1]
    assert s.status == "completed"
    assert s.reward == 1.5
    assert [t["weight_version"] for t in s.metadata["turns"]] == [0, 1]


def test_response_without_eos_gets_template_eos_as_env_token():
    # The engine stopped without emitting EOS; the template closes the message.
    [s] = merge_turns(
        [
            Turn([1], [10, 11], lp(-1, -2), 0),
            Turn([1, 10, 11, 99, 5], [12], lp(-3), 0),
        ]
    )
    assert s.tokens == [1, 10, 11, 99, 5, 12]
    assert s.loss_mask == [1, 1, 0, 0, 1]


def drift_turns():
    # Turn 1 generated [10, 11, 12, 13, 99]; the template re-tokenised "11 12" as "50".
    t1 = Turn([1, 2], [10, 11, 12, 13, 99], lp(-1, -2, -3, -4, -5), weight_version=3)
    t2 = Turn([1, 2, 10, 50, 13, 99, 20, 21], [30, 31], lp(-6, -7), weight_version=4)
    return t1, t2


def test_drift_within_threshold_realigns_with_mask_zero():
    t1, t2 = drift_turns()
    tree = TrajectoryTree(drift_threshold=2)
    tree.add_turn(t1)
    placed = tree.add_turn(t2)
    assert placed.kind == "realign"
    assert placed.realigned_tokens == 2
    [s] = tree.samples()
    check_shapes(s)
    # The sequence is exactly what the engine saw for turn 2, plus its response.
    assert s.tokens == list(t2.prompt_token_ids) + [30, 31]
    assert s.prompt_length == 2
    # 13 and 99 were generated after 11 12, not after 50: their log-probs are for another context, mask 0
    # (a byte-level model's half UTF-8 character came back as U+FFFD's three bytes; the trainer then put the
    # tokens after it up to 10.4 nats below the engine's log-probs)
    #                     10  50  13  99  20  21  30  31
    assert s.loss_mask == [1, 0, 0, 0, 0, 0, 1, 1]
    assert s.rollout_log_probs == lp(-1, 0, -4, -5, 0, 0, -6, -7)
    assert s.metadata["turns"][0]["realigned_tokens"] == 2
    assert s.weight_versions == [3, 4]


def test_drift_beyond_threshold_forks():
    t1, t2 = drift_turns()
    tree = TrajectoryTree(drift_threshold=1)
    tree.add_turn(t1)
    placed = tree.add_turn(t2)
    assert placed.kind == "fork" and placed.parent is None
    a, b = tree.samples()
    assert a.tokens == [1, 2, 10, 11, 12, 13, 99] and a.loss_mask == [1] * 5
    # The fork's prompt is its whole prompt: nothing before its response is trained.
    assert b.prompt_length == len(t2.prompt_token_ids)
    assert b.loss_mask == [1, 1] and b.rollout_log_probs == lp(-6, -7)
    assert b.weight_versions == [4]


def test_drift_threshold_zero_disables_realignment():
    t1, t2 = drift_turns()
    assert TrajectoryTree(drift_threshold=0).add_turn(t1).kind == "root"
    tree = TrajectoryTree(drift_threshold=0)
    tree.add_turn(t1)
    assert tree.add_turn(t2).kind == "fork"


def test_drift_with_length_change_keeps_suffix_logprobs_aligned():
    # "11" was re-tokenised into two tokens "51 52": lengths differ by one. The suffix's log-probs stay on their
    # tokens (kept, untrained: they were generated after 11, not after 51 52).
    t1 = Turn([7], [10, 11, 12, 99], lp(-1, -2, -3, -4), 0)
    t2 = Turn([7, 10, 51, 52, 12, 99, 8], [40], lp(-5), 1)
    [s] = merge_turns([t1, t2], drift_threshold=2)
    assert s.tokens == [7, 10, 51, 52, 12, 99, 8, 40]
    assert s.loss_mask == [1, 0, 0, 0, 0, 0, 1]
    assert s.rollout_log_probs == lp(-1, 0, 0, -3, -4, 0, -5)


def test_fork_on_divergence_before_last_response():
    # The agent rewrote history (system prompt changed): no realignment, a new root.
    t1 = Turn([1, 2, 3], [10, 11], lp(-1, -2), 0)
    t2 = Turn([1, 9, 3, 10, 11, 20], [12], lp(-3), 0)
    tree = TrajectoryTree()
    tree.add_turn(t1)
    placed = tree.add_turn(t2)
    assert placed.kind == "fork" and "continues no node" in placed.reason
    assert len(tree.roots) == 2 and len(tree.samples()) == 2


def test_retry_of_root_prompt_forks_instead_of_erasing_response():
    t = Turn([1, 2], [10, 11], lp(-1, -2), 0)
    tree = TrajectoryTree(drift_threshold=8)
    tree.add_turn(t)
    assert tree.add_turn(Turn([1, 2], [12], lp(-3), 0)).kind == "fork"
    assert [s.loss_mask for s in tree.samples()] == [[1, 1], [1]]


def test_explicit_parent_that_does_not_match_forks_with_reason():
    tree = TrajectoryTree()
    a = tree.add_turn(Turn([1], [10], lp(-1), 0))
    placed = tree.add_turn(Turn([2, 3], [11], lp(-1), 0, parent=a.turn_id))
    assert placed.kind == "fork" and a.turn_id in placed.reason


def test_shared_prefix_branches_train_shared_turn_once():
    tree = TrajectoryTree()
    root = tree.add_turn(Turn([1, 2], [10, 11], lp(-1, -2), 0))
    b1 = tree.add_turn(Turn([1, 2, 10, 11, 5], [20], lp(-3), 1))
    b2 = tree.add_turn(Turn([1, 2, 10, 11, 6], [21, 22], lp(-4, -5), 1))
    assert b1.parent == b2.parent == root.turn_id
    s1, s2 = tree.samples(reward=0.25)
    check_shapes(s1), check_shapes(s2)
    assert s1.loss_mask == [1, 1, 0, 1]  # root's response trained here (first leaf)
    assert s2.loss_mask == [0, 0, 0, 1, 1]  # ...and not again here
    assert s2.rollout_log_probs[:2] == lp(-1, -2)  # still the engine's, just not trained
    generated = 2 + 1 + 2
    assert sum(s1.loss_mask) + sum(s2.loss_mask) == generated
    assert s1.reward == s2.reward == 0.25
    assert [t["trained"] for t in s2.metadata["turns"]] == [False, True]


def test_shared_turn_prefers_branch_where_it_is_not_realigned():
    t1, t2 = drift_turns()
    tree = TrajectoryTree(drift_threshold=2)
    tree.add_turn(t1)
    tree.add_turn(t2)  # realigns t1's response in this branch
    tree.add_turn(Turn([1, 2, 10, 11, 12, 13, 99, 70], [71], lp(-9), 5))  # clean sibling
    s_realigned, s_clean = tree.samples()
    assert s_realigned.loss_mask[:4] == [0, 0, 0, 0]
    assert s_clean.loss_mask == [1, 1, 1, 1, 1, 0, 1]


def test_deepest_match_wins():
    tree = TrajectoryTree()
    tree.add_turn(Turn([1], [10], lp(-1), 0))
    mid = tree.add_turn(Turn([1, 10, 2], [11], lp(-1), 0))
    deep = tree.add_turn(Turn([1, 10, 2, 11, 3], [12], lp(-1), 0))
    assert deep.parent == mid.turn_id
    [s] = tree.samples()
    assert s.weight_versions == [0, 0, 0] and len(s.metadata["path"]) == 3


def test_truncation_at_max_length():
    turns = [
        Turn([1, 2], [10, 11], lp(-1, -2), 0),
        Turn([1, 2, 10, 11, 5, 6], [12, 13, 14], lp(-3, -4, -5), 1),
    ]
    [s] = merge_turns(turns, max_length=7, reward=1.0)
    check_shapes(s)
    assert s.status == "truncated"
    assert s.tokens == [1, 2, 10, 11, 5, 6, 12]
    assert s.loss_mask == [1, 1, 0, 0, 1]
    assert s.rollout_log_probs == lp(-1, -2, 0, 0, -3)
    [full] = merge_turns(turns, max_length=9)
    assert full.status == "completed"


def test_truncation_inside_prompt_leaves_empty_response():
    [s] = merge_turns([Turn([1, 2, 3, 4], [10], lp(-1), 0)], max_length=2)
    assert s.status == "truncated" and s.tokens == [1, 2] and s.loss_mask == []
    check_shapes(s)


def test_engine_truncated_leaf_marks_sample_truncated():
    [s] = merge_turns([Turn([1], [10, 11], lp(-1, -2), 0, truncated=True)])
    assert s.status == "truncated"


@pytest.mark.parametrize(
    "turn, field",
    [
        (Turn([1], [10, 11], lp(-1), 0), "response_logprobs"),
        (Turn([], [10], lp(-1), 0), "prompt_token_ids"),
        (Turn([1], [10], lp(-1), "v1"), "weight_version"),  # type: ignore[arg-type]
        (Turn([1.5], [10], lp(-1), 0), "prompt_token_ids"),  # type: ignore[list-item]
    ],
)
def test_bad_turn_is_rejected_naming_the_field(turn, field):
    with pytest.raises(ValueError, match=field):
        TrajectoryTree().add_turn(turn)


def test_unknown_parent_and_duplicate_ids_are_clear_errors():
    tree = TrajectoryTree("sess")
    tree.add_turn(Turn([1], [2], lp(-1), 0, turn_id="a"))
    with pytest.raises(KeyError, match="unknown turn id 'zzz'"):
        tree.add_turn(Turn([1, 2], [3], lp(-1), 0, parent="zzz"))
    with pytest.raises(ValueError, match="duplicate turn id 'a'"):
        tree.add_turn(Turn([1, 2], [3], lp(-1), 0, turn_id="a"))


# -- property: every trained token maps back to exactly one generated token ---------


@st.composite
def sessions(draw):
    """Random trees of clean extensions; log-probs encode (turn, position)."""
    n_turns = draw(st.integers(1, 7))
    turns: list[Turn] = []
    held: list[list[int]] = []
    for i in range(n_turns):
        if held and draw(st.booleans()):
            parent = draw(st.integers(0, len(held) - 1))
            base = held[parent]
        else:
            base = []
        # Token ids unique per turn so branches never match one another by accident.
        tail = [1000 * (i + 1) + j for j in range(draw(st.integers(1 if not base else 0, 4)))]
        resp = [1000 * (i + 1) + 500 + j for j in range(draw(st.integers(0, 5)))]
        prompt = base + tail
        if not prompt:
            prompt = [1000 * (i + 1) + 999]
        turns.append(Turn(prompt, resp, [-(i + 1) - j / 100 for j in range(len(resp))], weight_version=i))
        held.append(prompt + resp)
    return turns


@settings(max_examples=150, deadline=None)
@given(sessions(), st.none() | st.integers(1, 40))
def test_property_trained_tokens_are_generated_once_with_their_logprobs(turns, max_length):
    samples = merge_turns(turns, max_length=max_length)
    origin = {}
    for i, t in enumerate(turns):
        for j, tok in enumerate(t.response_token_ids):
            origin[tok] = (i, t.response_logprobs[j])
    trained = []
    for s in samples:
        check_shapes(s)
        assert s.weight_versions == sorted(s.weight_versions)
        for pos, m in enumerate(s.loss_mask):
            tok = s.tokens[s.prompt_length + pos]
            if m:
                assert tok in origin, "only generated tokens may be trained"
                assert s.rollout_log_probs[pos] == origin[tok][1]
                assert origin[tok][0] in s.weight_versions
                trained.append(tok)
            elif tok not in origin:
                assert s.rollout_log_probs[pos] == 0.0
    assert len(trained) == len(set(trained)), "a generated token was trained twice"
    if max_length is None:
        assert sorted(trained) == sorted(origin), "every generated token is trained once"
