"""The ``random`` reward: 0.0 or 1.0 with equal odds, ignoring the response (a pipeline check).

As THUDM/slime's ``--rm-type random`` (``rm_hub/__init__.py`` at 624b824): a draw from Python's
global ``random`` module. It teaches nothing: use it to test the rollout -> reward -> train path
without a grader.
"""

from __future__ import annotations

import random

from slime.rl.sample import Sample

__all__ = ["random_reward"]


async def random_reward(sample: Sample) -> float:
    del sample  # the score does not depend on it
    return float(random.randint(0, 1))
