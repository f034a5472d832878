"""The uploader's commit budget: a token bucket of store commits, and the backoff after failures.

The Hub allows ~128 commits an hour per repo, shared by every run in it, so each run spends at most
``commits_per_hour`` (``artifacts.commits_per_hour``). ``burst`` tokens may be saved and spent back to
back; work that must go out regardless (the final checkpoint, required artifacts) still spends a token,
and the bucket may go below zero, so the hourly total stays near the budget. After a failure the
backoff doubles from ``backoff_s`` up to ``max_backoff_s`` and honours a store's Retry-After.

Not thread-safe on its own: the uploader calls it with its lock held.
"""

from __future__ import annotations

from collections.abc import Callable


class CommitBudget:
    def __init__(
        self,
        commits_per_hour: int,
        *,
        clock: Callable[[], float],
        burst: int | None = None,
        backoff_s: float = 2.0,
        max_backoff_s: float = 300.0,
    ):
        """``burst``: commits that may go back to back (default: a tenth of the hourly budget, 2..6)."""
        if commits_per_hour < 1:
            raise ValueError("commits_per_hour must be at least 1")
        self.commits_per_hour = commits_per_hour
        self.burst = burst if burst is not None else min(6, max(2, commits_per_hour // 10))
        self.reserve = 1 if self.burst >= 3 else 0  # tokens that progress commits leave to checkpoints
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.tokens = float(self.burst)
        self._clock = clock
        self._refilled_at = clock()
        self.backoff_until = 0.0
        self._failures = 0  # in a row

    def refill(self, now: float) -> None:
        rate = self.commits_per_hour / 3600.0
        self.tokens = min(float(self.burst), self.tokens + (now - self._refilled_at) * rate)
        self._refilled_at = now

    def has(self, n: float = 1.0) -> bool:
        return self.tokens >= n - 1e-9  # refills are floats: never chase the last ulp

    def until(self, n: float = 1.0) -> float:
        """Seconds until ``n`` tokens are there; at least 10 ms, since waits shrinking to zero would spin."""
        return max((n - self.tokens) * 3600.0 / self.commits_per_hour, 0.01)

    def spend(self) -> None:
        self.tokens -= 1.0

    def in_backoff(self, now: float) -> bool:
        return now < self.backoff_until

    def succeeded(self) -> None:
        self._failures = 0
        self.backoff_until = 0.0

    def failed(self, retry_after: float | None = None) -> float:
        """Start (or lengthen) the backoff after a failed commit; returns its length in seconds."""
        self._failures += 1
        delay = self.retry_delay(self._failures, retry_after)
        self.backoff_until = self._clock() + delay
        return delay

    def retry_delay(self, attempts: int, retry_after: float | None = None) -> float:
        """Exponential backoff after ``attempts`` failures, never shorter than the store's Retry-After."""
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempts - 1))
        return max(delay, float(retry_after or 0.0))
