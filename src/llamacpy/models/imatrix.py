"""Importance-matrix collection: a block's forward that also sums the squares of every
matmul input, as llama-imatrix's callback does.

llama-imatrix adds, for every weight matrix ``blk.N.*`` that multiplies 16 rows or more,
``x[j]^2`` of each input row to that matrix's sums (float32, row after row) and counts the
rows. The matrices that read one input (attn_q, attn_k, attn_v) get the same sums, so the
collecting forward keeps one row of sums per (layer, input): :func:`collecting_block` puts
an ``im_*`` stage (:mod:`.stages`) where each input is complete, and :class:`ImatrixSums`
names the matrices of each row. The model's output matrix (``--process-output``) reads the
final norm's rows: the head sums those when the sums have a row for it.

A mixture of experts (``ffn_moe``) is collected per expert (``stages.im_moe``: llama-imatrix's
``mul_mat_id`` order, counts kept in the sums' last column). Blocks whose matmuls have no
collector yet (recurrent, latent-attention, shared-expert and gemma4 layers) are refused by
name before any compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from . import stages
from .spec import Branch

# stage -> the collector that runs right after it (its output is a matmul's input)
COLLECT_AFTER = {
    "attn_norm": "im_qkv_in",
    "attn_in": "im_qkv_x",
    "ffn_norm": "im_ffn_in",
    "ffn_in": "im_ffn_x",
    "ffn_post_attn_norm": "im_ffn_in",
    "ffn_swiglu": "im_down_in",
    "ffn_geglu": "im_down_in",
    "ffn_moe": "im_moe",
    "ffn_moe_keep": "im_moe",
}
# stage -> the collector that runs right before it (it reads the attention's output)
COLLECT_BEFORE = {
    "out_proj": "im_out_in",
    "out_proj_post_norm": "im_out_in",
    "out_proj_bias": "im_out_in",
}
# stages whose matmuls read an input collected above, or that run no matmul
COVERED = {
    "qkv",
    "qkv_bias",
    "qk_norm",
    "v_norm",
    "qk_norm_full",
    "rope",
    "scale_q",
    "kv_store",
    "attention",
    "ffn_down",
    "ffn_down_post_norm",
    "layer_scale",
    "ffn_router",  # (reads the FFN input: collected with ffn_gate/up)
}
# the tensors (``blk.N.<name>.weight``) that read each row's input
SLOT_TENSORS = {
    stages.IM_QKV: ("attn_q", "attn_k", "attn_v", "attn_qkv"),
    stages.IM_OUT: ("attn_output",),
    stages.IM_FFN: ("ffn_gate", "ffn_up", "ffn_gate_inp"),
    stages.IM_DOWN: ("ffn_down",),
}
# the experts' tensors: their rows of sums (0: gate/up's input, 1: down's), one per expert
EXPERT_TENSORS = {"ffn_gate_exps": 0, "ffn_up_exps": 0, "ffn_down_exps": 1}


def collecting_block(block: tuple, arch: str = "") -> tuple:
    """``block`` with the collectors inserted and without ``out_rows``: the last layer runs
    every row, as it does in llama-imatrix (which asks for every token's logits), while the
    head computes only the logits asked for; :class:`ModelError` for a stage whose matmul
    inputs are not collected."""
    out: list = []
    for el in block:
        name = el.flag if isinstance(el, Branch) else el
        if name == "out_rows":  # the last layer keeps every row (below)
            continue
        if isinstance(el, Branch) or not (
            name in COLLECT_AFTER or name in COLLECT_BEFORE or name in COVERED
        ):
            what = f"the {arch} block" if arch else "this block"
            raise ModelError(
                f"imatrix: {what} runs {name!r}, whose matmul inputs are not collected yet "
                "(recurrent, latent-attention, shared-expert and gemma4 layers are not "
                "supported)"
            )
        if name in COLLECT_BEFORE:
            out.append(COLLECT_BEFORE[name])
        out.append(name)
        if name in COLLECT_AFTER:
            out.append(COLLECT_AFTER[name])
    return tuple(out)


@dataclass
class ImatrixSums:
    """The sums the collecting forward adds to (``sums[IM_SLOTS * layer + slot, :k]``, the
    output's row last) and the rows counted for each."""

    sums: np.ndarray  # float32 [IM_SLOTS * n_layer + 1 + 2 * n_expert * n_layer, width + 1]
    counts: np.ndarray  # int64, per dense row of sums (experts: the sums' last column)
    n_layer: int
    n_expert: int = 0

    @classmethod
    def new(cls, n_layer: int, width: int, n_expert: int = 0) -> ImatrixSums:
        n = stages.IM_SLOTS * n_layer + 1
        rows = n + 2 * n_expert * n_layer
        return cls(np.zeros((rows, width + 1), np.float32), np.zeros(n, np.int64), n_layer,
                   n_expert)  # fmt: skip

    def expert_rows(self, layer: int, part: int) -> tuple[np.ndarray, np.ndarray]:
        """(sums [n_expert, width], counts [n_expert]) of a layer's experts: ``part`` 0 the
        gate/up input, 1 the down input."""
        r = stages.IM_SLOTS * self.n_layer + 1 + 2 * self.n_expert * layer + part * self.n_expert
        block = self.sums[r : r + self.n_expert]
        return block[:, :-1], block[:, -1].astype(np.int64)

    def count(self, n_tokens: int, n_out: int) -> None:
        """Count one ubatch: ``n_tokens`` rows in every layer's matmuls (the collecting
        block has no ``out_rows``: its last layer runs them all) and ``n_out`` in the
        output's; matmuls of under 16 rows are not collected."""
        lo = stages.IM_MIN_ROWS
        if n_tokens >= lo:
            self.counts[:-1] += n_tokens
        if n_out >= lo:
            self.counts[-1] += n_out

    def row(self, layer: int, slot: int) -> int:
        return stages.IM_SLOTS * layer + slot
