"""The torch train backend's plug-in profile: the embedded trainer (CPU or GPU, data parallel only)."""

from __future__ import annotations

from slime.spec.plugin import Profile

PROFILE = Profile(
    summary="the embedded PyTorch trainer, CPU or GPU, data parallel",
    implementation="slime.backends.train.torch_backend:TorchTrainBackend",
    default=True,
    cpu=True,
    hooks="slime.backends.train.hooks",
    derived={"train.optimizer.distributed": ("train.backend",)},
)
