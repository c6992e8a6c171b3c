"""Map a failure of the run to an exit code and a one-line message.

0 ok · 1 a bug (traceback printed) · 2 bad input (spec, data, plug-in, checkpoint) · 3 infrastructure
(Ray, placement, engines, timeouts) · 75 stopped after a checkpoint (``state.EXIT_REQUEUE``). Errors
raised inside Ray actors arrive wrapped (``RayTaskError``) with the whole remote traceback as their
text; :func:`root_cause` unwraps them so the user sees the original message.
"""

from __future__ import annotations

from slime.runtime.state import EXIT_FAILED, EXIT_INFRA, EXIT_SPEC

__all__ = ["classify", "root_cause"]


def classify(exc: BaseException) -> int:
    from slime.errors import InfraError
    from slime.registry import UnknownPlugin

    try:
        from slime.placement import PlacementError
    except ImportError:  # pragma: no cover
        PlacementError = InfraError  # type: ignore[assignment,misc]
    if isinstance(exc, (InfraError, PlacementError, TimeoutError, ConnectionError)):
        return EXIT_INFRA
    if isinstance(exc, (ValueError, UnknownPlugin, FileNotFoundError)):
        return EXIT_SPEC
    try:
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError):
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            return classify(cause) if cause is not None else EXIT_FAILED
        if isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)):
            return EXIT_INFRA
    except ImportError:  # pragma: no cover
        pass
    return EXIT_FAILED


def root_cause(exc: BaseException) -> BaseException:
    """The user's exception inside a Ray task error (whose text is a whole remote traceback)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
