"""A role's memory on one device as named terms in bytes (frozen), and GiB formatting."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GIB", "Breakdown", "gib"]

GIB = 1 << 30


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """``terms``: (name, bytes) in the order they are shown; ``notes``: what the numbers assume."""

    terms: tuple[tuple[str, int], ...]
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(b for _, b in self.terms)

    def get(self, name: str) -> int:
        return next((b for n, b in self.terms if n == name), 0)

    def largest(self, k: int = 3) -> list[tuple[str, int]]:
        return sorted((t for t in self.terms if t[1] > 0), key=lambda t: -t[1])[:k]

    def describe(self, k: int = 3) -> str:
        return ", ".join(f"{n} {gib(b)}" for n, b in self.largest(k))
