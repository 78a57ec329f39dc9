"""Per-request statistics the scheduler keeps for ``/metrics``: histograms of time to first
token, inter-token latency, end-to-end latency, queue wait, prompt and generated tokens
(Prometheus' cumulative buckets), and counters of aborted requests and prompt-cache hits.

Written by the engine thread only; a reader on another thread may see one observation
half applied (a count ahead of its sum), which Prometheus tolerates between scrapes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# seconds: the buckets vLLM and Prometheus' client defaults cover between them
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
               1.0, 2.5)  # fmt: skip
# tokens: 1, 2, 5, 10, 20, 50, ... 50000, 100000
TOKEN_BUCKETS = (*(m * 10**e for e in range(5) for m in (1, 2, 5)), 10**5)


class Histogram:
    """Counts of observations at or below each bound (the last bucket is +Inf), their sum
    and count."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` rows as Prometheus writes them, +Inf last."""
        out, total = [], 0
        for b, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append(("+Inf" if b == float("inf") else f"{b:g}", total))
        return out


@dataclass
class RequestStats:
    ttft: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    inter_token: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    prompt_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    generated_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))
    n_aborted: int = 0
    n_cache_hits: int = 0  # requests that reused some of a slot's cached prompt
    n_cache_hit_tokens: int = 0

    def token(self, t_submit: float, t_last: float, now: float, first: bool) -> None:
        """A request sampled a token at ``now`` (its first: time to first token)."""
        if first:
            self.ttft.observe(now - t_submit)
        else:
            self.inter_token.observe(now - t_last)

    def ended(self, *, t_submit: float, t_start: float, t_end: float, n_prompt: int,
              n_cached: int, n_generated: int, aborted: bool) -> None:  # fmt: skip
        """A request is over (finished, stopped, aborted or failed)."""
        self.e2e.observe(t_end - t_submit)
        if t_start > 0.0:
            self.queue.observe(t_start - t_submit)
        self.prompt_tokens.observe(n_prompt)
        self.generated_tokens.observe(n_generated)
        if aborted:
            self.n_aborted += 1
        if n_cached > 0:
            self.n_cache_hits += 1
            self.n_cache_hit_tokens += n_cached
