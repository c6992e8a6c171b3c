"""The one SLURM → slime state table, pending reasons, array task ids, and run-level aggregation."""

from __future__ import annotations

import pytest

from launchers.slurm.jobs import STATE_MAP, expand_task_ids, explain_reason, map_state
from launchers.status import aggregate
from slime.core.states import RunState

# The contract from the issue, written out independently of the table in the code.
EXPECTED = {
    "PENDING": "pending",
    "CONFIGURING": "running",
    "RUNNING": "running",
    "COMPLETING": "running",
    "COMPLETED": "succeeded",
    "FAILED": "failed",
    "NODE_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed",
    "DEADLINE": "failed",
    "TIMEOUT": "timeout",
    "CANCELLED": "cancelled",
    "PREEMPTED": "requeued",
    "REQUEUED": "requeued",
    "REQUEUE_HOLD": "requeued",
    "REQUEUE_FED": "requeued",
    "SUSPENDED": "suspended",
}


@pytest.mark.parametrize("slurm,ours", sorted(EXPECTED.items()))
def test_every_slurm_state_of_the_contract_maps_as_specified(slurm, ours):
    assert map_state(slurm) == ours


def test_the_table_only_produces_run_states_and_its_active_ones_are_the_queued_and_running():
    assert all(isinstance(v, RunState) for v in STATE_MAP.values())
    assert {v for v in STATE_MAP.values() if v.is_active} == {"pending", "running", "requeued", "suspended"}
    assert {v for v in STATE_MAP.values() if v.is_terminal} == {"succeeded", "failed", "timeout", "cancelled"}


@pytest.mark.parametrize(
    "raw,ours",
    [
        ("CANCELLED by 0", "cancelled"),  # sacct's form
        ("CA", "cancelled"),
        ("PD", "pending"),
        ("CG", "running"),
        ("TO", "timeout"),
        ("OOM", "failed"),
        ("R", "running"),
        ("CD", "succeeded"),
        ("RQ", "requeued"),
        ("PR", "requeued"),
        ("", "unknown"),
        (None, "unknown"),
        ("SOMETHING_NEW", "unknown"),
    ],
)
def test_sacct_suffixes_short_codes_and_unknown_states(raw, ours):
    assert map_state(raw) == ours and isinstance(map_state(raw), RunState)


@pytest.mark.parametrize(
    "text,ids",
    [
        ("3", [3]),
        ("0-2%1", [0, 1, 2]),
        ("1-2%1", [1, 2]),
        ("[1,4-5%2]", [1, 4, 5]),
        ("7,3", [3, 7]),
        ("N/A", []),
        (None, []),
        ("", []),
        ("(null)", []),
    ],
)
def test_array_task_ids_as_slurm_prints_them(text, ids):
    assert expand_task_ids(text) == ids


def test_pending_reasons_are_explained_and_unknown_ones_pass_through():
    assert explain_reason("Resources").startswith("Resources: waiting for free nodes")
    assert "max_parallel" in explain_reason("JobArrayTaskLimit")
    assert "scontrol release" in explain_reason("JobHeldUser")
    assert explain_reason("SomeNewReason") == "SomeNewReason"
    assert explain_reason("None") is None and explain_reason(None) is None


@pytest.mark.parametrize(
    "states,run",
    [
        ([], "unknown"),
        (["succeeded", "succeeded"], "succeeded"),
        (["succeeded", "running"], "running"),
        (["pending", "succeeded"], "pending"),
        (["requeued", "pending"], "requeued"),
        (["succeeded", "cancelled"], "cancelled"),
        (["failed", "cancelled", "succeeded"], "failed"),
        (["timeout", "succeeded"], "timeout"),
        (["running", "failed"], "running"),  # still working: the run is not over
    ],
)
def test_run_state_from_task_states(states, run):
    assert aggregate(RunState(s) for s in states) == run
