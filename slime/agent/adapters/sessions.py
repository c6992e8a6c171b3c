"""Agent sessions of an adapter server: tokens, turn caps, recording, drain on close.

``open(session_id)`` gives the token the agent uses as its API key; every request that reaches the
engine becomes one turn of the session's trajectory tree; ``close`` returns the tree and records.
Guaranteed: ``close`` refuses new requests at once and returns only after every admitted request
has recorded its turn or failed; admission and the in-flight count change with no ``await`` in
between; the turn cap counts turns in flight, so concurrent requests cannot overshoot it.
Runs on the server's event loop only (no locks). Not guaranteed: durability, fairness.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from slime.agent.trajectory import Placement, TrajectorySample, TrajectoryTree, Turn

__all__ = [
    "AdapterError",
    "Session",
    "SessionClosed",
    "SessionRegistry",
    "SessionResult",
    "TurnLimitExceeded",
    "TurnRecord",
    "UnknownSession",
]


class AdapterError(Exception):
    """A request the adapter refuses; ``status``/``code`` go into the protocol's error body."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class UnknownSession(AdapterError):
    status, code = 401, "unknown_session"


class SessionClosed(AdapterError):
    # 410, not 409: OpenAI/Anthropic SDKs retry 409 and 429, and retrying cannot help here.
    status, code = 410, "session_closed"


class TurnLimitExceeded(AdapterError):
    status, code = 403, "turn_limit_exceeded"


@dataclass(frozen=True)
class TurnRecord:
    """What the adapter saw for one turn (beyond the token-level ``Turn``)."""

    turn_id: str
    placement: Placement
    weight_version: str | None  # as the engine reported it
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    content: str
    tool_calls: list[dict[str, Any]]
    invalid_tool_calls: list[dict[str, Any]]
    protocol: str


@dataclass
class SessionResult:
    """A closed session: its trajectory tree and per-turn records (in recording order)."""

    session_id: str
    tree: TrajectoryTree
    records: list[TurnRecord]
    refused: int  # requests refused after close began or past the turn cap
    metadata: dict[str, Any] = field(default_factory=dict)

    def samples(self, reward: float | None = None, *, max_length: int | None = None) -> list[TrajectorySample]:
        return self.tree.samples(reward, max_length=max_length)


@dataclass
class Session:
    session_id: str
    token: str
    max_turns: int | None
    tree: TrajectoryTree
    metadata: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)  # overrides every request's sampling
    state: str = "open"  # open -> closing -> closed
    inflight: int = 0
    next_turn: int = 0
    records: list[TurnRecord] = field(default_factory=list)
    refused: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def admit(self) -> str:
        """Reserve one turn (synchronously) and return its turn id, or raise."""
        if self.state != "open":
            self.refused += 1
            raise SessionClosed(f"session {self.session_id!r} is {self.state}; it takes no new turns")
        if self.max_turns is not None and len(self.records) + self.inflight >= self.max_turns:
            self.refused += 1
            raise TurnLimitExceeded(
                f"session {self.session_id!r} reached its turn cap of {self.max_turns} (agent.max_turns)"
            )
        self.inflight += 1
        self.idle.clear()
        turn_id = f"t{self.next_turn}"
        self.next_turn += 1
        return turn_id

    def record(self, turn: Turn, record_fields: dict[str, Any]) -> TurnRecord:
        """Add an admitted turn to the tree (call :meth:`release` afterwards)."""
        if self.state == "closed":  # cannot happen while admitted turns are counted; guard anyway
            raise SessionClosed(f"session {self.session_id!r} closed before turn {turn.turn_id} was recorded")
        placement = self.tree.add_turn(turn)
        rec = TurnRecord(turn_id=placement.turn_id, placement=placement, **record_fields)
        self.records.append(rec)
        return rec

    def release(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()


class SessionRegistry:
    """Open sessions by id and by token (lives on the adapter's event loop)."""

    def __init__(
        self, *, default_max_turns: int | None = None, drift_threshold: int = 8, remember_closed: int = 100_000
    ) -> None:
        self.default_max_turns = default_max_turns
        self.drift_threshold = drift_threshold
        self._by_id: dict[str, Session] = {}
        self._by_token: dict[str, Session] = {}
        # Tokens of closed sessions, so late requests get "closed" rather than "unknown" (bounded).
        self._closed: OrderedDict[str, str] = OrderedDict()
        self._closed_ids: set[str] = set()
        self._remember_closed = remember_closed

    def __len__(self) -> int:
        return len(self._by_id)

    def open(
        self,
        session_id: str,
        *,
        max_turns: int | None = None,
        metadata: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> str:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session id must be a non-empty string, got {session_id!r}")
        if session_id in self._by_id or session_id in self._closed_ids:
            raise ValueError(f"session {session_id!r} already exists on this adapter; ids are single-use")
        limit = self.default_max_turns if max_turns is None else max_turns
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_turns must be a positive integer or None, got {limit!r}")
        token = f"sess-{secrets.token_urlsafe(24)}"
        sess = Session(
            session_id,
            token,
            limit,
            TrajectoryTree(session_id, drift_threshold=self.drift_threshold),
            dict(metadata or {}),
            dict(sampling or {}),
        )
        self._by_id[session_id] = sess
        self._by_token[token] = sess
        return token

    def lookup(self, token: str | None) -> Session:
        if not token:
            raise UnknownSession("no session token: send 'Authorization: Bearer <token>' or 'x-api-key: <token>'")
        sess = self._by_token.get(token)
        if sess is not None:
            return sess
        if token in self._closed:
            raise SessionClosed(f"session {self._closed[token]!r} is closed; it takes no new turns")
        raise UnknownSession("unknown session token")

    def get(self, session_id: str) -> Session:
        try:
            return self._by_id[session_id]
        except KeyError:
            raise KeyError(f"no open session {session_id!r} on this adapter") from None

    async def close(self, session_id: str, *, drain_timeout_s: float | None = None) -> SessionResult:
        """Refuse new turns, wait for admitted ones, forget the session, return its result.

        With ``drain_timeout_s`` a drain that takes longer raises ``TimeoutError``
        and leaves the session ``closing`` (call ``close`` again to keep waiting).
        """
        sess = self.get(session_id)
        sess.state = "closing"
        if drain_timeout_s is None:
            await sess.idle.wait()
        else:
            await asyncio.wait_for(sess.idle.wait(), drain_timeout_s)
        sess.state = "closed"
        self._by_id.pop(session_id, None)
        self._by_token.pop(sess.token, None)
        self._closed[sess.token] = session_id
        self._closed_ids.add(session_id)
        while len(self._closed) > self._remember_closed:
            self._closed_ids.discard(self._closed.popitem(last=False)[1])
        return SessionResult(session_id, sess.tree, list(sess.records), sess.refused, sess.metadata)
