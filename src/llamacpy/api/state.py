"""Saving and restoring a session: the KV cells in use (K/V rows, positions, sequences,
pending shifts) plus the token history and the last logits, as one picklable object with
llama-cpp-python's ``LlamaState`` attribute names."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .generation import Session


@dataclass
class LlamaState:
    """A snapshot of a :class:`~llamacpy.api.Llama` (``Llama.save_state``).

    ``llama_state`` holds the KV cache cells in use as an ``.npz`` blob.
    """

    input_ids: np.ndarray  # int32 [n_tokens]: the tokens in the cache
    scores: np.ndarray  # float32 [n, n_vocab]: kept logits (empty unless logits_all)
    n_tokens: int
    llama_state: bytes
    llama_state_size: int
    seed: int


def save_session(session: Session, seed: int) -> LlamaState:
    last = session.last_logits
    buf = io.BytesIO()
    np.savez(
        buf,
        **session.ctx.kv.get_state(),
        last_logits=np.zeros(0, np.float32) if last is None else last,
    )
    blob = buf.getvalue()
    n = len(session.tokens)
    scores = session.scores(0, min(n, session.n_scored)) if session.keep_logits else None
    return LlamaState(
        input_ids=np.array(session.tokens, np.intc),
        scores=np.array(scores) if scores is not None else np.zeros((0, 0), np.float32),
        n_tokens=n,
        llama_state=blob,
        llama_state_size=len(blob),
        seed=seed,
    )


def load_session(session: Session, state: LlamaState) -> None:
    try:
        z = dict(np.load(io.BytesIO(state.llama_state)))
    except (OSError, ValueError) as e:
        raise UsageError(f"not a llamacpy state: {e}") from None
    session.ctx.kv.set_state(z)  # checks the layout first: a bad state leaves the cache as is
    session.last_logits, session.n_scored = None, 0
    session.checkpoints = []  # states of the cache the loaded one replaced
    session.tokens = [int(t) for t in state.input_ids[: state.n_tokens]]
    last = z.get("last_logits", np.zeros(0, np.float32))
    session.last_logits = np.array(last) if last.size else None
    if session.keep_logits and state.scores.size:
        session.store_logits(0, state.scores[: state.n_tokens])
