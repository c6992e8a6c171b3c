"""The toy engine's profile: ``rollout.toy: {replicas, args}``."""

from __future__ import annotations

from typing import Annotated

from slime.spec.plugin import Profile
from slime.spec.sections import D, Scalar, Section


class ToyOptions(Section, kw_only=True):
    """Toy engine settings."""

    replicas: Annotated[int, D("Server replicas per engine.", ge=1)] = 1
    args: Annotated[dict[str, Scalar], D("Toy server flags.")] = {}


PROFILE = Profile(
    summary="a toy GPU engine (a test plug-in)",
    implementation="toy_engine.backend:ToyBackend",
    options=ToyOptions,
    hooks="toy_engine.hooks",
)
