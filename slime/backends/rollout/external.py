"""``rollout.external``: engines the job did not start (slime's ``--rollout-external-engine-addrs``).

:class:`ExternalEngines` is the rollout backend of such a job: ``start`` only waits for each address's
``/health``; weight updates go over HTTP from disk (or nowhere, ``rollout.external_frozen``); ``stop``
leaves the engines running (they are not the job's). :func:`engine_secret` is the bearer token every
client of the job's engines sends: the external engines' own (``rollout.external_token_secret``, a
``cluster.secrets`` entry exported in the job's environment), never the job's secret.
Not done: collective (NCCL) weight sync or memory release on external engines (the rules refuse them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.backends.base import RolloutBackend, WeightSender

if TYPE_CHECKING:
    from slime.spec.layout import Layout
    from slime.spec.types import Spec

__all__ = ["ExternalEngines", "engine_secret", "external_urls"]


def external_urls(spec: Spec) -> list[str]:
    return [f"http://{a}" for a in spec.rollout.external]


def engine_secret(spec: Spec) -> str | None:
    """The token the job's engine clients send: None (the job's secret) unless the engines are external;
    then their token (``""``: none). A missing variable is an error naming the spec field."""
    r = spec.rollout
    if not r.external:
        return None
    if r.external_token_secret is None:
        return ""
    value = os.environ.get(r.external_token_secret)
    if not value:
        raise ValueError(
            f"rollout.external_token_secret: ${r.external_token_secret} is not set in the job "
            f"(cluster.secrets.{r.external_token_secret} exports it)"
        )
    return value


class ExternalEngines(RolloutBackend):
    """The job's view of engines it did not start (see the module doc)."""

    def __init__(self, spec: Spec) -> None:
        self.spec, self.urls = spec, external_urls(spec)
        self.frozen = spec.rollout.external_frozen
        self._pool: Any = None  # a ClientPool, made on the first call

    def start(
        self, spec: Spec, layout: Layout, placement: Any, model_dir: Path, *, log_dir: Path | None = None
    ) -> list[str]:
        timeout = spec.rollout.startup_timeout_s
        self._each(lambda c: c.wait_healthy(timeout_s=timeout))
        return list(self.urls)

    def _each(self, fn) -> list[Any]:
        from slime.backends.rollout.client import ClientPool, EngineClient

        if self._pool is None:
            self._pool = ClientPool([EngineClient(u, secret=engine_secret(self.spec)) for u in self.urls])
        return self._pool.each(fn)

    def update_weights(self, source: Path, version: int) -> None:
        if not self.frozen:  # frozen: the engines keep serving what they serve (samples say which version)
            self._each(lambda c: c.update_weights_from_disk(str(source), str(version)))

    def weight_sync_ranks(self) -> list[int]:
        return [1] * len(self.urls)

    def weight_sender(self) -> WeightSender:
        raise NotImplementedError("external engines take weights from disk (rollout.weight_sync: disk)")

    def release_memory(self, tags: list[str] | None = None) -> list[dict]:
        raise NotImplementedError("external engines are never colocated with the trainer")

    def resume_memory(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("external engines are never colocated with the trainer")

    def health(self) -> dict[str, bool]:
        return dict(zip(self.urls, self._each(lambda c: c.health())))

    def stop(self) -> None:
        """Close the connections; the engines keep running (the job did not start them)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
