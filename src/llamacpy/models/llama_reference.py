"""The numpy twin of the llama forward (:mod:`.stages`): the same pass, op by op, in numpy.

Slow and single-threaded; used by the tests to check the compiled forward (and, through it,
every kernel in its context). It reads and writes the same KV cache arrays and follows the
same numerics: q8 / q8_K activations, f16 cache rows, ggml's flash-attention regimes.
"""

from __future__ import annotations

import numpy as np

from ..ops.activations import swiglu_numpy
from ..ops.attention_ref import attention_numpy, load_rows_numpy, store_row_numpy
from ..ops.dequant import dequantize_repacked_numpy
from ..ops.matmul import block_mins, matmul_numpy
from ..ops.norm import rms_norm_numpy
from ..ops.rope import rope_numpy
from .common import UBatchArrays
from .llama import LlamaModel

_F32 = np.float32


class Reference:
    """Dequantized weights of a model (float32), kept for repeated reference passes."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        st = model.store
        self._w: dict[int, np.ndarray] = {}
        self._mins: dict[int, np.ndarray | None] = {}
        self._buf, self._desc, self._f = st.buf, st.desc, st.fbuf

    def w(self, m) -> np.ndarray:
        if m.index not in self._w:
            t, off, nrows, ncols = (int(v) for v in self._desc[m.index])
            self._w[m.index] = dequantize_repacked_numpy(self._buf[off:], t, nrows, ncols)
        return self._w[m.index]

    def vec(self, v) -> np.ndarray:
        return self._f[v.offset : v.offset + v.size]

    def mm(self, m, x: np.ndarray) -> np.ndarray:
        if m.index not in self._mins:
            t, off, nrows, ncols = (int(v) for v in self._desc[m.index])
            self._mins[m.index] = block_mins(self._buf[off:], t, nrows, ncols)
        return matmul_numpy(None, m.type, m.nrows, m.ncols, x, self.w(m), self._mins[m.index])

    # ------------------------------------------------------------------ forward
    def forward(self, ub: UBatchArrays, kv: tuple, mode: int, n_threads: int = 2):
        """Logits ``[n_out, n_vocab]`` of the ubatch; writes the ubatch's K/V into ``kv``."""
        m, hp = self.model, self.model.hparams
        kc, vc, info = kv
        k_type, v_type, rowb, n_ctx = (int(v) for v in info[:4])
        kc = kc.reshape(hp.n_layer, hp.n_head_kv, n_ctx, rowb)  # flat views -> cells
        vc = vc.reshape(hp.n_layer, hp.n_head_kv, n_ctx, rowb)
        n, d, nh, nkv = len(ub.tokens), hp.n_embd_head_k, hp.n_head, hp.n_head_kv
        eps = _F32(hp.norm_rms_eps)
        x = self.w(m.token_embd)[ub.tokens].copy()
        for li, b in enumerate(m.blk):
            h = rms_norm_numpy(x, self.vec(b.attn_norm), eps)
            q = self.mm(b.attn_q, h).reshape(n, nh, d)
            k = self.mm(b.attn_k, h).reshape(n, nkv, d)
            v = self.mm(b.attn_v, h).reshape(n, nkv, d)
            q = rope_numpy(q, ub.pos, m.rope, m.rope_freqs)
            k = rope_numpy(k, ub.pos, m.rope, m.rope_freqs)
            for t in range(n):
                for hk in range(nkv):
                    store_row_numpy(kc[li, hk, ub.cells[t]], k[t, hk], k_type)
                    store_row_numpy(vc[li, hk, ub.cells[t]], v[t, hk], v_type)
            keys = np.stack(
                [load_rows_numpy(kc[li, hk, : ub.n_kv], d, k_type) for hk in range(nkv)]
            )
            vals = np.stack(
                [load_rows_numpy(vc[li, hk, : ub.n_kv], d, v_type) for hk in range(nkv)]
            )
            att = attention_numpy(
                q,
                keys,
                vals,
                ub.mask[:, : ub.n_kv],
                k_type,
                v_type,
                mode,
                n_threads,
                _F32(1.0) / np.sqrt(_F32(d)),
            )
            x = x + self.mm(b.attn_output, att.reshape(n, nh * d))
            h = rms_norm_numpy(x, self.vec(b.ffn_norm), eps)
            g, u = self.mm(b.ffn_gate, h), self.mm(b.ffn_up, h)
            x = x + self.mm(b.ffn_down, swiglu_numpy(g, u))
        out = rms_norm_numpy(x[ub.out_idx], self.vec(m.output_norm), eps)
        return self.mm(m.output, out)
