"""The test PBS launcher's profile: ``cluster.pbs: {queue, walltime}``."""

from __future__ import annotations

from typing import Annotated

from slime.spec.plugin import Profile
from slime.spec.sections import D, Section


class PbsOptions(Section, kw_only=True):
    """What qsub is asked for."""

    queue: Annotated[str, D("PBS queue.")] = "workq"
    walltime: Annotated[str, D("PBS walltime, HH:MM:SS.", pattern=r"^\d+:\d{2}:\d{2}$")] = "01:00:00"


PROFILE = Profile(
    summary="submits with qsub to a PBS cluster (a test plug-in)",
    implementation="pbs_launcher.launcher:PbsLauncher",
    options=PbsOptions,
    hooks="pbs_launcher.hooks",
)
