"""Merge an agent session's turns into training samples (pure Python, no torch).

Turns form a tree: a turn whose prompt continues a node's tokens **extends** it; one whose prompt
matches up to the node's last response, re-tokenised within ``drift_threshold``, **realigns** it
(the drifted window and what follows get mask 0); anything else **forks** a new root. Each
root-to-leaf path is one :class:`TrajectorySample`. Guaranteed: only model tokens have mask 1,
each with the engine's log-prob in the context the sample holds; a turn shared by several paths
is trained in exactly one; over-long paths are cut and marked ``truncated``; the reward is copied.
Not guaranteed: semantic checks of messages, de-duplication of identical roots. See docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Placement",
    "TrajectorySample",
    "TrajectoryTree",
    "Turn",
    "merge_turns",
]

PlacementKind = Literal["root", "extend", "realign", "fork"]


@dataclass(frozen=True)
class Turn:
    """One engine call of an agent session (token ids, not text)."""

    prompt_token_ids: Sequence[int]
    response_token_ids: Sequence[int]
    response_logprobs: Sequence[float]
    weight_version: int
    parent: str | None = None
    messages: Sequence[Mapping[str, Any]] = ()
    truncated: bool = False  # the engine stopped at its length limit
    turn_id: str | None = None


@dataclass(frozen=True)
class Placement:
    """Where :meth:`TrajectoryTree.add_turn` put a turn, and why."""

    turn_id: str
    kind: PlacementKind
    parent: str | None
    realigned_tokens: int = 0
    reason: str = ""


@dataclass
class TrajectorySample:
    """One root-to-leaf path, ready to be converted to ``slime.rl.sample.Sample``."""

    tokens: list[int]
    prompt_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    weight_versions: list[int]
    status: Literal["completed", "truncated"]
    reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length


@dataclass
class _Span:
    """A turn's response inside one node's linearised sequence (absolute positions)."""

    turn_id: str
    start: int
    end: int
    realigned: int = 0  # tokens of this span overwritten by a realignment


@dataclass
class _Node:
    turn_id: str
    order: int
    turn: Turn
    parent: str | None
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    prompt_length: int  # of the root turn of this path
    spans: list[_Span]
    children: list[str] = field(default_factory=list)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_suffix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def _check_turn(turn: Turn) -> None:
    for name in ("prompt_token_ids", "response_token_ids"):
        seq = getattr(turn, name)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
            raise ValueError(f"Turn.{name} must be a sequence of int token ids")
    if len(turn.prompt_token_ids) == 0:
        raise ValueError("Turn.prompt_token_ids is empty; every engine call has a prompt")
    if len(turn.response_logprobs) != len(turn.response_token_ids):
        raise ValueError(
            f"Turn.response_logprobs has {len(turn.response_logprobs)} entries but "
            f"Turn.response_token_ids has {len(turn.response_token_ids)}; request log-probs "
            "for every generated token"
        )
    if not isinstance(turn.weight_version, int) or isinstance(turn.weight_version, bool):
        raise ValueError(f"Turn.weight_version must be an int, got {turn.weight_version!r}")


class TrajectoryTree:
    """The turns of one agent session; :meth:`samples` linearises its leaves."""

    def __init__(self, session_id: str = "", *, drift_threshold: int = 8) -> None:
        if drift_threshold < 0:
            raise ValueError(f"drift_threshold must be >= 0 (0 disables realignment), got {drift_threshold}")
        self.session_id = session_id
        self.drift_threshold = drift_threshold
        self._nodes: dict[str, _Node] = {}

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def roots(self) -> list[str]:
        return [n.turn_id for n in self._nodes.values() if n.parent is None]

    @property
    def leaves(self) -> list[str]:
        return [n.turn_id for n in self._nodes.values() if not n.children]

    def held_tokens(self, turn_id: str) -> list[int]:
        """The linearised tokens of the path ending at ``turn_id`` (copy)."""
        return list(self._node(turn_id).tokens)

    def _node(self, turn_id: str) -> _Node:
        try:
            return self._nodes[turn_id]
        except KeyError:
            raise KeyError(f"unknown turn id {turn_id!r} in session {self.session_id!r}") from None

    # -- placement ---------------------------------------------------------------

    def add_turn(self, turn: Turn) -> Placement:
        _check_turn(turn)
        turn_id = turn.turn_id if turn.turn_id is not None else f"t{len(self._nodes)}"
        if turn_id in self._nodes:
            raise ValueError(f"duplicate turn id {turn_id!r} in session {self.session_id!r}")
        prompt = list(turn.prompt_token_ids)
        if turn.parent is not None:
            candidates = [self._node(turn.parent)]
        else:
            # Newest first so that equal-depth ties go to the latest node.
            candidates = sorted(self._nodes.values(), key=lambda n: -n.order)

        best_extend: _Node | None = None
        for node in candidates:
            if len(node.tokens) <= len(prompt) and prompt[: len(node.tokens)] == node.tokens:
                if best_extend is None or len(node.tokens) > len(best_extend.tokens):
                    best_extend = node
        if best_extend is not None:
            self._attach_extend(turn_id, turn, best_extend, prompt)
            return Placement(turn_id, "extend", best_extend.turn_id)

        best: tuple[int, int, _Node, int, int, int] | None = None  # (window, |dk|, node, k, pre, suf)
        for node in candidates:
            found = self._drift(node, prompt)
            if found is not None and (best is None or found[:2] < best[:2]):
                best = (*found[:2], node, *found[2:])
        if best is not None:
            window, _, node, k, pre, suf = best
            self._attach_realign(turn_id, turn, node, prompt, k, pre, suf)
            return Placement(turn_id, "realign", node.turn_id, realigned_tokens=window)

        kind: PlacementKind = "fork" if self._nodes else "root"
        reason = ""
        if turn.parent is not None:
            reason = f"prompt does not continue parent {turn.parent!r}"
        elif self._nodes:
            reason = "prompt continues no node (history edited or drift beyond threshold)"
        self._attach_root(turn_id, turn, prompt)
        return Placement(turn_id, kind, None, reason=reason)

    def _drift(self, node: _Node, prompt: list[int]) -> tuple[int, int, int, int, int] | None:
        """Best realignment of ``node``'s last response inside ``prompt``, or None."""
        n_thr = self.drift_threshold
        if n_thr == 0 or not node.spans:
            return None
        last = node.spans[-1]
        s, h = last.start, last.end
        held = node.tokens
        if h != len(held) or len(prompt) < s or prompt[:s] != held[:s]:
            return None
        r = h - s
        a = s + _common_prefix(held[s:h], prompt[s:])
        best: tuple[int, int, int, int, int] | None = None
        for k in range(max(0, r - n_thr), r + n_thr + 1):
            if s + k > len(prompt):
                break
            pre = min(a - s, k, r)
            suf = _common_suffix(held[s + pre : h], prompt[s + pre : s + k], min(r, k) - pre)
            window = max(r - pre - suf, k - pre - suf)
            # pre + suf == 0 would "realign" a response that shares nothing with
            # the new prompt (e.g. a retry of the same prompt): that is a fork.
            if window == 0 or window > n_thr or pre + suf == 0:
                continue
            cand = (window, abs(k - r), k, pre, suf)
            if best is None or cand[:2] < best[:2]:
                best = cand
        return best

    def _register(self, node: _Node) -> None:
        self._nodes[node.turn_id] = node
        if node.parent is not None:
            self._nodes[node.parent].children.append(node.turn_id)

    def _attach(
        self,
        turn_id: str,
        turn: Turn,
        parent: _Node | None,
        prompt: list[int],
        mask: list[int],
        logprobs: list[float],
        spans: list[_Span],
    ) -> None:
        """Add a node holding ``prompt`` (its mask, log-probs, spans) plus this turn's response."""
        root = parent is None
        node = _Node(
            turn_id,
            len(self._nodes),
            turn,
            None if root else parent.turn_id,
            list(prompt),
            mask,
            logprobs,
            len(prompt) if root else parent.prompt_length,
            spans,
        )
        start = len(node.tokens)
        node.tokens.extend(turn.response_token_ids)
        node.mask.extend([1] * len(turn.response_token_ids))
        node.logprobs.extend(float(x) for x in turn.response_logprobs)
        node.spans.append(_Span(node.turn_id, start, len(node.tokens)))
        self._register(node)

    def _attach_root(self, turn_id: str, turn: Turn, prompt: list[int]) -> None:
        self._attach(turn_id, turn, None, prompt, [0] * len(prompt), [0.0] * len(prompt), [])

    def _attach_extend(self, turn_id: str, turn: Turn, parent: _Node, prompt: list[int]) -> None:
        tail = len(prompt) - len(parent.tokens)
        mask, logprobs = parent.mask + [0] * tail, parent.logprobs + [0.0] * tail
        spans = [_Span(**vars(sp)) for sp in parent.spans]
        self._attach(turn_id, turn, parent, prompt, mask, logprobs, spans)

    def _attach_realign(
        self, turn_id: str, turn: Turn, parent: _Node, prompt: list[int], k: int, pre: int, suf: int
    ) -> None:
        last = parent.spans[-1]
        s, h = last.start, last.end
        new_len = k - pre - suf  # tokens of the new prompt that replace the drifted window
        # after the window: the engine's log-probs, but for the original context (see the module doc): mask 0
        mask = parent.mask[: s + pre] + [0] * new_len + [0] * suf
        logprobs = parent.logprobs[: s + pre] + [0.0] * new_len + parent.logprobs[h - suf : h]
        tail = len(prompt) - (s + k)
        mask += [0] * tail
        logprobs += [0.0] * tail
        spans = [_Span(**vars(sp)) for sp in parent.spans]
        window = max(new_len, h - s - pre - suf)
        spans[-1] = _Span(last.turn_id, s, s + k, last.realigned + window)
        self._attach(turn_id, turn, parent, prompt, mask, logprobs, spans)

    # -- linearisation -------------------------------------------------------------

    def _path(self, leaf: _Node) -> list[_Node]:
        path = [leaf]
        while path[-1].parent is not None:
            path.append(self._nodes[path[-1].parent])
        return path[::-1]

    def samples(self, reward: float | None = None, *, max_length: int | None = None) -> list[TrajectorySample]:
        """One sample per leaf, in insertion order of the leaves."""
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        leaves = sorted((n for n in self._nodes.values() if not n.children), key=lambda n: n.order)
        limit = max_length if max_length is not None else None

        # Pick, for every turn, the one leaf that trains it.
        trainer: dict[str, tuple[tuple[int, int], str]] = {}
        for leaf in leaves:
            for sp in leaf.spans:
                cut = limit is not None and sp.end > limit
                key = (1 if (sp.realigned or cut) else 0, leaf.order)
                if sp.turn_id not in trainer or key < trainer[sp.turn_id][0]:
                    trainer[sp.turn_id] = (key, leaf.turn_id)

        out = []
        for leaf in leaves:
            path = self._path(leaf)
            versions = {n.turn_id: n.turn.weight_version for n in path}
            p = leaf.prompt_length
            end = len(leaf.tokens) if limit is None else min(len(leaf.tokens), limit)
            mask = list(leaf.mask)
            turns_meta = []
            for sp in leaf.spans:
                trained = trainer[sp.turn_id][1] == leaf.turn_id
                if not trained:
                    mask[sp.start : sp.end] = [0] * (sp.end - sp.start)
                turns_meta.append(
                    {
                        "turn_id": sp.turn_id,
                        "response_start": sp.start - p,
                        "response_end": sp.end - p,
                        "weight_version": versions[sp.turn_id],
                        "trained": trained,
                        "realigned_tokens": sp.realigned,
                    }
                )
            truncated = end < len(leaf.tokens) or leaf.turn.truncated
            start = min(p, end)
            out.append(
                TrajectorySample(
                    tokens=leaf.tokens[:end],
                    prompt_length=start,
                    loss_mask=mask[start:end],
                    rollout_log_probs=leaf.logprobs[start:end],
                    weight_versions=[n.turn.weight_version for n in path],
                    status="truncated" if truncated else "completed",
                    reward=reward,
                    metadata={
                        "session_id": self.session_id,
                        "leaf_turn_id": leaf.turn_id,
                        "path": [n.turn_id for n in path],
                        "turns": turns_meta,
                        "messages": list(leaf.turn.messages),
                    },
                )
            )
        return out


def merge_turns(
    turns: Iterable[Turn],
    *,
    reward: float | None = None,
    drift_threshold: int = 8,
    max_length: int | None = None,
    session_id: str = "",
) -> list[TrajectorySample]:
    """Build a :class:`TrajectoryTree` from ``turns`` (in order) and linearise it."""
    tree = TrajectoryTree(session_id, drift_threshold=drift_threshold)
    for turn in turns:
        tree.add_turn(turn)
    return tree.samples(reward, max_length=max_length)
