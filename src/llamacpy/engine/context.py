"""A model plus a KV cache and scratch buffers: ``Context.decode(batch)`` -> logits.

>>> ctx = Context("model.gguf", ContextParams(n_ctx=2048))        # doctest: +SKIP
>>> logits = ctx.decode(Batch.from_tokens([1, 2, 3]))              # doctest: +SKIP

``decode`` checks the batch, splits it into ubatches, places each ubatch's tokens in cache
cells, builds the attention mask and runs the model's compiled forward pass; it returns the
logits of the tokens that asked for them, in batch order. On an error nothing is decoded
(a cache-full error in a later ubatch leaves the earlier ubatches' tokens in the cache, as
llama.cpp does).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from ..errors import UsageError
from ..gguf import GGUFModelFile
from ..models import load_model
from ..models.common import UBatchArrays
from ..ops.attention import KV_F16, KV_F32
from ..ops.norm import rms_norm_numpy
from .batch import Batch, UBatch, check_batch, distinct, split_batch, split_equal
from .embeddings import pool, resolve_pooling
from .iswa import ISWACache
from .kv_cache import KVCache
from .memory import Memory
from .params import ContextParams, physical_cores, setup_threads
from .recurrent import HybridMemory, RecurrentMemory

MODE_ROWS, MODE_TILED, MODE_SPLIT = 0, 1, 2
_TILED_MIN_TOKENS = 64  # ggml's flash-attention Q tile: ubatches this large use the tiled path
_SPLIT_MIN_KV = 512  # ... and single-token decodes over this many cells split the cache


class Context:
    """An inference context (see the module docstring)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str] | GGUFModelFile | None = None,
        params: ContextParams | None = None,
        *,
        model=None,
    ) -> None:
        self.params = params = params or ContextParams()
        params.check()
        t0 = time.perf_counter()
        auto = physical_cores()
        self.n_threads = setup_threads(params.threading_layer, params.n_threads or auto)
        self.n_threads_batch = setup_threads(
            params.threading_layer, params.n_threads_batch or params.n_threads or auto
        )
        if model is None:
            if model_path is None:
                raise UsageError("Context needs a model path or a loaded model")
            model = load_model(
                model_path, use_mmap=params.use_mmap, rope=params.rope, backend=params.backend
            )
        if params.kernel_formats == "all":
            model.use_all_kernels()
        self.model = model
        hp = model.hparams
        self.n_ctx = params.n_ctx or hp.n_ctx_train
        self.n_batch = min(params.n_batch, self.n_ctx)
        self.n_ubatch = min(params.n_ubatch, self.n_batch)
        self.kv = self._memory(model)
        if params.use_mlock:
            model.store.mlock()
        self.ws = model.workspace(self.n_ubatch, max(self.n_threads, self.n_threads_batch))
        self._lock = threading.Lock()
        self.load_time = time.perf_counter() - t0

    def _memory(self, model) -> Memory:
        """The model's memory: a :class:`HybridMemory` when it has recurrent layers, an
        :class:`ISWACache` when it has sliding-window layers, else the unified
        :class:`KVCache`."""
        hp, p = model.hparams, self.params
        kw = dict(type_k=p.type_k, type_v=p.type_v, n_seq_max=p.n_seq_max)
        recurrent = getattr(model, "layer_rec", ())
        if any(recurrent):
            return HybridMemory(
                recurrent, hp.n_head_kv, hp.n_embd_head_k, self.n_ctx, *model.state_sizes(),
                zeros=model.backend.zeros, **kw,
            )  # fmt: skip
        n_swa = getattr(model, "n_swa", 0)
        # the layers with cache rows of their own (gemma4's shared KV layers have none) and
        # the (KV heads, head size) of the global and the sliding-window ones
        layer_swa = getattr(model, "kv_layer_swa", (False,) * hp.n_layer)
        geo = getattr(model, "kv_geometry", ((hp.n_head_kv, hp.n_embd_head_k),) * 2)
        if n_swa > 0:
            return ISWACache(
                layer_swa, (geo[0][0], geo[1][0]), (geo[0][1], geo[1][1]), self.n_ctx, n_swa,
                n_ubatch=self.n_ubatch, swa_full=p.swa_full, zeros=model.backend.zeros, **kw,
            )  # fmt: skip
        return KVCache(
            len(layer_swa), geo[0][0], geo[0][1], self.n_ctx,
            zeros=model.backend.zeros, v_is_k=getattr(model, "kv_v_is_k", False),
            rope_offset=getattr(model, "kv_rope_offset", 0), **kw,
        )  # fmt: skip

    # ------------------------------------------------------------------ info
    @property
    def n_vocab(self) -> int:
        return self.model.hparams.n_vocab

    @property
    def n_seq_max(self) -> int:
        return self.params.n_seq_max

    def memory_report(self) -> dict[str, int]:
        """Bytes held by the weights (repacked), the KV cache and the scratch buffers."""
        ws = self.ws
        scratch = sum(a.nbytes for a in vars(ws).values() if isinstance(a, np.ndarray))
        scratch += sum(a.nbytes for t in (ws.acts, ws.acts_private, ws.thread) for a in t)
        return {"weights": self.model.store.nbytes, "kv_cache": self.kv.nbytes, "scratch": scratch}

    # ------------------------------------------------------------------ decoding
    def _check(self, batch: Batch, seq_pos_max) -> None:
        """:func:`check_batch` against this context's sizes (``seq_pos_max(s)``: the last
        position sequence ``s`` holds)."""
        check_batch(
            batch,
            n_vocab=self.n_vocab,
            n_batch=self.n_batch,
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            seq_pos_max=seq_pos_max,
        )

    def decode(
        self, batch: Batch, *, single_numerics: bool = False, equal_split: bool = False
    ) -> np.ndarray:
        """Decode a batch; returns float32 logits ``[n_outputs, n_vocab]``.

        ``single_numerics``: every token's logits are computed with the arithmetic of a
        one-token decode (the batch-invariant matmul kernels, one-token attention for each
        row), so they equal what decoding the tokens one by one would give: the
        verification of proposed tokens in speculative decoding, whose greedy output then
        equals plain decoding's.

        ``equal_split``: a batch of several sequences is cut into ubatches as llama.cpp
        cuts it when each sequence has its own cache stream (``batch.split_equal``), and
        the attention kernel is chosen by the tokens per sequence, as llama.cpp chooses it
        then (llama-perplexity's and llama-imatrix's batches: the same arithmetic)."""
        with self._lock:
            kv = self.kv
            self._check(batch, kv.seq_pos_max)
            kv.apply_shift(
                getattr(self.model, "rope_layers", self.model.rope), self._rope_factors()
            )
            ubs = (split_equal if equal_split else split_batch)(batch, self.n_ubatch)
            try:
                if len(ubs) == 1 and ubs[0].src is None:
                    return np.array(self._forward(ubs[0], single_numerics), copy=True)
                out = np.empty((batch.n_outputs, self.n_vocab), np.float32)
                rank = np.cumsum(batch.logits) - 1  # a token's row among the outputs
                row = 0
                for ub in ubs:
                    logits = self._forward(ub, single_numerics)
                    if ub.src is None:
                        out[row : row + len(logits)] = logits
                    else:
                        out[rank[ub.src[ub.out_idx]]] = logits
                    row += len(logits)
                return out
            except BaseException:
                self._undo(batch)
                raise

    def _undo(self, batch: Batch) -> None:
        """A decode that failed (or was interrupted) leaves the cache as before it: each
        sequence loses the positions the batch brought (they were all past its end). A
        recurrent state cannot give them back: such a sequence is forgotten whole."""
        seq, pos = batch.seq_id.reshape(-1), np.repeat(batch.pos, batch.seq_id.shape[1])
        for s in distinct(seq[seq >= 0]).tolist():
            if not self.kv.seq_rm(s, int(pos[seq == s].min()), -1):
                self.kv.seq_rm(s, -1, -1)

    def _forward(self, ub: UBatch, single: bool = False) -> np.ndarray:
        kv = self.kv
        n = len(ub)
        det = self.params.deterministic
        if single and n > 1 and not det:
            return self._forward_single(ub)
        sl = kv.prepare(ub, ordered=det)
        nth = self.n_threads if n == 1 else self.n_threads_batch
        rows = ub.n_seq_tokens or n  # (the attention's query rows per sequence stream)
        arrays = UBatchArrays(
            ub.token, ub.pos, sl.cells, sl.mask, sl.n_kv, ub.out_idx,
            sl.cells_swa, sl.mask_swa, sl.n_kv_swa,
            self._mode(n, sl.n_kv, rows), self._mode(n, sl.n_kv_swa, rows), sl.order,
            sl.order_swa,
            sl.rows,
        )  # fmt: skip
        return self.model.forward(self.ws, arrays, kv.forward_arrays(), nth, det)

    def _forward_single(self, ub: UBatch) -> np.ndarray:
        """A ubatch whose every row is computed as a one-token decode would compute it: the
        invariant matmul kernels, the one-token attention kernel over the range of cells that
        decode would have looked at (the used range padded to 256 grows as the rows are
        placed: rows that would have seen different ranges go in separate passes)."""
        kv = self.kv
        parts = (kv.base, kv.swa) if isinstance(kv, ISWACache) else (kv, kv)
        tops = [p.n_kv_top for p in parts] if all(isinstance(p, KVCache) for p in parts) else None
        sl = kv.prepare(ub, ordered=False)
        n = len(ub)
        if tops is None:  # (a recurrent memory: its attention layers' range as the batch's)
            ranges = np.array([[sl.n_kv, sl.n_kv_swa]] * n, np.int64)
        else:
            cols = []
            for part, top, cells in zip(parts, tops, (sl.cells, sl.cells_swa), strict=True):
                reach = np.maximum.accumulate(np.maximum(cells.astype(np.int64) + 1, top))
                cols.append([part.n_kv_for(int(r)) for r in reach])
            ranges = np.array(cols, np.int64).T
        out_idx, fa = ub.out_idx, kv.forward_arrays()
        rows: list[np.ndarray] = []
        a = 0
        while a < n:
            b = a + 1
            while b < n and (ranges[b] == ranges[a]).all():
                b += 1
            nk, nk_swa = int(ranges[a, 0]), int(ranges[a, 1])
            sel = out_idx[(out_idx >= a) & (out_idx < b)]
            arrays = UBatchArrays(
                ub.token[a:b], ub.pos[a:b], sl.cells[a:b], sl.mask[a:b, :nk], nk,
                (sel - a).astype(np.int32), sl.cells_swa[a:b], sl.mask_swa[a:b, :nk_swa],
                nk_swa, self._mode(1, nk), self._mode(1, nk_swa), None, None,
                None if sl.rows is None else sl.rows[a:b],
            )  # fmt: skip
            rows.append(self.model.forward(self.ws, arrays, fa, self.n_threads, True).copy())
            a = b
        return np.concatenate(rows) if len(rows) > 1 else rows[0]

    def _mode(self, n: int, n_kv: int, rows: int | None = None) -> int:
        """The attention kernel of a ubatch of ``n`` tokens over ``n_kv`` cells, ``rows`` of
        them per sequence stream (``n``: one stream) (llama.cpp's choice: tiled by the rows
        of a stream, the split decode for one token of one stream; a deterministic context
        attends every row alone, cells in position order)."""
        if self.params.deterministic:
            return MODE_ROWS
        # f16 K and V (an f32 cache is attended as f16: llama.cpp casts it before flash
        # attention)
        same = {self.kv.type_k, self.kv.type_v} <= {KV_F16, KV_F32}
        if (n if rows is None else rows) >= _TILED_MIN_TOKENS and same:
            return MODE_TILED
        if n == 1 and n_kv >= _SPLIT_MIN_KV and same:
            return MODE_SPLIT
        return MODE_ROWS

    # ------------------------------------------------------------------ memory (KV) ops
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return self.kv.seq_rm(seq_id, p0, p1)

    def n_keep(self, seq_id: int, n: int) -> int:
        """How many of a cached sequence's first ``n`` positions a continuation can keep
        (``n``, or 0 when a sliding-window cache no longer holds what it needs)."""
        return self.kv.n_keep(seq_id, n)

    @property
    def can_rewind(self) -> bool:
        """A sequence's last positions can be removed (``seq_rm(s, p, -1)``) and decoding
        continue from ``p``: not so for a memory with recurrent states."""
        return not isinstance(self.kv, HybridMemory | RecurrentMemory)

    @property
    def can_shift(self) -> bool:
        """Cached positions can be moved (``seq_add``, the keys re-roped): a KV cache that
        holds every position (not a window, as llama.cpp's iSWA unless ``--swa-full``, nor
        recurrent states). The servers' ``--cache-reuse`` needs it."""
        if isinstance(self.kv, ISWACache):
            return self.kv.swa.n_ctx == self.kv.base.n_ctx
        return isinstance(self.kv, KVCache)

    @property
    def can_snapshot(self) -> bool:
        """The memory keeps states that cannot be rewound, but can be copied and put back
        (:meth:`seq_snapshot`, :meth:`seq_restore`): the servers' prefix checkpoints."""
        return hasattr(self.kv, "snapshot")

    def seq_snapshot(self, seq_id: int) -> Any:
        return self.kv.snapshot(seq_id)

    def seq_restore(self, seq_id: int, snap: Any) -> int:
        """Back to a snapshot; returns the positions the sequence holds after it."""
        return self.kv.restore(seq_id, snap)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        self.kv.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.kv.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.kv.seq_add(seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.kv.seq_div(seq_id, p0, p1, d)

    def clear(self) -> None:
        self.kv.clear()

    # ------------------------------------------------------------------ embeddings
    @property
    def pooling_type(self) -> str:
        """The pooling :meth:`embed` applies (the context's, else the model's, else none)."""
        return resolve_pooling(self.params.pooling_type, getattr(self.model, "pooling_type", None))

    def encode(self, batch: Batch) -> np.ndarray:
        """Hidden states after the model's final norm of every token of ``batch``:
        float32 ``[n_tokens, n_embd]`` in batch order (llama.cpp's ``t_embd``).

        Encoder models (``model.causal`` false: bert) see the whole batch in one pass, each
        token attending to every token of its sequence, and use no KV cache; decoder models
        run through the KV cache as :meth:`decode` does (the tokens stay in the cache).
        """
        if not self.params.embeddings:
            raise UsageError("this context has no embeddings: create it with embeddings=True")
        with self._lock:
            kv = self.kv
            causal = getattr(self.model, "causal", True)
            self._check(batch, kv.seq_pos_max if causal else (lambda s: -1))
            n = len(batch)
            nth = self.n_threads if n == 1 else self.n_threads_batch
            if not causal:
                if n > self.n_ubatch:
                    raise UsageError(
                        f"the batch has {n} tokens, more than n_ubatch = {self.n_ubatch}: a "
                        "non-causal model sees each sequence whole; raise n_ubatch"
                    )
                self._threads(nth)
                h = self.model.encode(self.ws, batch.token, batch.pos, batch.seq_id[:, 0], nth)
                return np.array(h, np.float32)
            rope = getattr(self.model, "rope_layers", self.model.rope)
            kv.apply_shift(rope, self._rope_factors())
            out = np.empty((n, self.model.hparams.n_embd), np.float32)
            row = 0
            for ub in split_batch(batch, self.n_ubatch):
                ub.out_idx = np.zeros(0, np.int32)  # hidden states only: skip the output head
                self._forward(ub)
                out[row : row + len(ub)] = self._hidden_states(len(ub))
                row += len(ub)
            return out

    def _rope_factors(self) -> np.ndarray:
        """The model's rope frequency factors for this context's size (phi3: long or short)."""
        pick = getattr(self.model, "rope_factors", None)
        return self.model.freqs_arr if pick is None else pick(self.n_ctx)

    def _threads(self, nth: int) -> None:
        self.model.backend.set_threads(nth)

    def _hidden_states(self, n: int) -> np.ndarray:
        """The last ubatch's ``n`` hidden states after the final norm: the model's own
        ``hidden_states(ws, n)`` when it has one, else (llama-style models) the residual
        stream ``ws.x`` through the RMS ``output_norm``."""
        own = getattr(self.model, "hidden_states", None)
        if own is not None:
            return own(self.ws, n)
        m = self.model
        if not (hasattr(self.ws, "x") and hasattr(m, "output_norm")):
            raise UsageError(f"architecture {m.hparams.arch!r} cannot produce embeddings yet")
        e = m.hparams.n_embd
        w = m.store.fbuf[m.output_norm.offset : m.output_norm.offset + e]
        return rms_norm_numpy(self.ws.x[:n, :e], w, m.hparams.norm_rms_eps)

    def embed(self, tokens, pooling: str | None = None) -> np.ndarray:
        """Embedding of one token sequence: pooled ``[n_embd]``, or ``[n_tokens, n_embd]``
        with pooling ``none`` (no normalization; see :mod:`.embeddings`); with pooling
        ``rank`` the reranker's scores ``[n_cls_out]`` (see :mod:`..models.rank_head`). Uses
        sequence 0 from an empty cache and leaves the cache empty."""
        name = self.pooling_type if pooling is None else resolve_pooling(pooling, None)
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise UsageError("cannot embed an empty token sequence")
        head = self.rank_head() if name == "rank" else None
        self.kv.clear()
        try:
            h = self.encode(Batch.from_tokens(tokens, logits="none"))
        finally:
            self.kv.clear()
        if head is not None:  # the pair's CLS token (a causal reranker: its last token)
            causal = getattr(self.model, "causal", True)
            return head(pool(h, np.arange(len(tokens)), "last" if causal else "cls"))
        return pool(h, np.arange(len(tokens)), name)

    def rank_head(self):
        """The model's classifier head for rank pooling; a :class:`UsageError` if it has
        none."""
        head = getattr(self.model, "rank_head", None)
        if head is None:
            raise UsageError(
                f"rank pooling needs a reranker: this {self.model.hparams.arch} model has no "
                "classifier head (tensor 'cls.output.weight' or 'cls.weight')"
            )
        return head
