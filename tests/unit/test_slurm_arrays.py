"""Sweep tasks → job arrays: MaxArraySize caps the index, so big sweeps are split with task offsets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launchers.slurm.arrays import array_spec, plan_arrays


def test_a_sweep_that_fits_is_one_array():
    (chunk,) = plan_arrays(4, 1001, 2)
    assert (chunk.offset, chunk.count, chunk.spec, chunk.after_previous) == (0, 4, "0-3%2", False)


def test_a_sweep_larger_than_max_array_size_is_split_with_offsets_and_chained_when_capped():
    chunks = plan_arrays(2500, 1000, 8)
    assert [(c.offset, c.count, c.spec) for c in chunks] == [
        (0, 1000, "0-999%8"),
        (1000, 1000, "0-999%8"),
        (2000, 500, "0-499%8"),
    ]
    assert [c.after_previous for c in chunks] == [False, True, True]  # keeps %8 across the split
    assert chunks[-1].last == 2499


def test_without_max_parallel_split_arrays_run_side_by_side():
    chunks = plan_arrays(5, 2)
    assert [c.spec for c in chunks] == ["0-1", "0-1", "0"]
    assert not any(c.after_previous for c in chunks)


def test_array_spec_of_one_task_and_bad_inputs():
    assert array_spec(1, None) == "0" and array_spec(1, 3) == "0%3"
    with pytest.raises(ValueError):
        plan_arrays(0, 10)
    with pytest.raises(ValueError):
        plan_arrays(3, 0)


@given(n=st.integers(1, 5000), size=st.integers(1, 1200), par=st.none() | st.integers(1, 64))
def test_every_task_is_covered_once_in_order_and_no_index_reaches_max_array_size(n, size, par):
    chunks = plan_arrays(n, size, par)
    tasks = [c.offset + i for c in chunks for i in range(c.count)]
    assert tasks == list(range(n))
    assert all(c.count - 1 < size for c in chunks)
