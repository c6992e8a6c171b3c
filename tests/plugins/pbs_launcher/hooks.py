"""The test PBS launcher's rules."""

from __future__ import annotations


def queue_named(s):
    if s.cluster.pbs.queue.strip() != s.cluster.pbs.queue or not s.cluster.pbs.queue:
        yield ("cluster.pbs.queue", f"PBS queue {s.cluster.pbs.queue!r} is not a queue name", "e.g. workq")


RULES = (queue_named,)
