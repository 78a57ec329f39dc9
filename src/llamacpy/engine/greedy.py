"""A minimal greedy generation loop (for tests and benchmarks; sampling lives elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .batch import Batch
from .context import Context


def generate(
    ctx: Context, tokens: Sequence[int], n: int, seq_id: int = 0, stop: Sequence[int] = ()
) -> list[int]:
    """Greedy (argmax) continuation of ``tokens`` by ``n`` tokens in sequence ``seq_id``,
    starting after what the cache already holds for that sequence; stops early after a
    token in ``stop``."""
    pos = ctx.kv.seq_pos_max(seq_id) + 1
    logits = ctx.decode(Batch.from_tokens(list(tokens), pos0=pos, seq_id=seq_id))
    pos += len(tokens)
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(logits[-1]))
        out.append(tok)
        if tok in stop or len(out) == n:
            break
        logits = ctx.decode(Batch.from_tokens([tok], pos0=pos, seq_id=seq_id))
        pos += 1
    return out
