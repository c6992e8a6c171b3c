"""``slime.spec.task.load_task_spec``: a task's resolved spec read back from its run dir, or one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from slime.core.paths import TaskPaths
from slime.spec import load_spec
from slime.spec.task import TaskSpecError, load_task_spec

REPO = Path(__file__).resolve().parents[2]


def test_the_resolved_spec_round_trips_by_task_paths_or_by_path(tmp_path):
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    tp = TaskPaths(tmp_path, 3)
    tp.dir.mkdir(parents=True)
    tp.resolved.write_text(json.dumps({"task": 3, "spec": msgspec.to_builtins(spec)}))
    assert load_task_spec(tp) == spec == load_task_spec(str(tp.resolved))


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "does not exist: pass a run dir made by slime-submit and a task index that exists in it"),
        ("{not json", "cannot read the task's resolved spec .*resolved.json: Expecting property name"),
        ("[1, 2]", "cannot read the task's resolved spec .*resolved.json: list indices"),
        ('{"task": 0}', "cannot read the task's resolved spec .*resolved.json: 'spec'"),
        ('{"spec": {"rollout": {"batch_size": "many"}}}', "cannot read the task's resolved spec .*batch_size"),
    ],
)
def test_a_missing_or_unreadable_file_is_one_error_naming_it(tmp_path, content, why):
    tp = TaskPaths(tmp_path, 0)
    if content is not None:
        tp.dir.mkdir(parents=True)
        tp.resolved.write_text(content)
    with pytest.raises(TaskSpecError, match=why) as info:
        load_task_spec(tp)
    assert str(tp.resolved) in str(info.value) and isinstance(info.value, ValueError)
