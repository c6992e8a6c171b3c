"""The derived weight sync: nccl for disaggregated SGLang only when trainer rank 0 holds the whole policy.

With pipeline stages rank 0 holds one stage, and the collective sync raised at run time; the derived
value is now disk there (and a written nccl is refused: test_spec_rules' nccl-pipeline case).
"""

from __future__ import annotations

import pytest

from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

DISAGG = {
    "rollout.colocate": False,
    "rollout.gpus": 8,
    "train.nodes": 1,
    "train.gpus_per_node": 8,
}


@pytest.mark.parametrize("pipeline, derived", [(1, "nccl"), (2, "disk")])
def test_weight_sync_is_derived_from_the_pipeline_size(pipeline, derived):
    loaded = load(spec(GPU_SPEC, **DISAGG, **{"train.parallel.pipeline": pipeline}))
    assert loaded.spec.rollout.weight_sync == derived
