"""The RL data path: prompt source → generation → rewards → filters → buffer → trainer.

One rollout, as the rollout manager (``slime.runtime.rollout_manager``) runs it:

1. **prompt source** (:mod:`.source`): prompt groups come from the partial-rollout buffer first (groups
   whose requests were aborted at the end of an earlier rollout), then from the dataset's resumable
   cursor; both are in the train state, so a resumed run continues with the same prompts and the same
   buffered partial responses;
2. **generation** (:mod:`.generate`): one ``/generate`` request per group, ``n_samples_per_prompt``
   samples each, ``rid`` = the rollout's tag + group, dealt round-robin over the engines; a continued
   sample sends its prompt + earlier tokens and appends what comes back (tokens, log-probs, and the
   weight version of each token); agent specs run the ``agent.generate`` plug-in per group instead;
3. **rewards**: each finished group is scored with the run's reward;
4. **filters** (``slime.rl.filters``): groups are taken in the order they were drawn; with
   ``rollout.dynamic_sampling`` a group the filter rejects is dropped (counted by reason) and, while
   fewer than ``batch_size`` groups could still pass, another ``over_sampling_batch_size`` groups are
   drawn, up to ``max_rounds`` rounds (:mod:`.collect`);
5. **buffer**: once ``batch_size`` groups passed, the requests still running are aborted
   (``/abort_request`` by the rollout's rid prefix); with ``rollout.partial`` those groups (and the
   finished ones not needed) go back to the buffer with their partial responses, else they are dropped;
6. **trainer**: the kept samples (:class:`RolloutBatch`) go to the driver, which trains on any number
   of them; with ``debug.save_rollouts`` they are also written to ``tasks/<i>/rollouts/`` (:mod:`.saved`),
   which ``debug.mode: train_only`` replays.

Guaranteed: the kept groups are the first ``batch_size`` groups *in draw order* that pass the filter
(not the first to finish, as in slime), so a run without partial rollout is repeatable (per-request
sampling seeds make each group's samples independent of what else the engine batches). Not
guaranteed: how far an aborted request got before the abort (partial responses depend on timing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.rl.sample import Sample

__all__ = ["RolloutBatch"]


@dataclass
class RolloutBatch:
    """What one rollout hands the trainer: the kept samples, in group order, and the generation's metrics
    (``rollout/groups_*``, ``rollout/rounds``, ...)."""

    samples: list[Sample]
    metrics: dict[str, Any] = field(default_factory=dict)
