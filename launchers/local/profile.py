"""The local launcher's plug-in profile: runs the job on this machine, without a scheduler.

It has no spec section of its own. Imported when the spec types are composed.
"""

from __future__ import annotations

from slime.spec.plugin import Profile

PROFILE = Profile(
    summary="runs on this machine without a scheduler",
    implementation="launchers.local.launcher:LocalLauncher",
    default=True,
    cpu=True,
    hooks="launchers.local.hooks",
    node_env="launchers.local.hooks:local_node",
    derived={"cluster.cpus_per_node": ("cluster.launcher",)},
)
