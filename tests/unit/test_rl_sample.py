"""Sample: dict round trips, unknown keys kept, clear errors for bad fields."""

from __future__ import annotations

import json

import pytest

from slime.rl.sample import Sample, SampleStatus


def _sample() -> Sample:
    return Sample(
        group_index=3,
        index=7,
        prompt="1+1=",
        tokens=[11, 12, 13, 21, 22],
        response="2",
        response_length=2,
        label="2",
        reward=1.0,
        loss_mask=[1, 0],
        rollout_log_probs=[-0.5, -1.25],
        status=SampleStatus.TRUNCATED,
        metadata={"source": "gsm8k"},
        weight_version=4,
    )


def test_round_trip_through_json() -> None:
    s = _sample()
    d = json.loads(json.dumps(s.to_dict()))
    assert d["status"] == "truncated"
    back = Sample.from_dict(d)
    assert back == s
    assert back.status is SampleStatus.TRUNCATED


def test_unknown_keys_survive_a_round_trip() -> None:
    d = _sample().to_dict()
    d["rollout_id"] = 12
    d["spans"] = [[0, 1]]
    s = Sample.from_dict(d)
    assert s.extra == {"rollout_id": 12, "spans": [[0, 1]]}
    out = s.to_dict()
    assert out["rollout_id"] == 12 and out["spans"] == [[0, 1]]
    assert "extra" not in out
    assert Sample.from_dict(out) == s


def test_to_dict_does_not_alias_the_sample() -> None:
    s = _sample()
    d = s.to_dict()
    d["tokens"].append(99)
    d["metadata"]["x"] = 1
    assert s.tokens == [11, 12, 13, 21, 22] and "x" not in s.metadata


def test_defaults_and_derived_lengths() -> None:
    s = _sample()
    assert s.prompt_length == 3
    assert s.response_tokens == [21, 22]
    s.check_lengths()
    blank = Sample()
    assert blank.status is SampleStatus.PENDING and blank.reward is None
    assert Sample.from_dict({}) == blank
    with pytest.raises(AttributeError):
        blank.not_a_field = 1  # type: ignore[attr-defined]  # slots: typos fail loudly


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "status",
            "done",
            "'status' must be one of pending, completed, truncated, aborted, failed",
        ),
        ("tokens", [1, "2"], "'tokens' must be a list of integers"),
        ("reward", "high", "'reward' must be a number or null"),
        ("response_length", 2.5, "'response_length' must be an integer"),
        ("index", True, "'index' must be an integer or null"),
        ("metadata", [1], "'metadata' must be a mapping"),
        ("rollout_log_probs", [0.1, None], "'rollout_log_probs' must be a list of numbers"),
    ],
)
def test_bad_fields_name_the_field(key: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", "\\(")):
        Sample.from_dict({key: value})


def test_check_lengths_reports_mismatches() -> None:
    s = _sample()
    s.loss_mask = [1, 1, 1]
    with pytest.raises(ValueError, match="loss_mask has 3 entries but response_length is 2"):
        s.check_lengths()
    s = _sample()
    s.rollout_log_probs = [0.0]
    with pytest.raises(ValueError, match="rollout_log_probs has 1 entries"):
        s.check_lengths()
    s = _sample()
    s.response_length = 9
    with pytest.raises(ValueError, match="response_length 9 is outside 0..len\\(tokens\\)=5"):
        s.check_lengths()
