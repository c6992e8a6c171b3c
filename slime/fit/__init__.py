"""Will the job fit? Per-GPU and host memory of each role, estimated from the spec before it queues.

Why: a job that runs out of memory fails after its queue wait; the arithmetic here (pure Python, no
torch) refuses it at ``validate`` instead. ``model`` reads the shape from config.json, ``trainer``
and ``engine`` give one role's breakdown, ``plan`` the whole layout, ``check`` the spec rule.
"""

from __future__ import annotations

from slime.fit.gpus import GPU_MEMORY_GIB, gpu_memory_gib
from slime.fit.model import Dims, dims_from_config
from slime.fit.plan import FitReport, RoleFit, estimate

__all__ = ["GPU_MEMORY_GIB", "Dims", "FitReport", "RoleFit", "dims_from_config", "estimate", "gpu_memory_gib"]
