"""Phi-3 (``Phi3ForCausalLM``) -> ``phi3``: fused ``qkv_proj`` and ``gate_up_proj`` kept
fused; LongRoPE factors become ``rope_factors_long``/``rope_factors_short`` tensors."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..common import ConvertError, read_json_if_exists
from ..kv import KV, T
from .base import Lazy, TextArch

PHI3_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "model.layers.{bid}.input_layernorm": "blk.{bid}.attn_norm",
    "model.layers.{bid}.self_attn.qkv_proj": "blk.{bid}.attn_qkv",
    "model.layers.{bid}.self_attn.q_proj": "blk.{bid}.attn_q",
    "model.layers.{bid}.self_attn.k_proj": "blk.{bid}.attn_k",
    "model.layers.{bid}.self_attn.v_proj": "blk.{bid}.attn_v",
    "model.layers.{bid}.self_attn.o_proj": "blk.{bid}.attn_output",
    "model.layers.{bid}.post_attention_layernorm": "blk.{bid}.ffn_norm",
    "model.layers.{bid}.mlp.gate_up_proj": "blk.{bid}.ffn_up",
    "model.layers.{bid}.mlp.up_proj": "blk.{bid}.ffn_up",
    "model.layers.{bid}.mlp.down_proj": "blk.{bid}.ffn_down",
}


class Phi3(TextArch):
    arch = "phi3"
    hf_architectures = ("Phi3ForCausalLM",)
    names = PHI3_NAMES

    def _dims(self) -> tuple[int, int, int, int]:
        n_embd = int(self.need("hidden_size", "n_embd"))
        n_head = int(self.need("num_attention_heads", "n_head"))
        if "original_max_position_embeddings" not in self.rope:
            raise ConvertError("config.json has no original_max_position_embeddings")
        rope_dims = int(self.rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head
        n_ctx = int(self.need("n_positions", "max_position_embeddings"))
        return n_embd, n_head, rope_dims, n_ctx

    def set_params(self, kv: KV, ftype: int) -> None:
        a = kv.add_arch
        n_embd, n_head, rope_dims, n_ctx = self._dims()
        a("context_length", n_ctx, T.UINT32)
        a("rope.scaling.original_context_length", self.rope["original_max_position_embeddings"],
          T.UINT32)  # fmt: skip
        a("embedding_length", n_embd, T.UINT32)
        a("feed_forward_length", self.need("intermediate_size"), T.UINT32)
        a("block_count", self.block_count, T.UINT32)
        a("attention.head_count", n_head, T.UINT32)
        a("attention.head_count_kv", self.need("num_key_value_heads", "n_head_kv"), T.UINT32)
        a("attention.layer_norm_rms_epsilon", self.need("rms_norm_eps"), T.FLOAT32)
        a("rope.dimension_count", rope_dims, T.UINT32)
        rp = self.rope.get("full_attention", self.rope)
        if "rope_theta" not in rp:
            raise ConvertError("config.json has no rope_theta")
        a("rope.freq_base", rp["rope_theta"], T.FLOAT32)
        kv.add("general.file_type", ftype, T.UINT32)
        a("attention.sliding_window", self.hp.get("sliding_window") or 0, T.UINT32)

    def extra_tensors(self, kv: KV) -> Iterable[tuple[str, Lazy]]:
        _, _, rope_dims, n_ctx = self._dims()
        long_f, short_f = self.rope.get("long_factor"), self.rope.get("short_factor")
        if not long_f:
            return
        orig = self.rope["original_max_position_embeddings"]
        scale = n_ctx / orig
        kind = str(self.rope.get("rope_type", "")).lower()
        if not kind:
            raise ConvertError("config.json's rope_scaling has no type")
        if kind in ("su", "longrope"):
            attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        elif kind == "yarn":
            attn = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
        else:
            raise ConvertError(f"RoPE scaling type {kind!r} is not supported for Phi-3")
        kv.add_arch("rope.scaling.attn_factor", attn, T.FLOAT32)
        if long_f is None or short_f is None:
            raise ConvertError("rope_scaling needs both long_factor and short_factor")
        if len(long_f) != len(short_f) or len(long_f) != rope_dims / 2:
            raise ConvertError(
                f"rope long/short factors must have {rope_dims // 2} values "
                f"(have {len(long_f)} and {len(short_f)})"
            )
        yield "rope_factors_long.weight", Lazy.const(np.array(long_f, dtype=np.float32))
        yield "rope_factors_short.weight", Lazy.const(np.array(short_f, dtype=np.float32))

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_gpt2, write_spm

        tc = read_json_if_exists(self.dir / "tokenizer_config.json")
        if isinstance(tc, dict) and tc.get("tokenizer_class") == "GPT2Tokenizer":
            set_vocab_gpt2(kv, self.dir, self.hp)
            return
        write_spm(kv, self.dir, *phi3_spm_vocab(self))


def phi3_spm_vocab(arch: Phi3) -> tuple[list[str], list[float], list[int]]:
    """Phi-3's own variant of the SentencePiece vocabulary (added tokens from
    tokenizer_config.json and tokenizer.json override the pieces)."""
    from ..spm_model import SentencePieceModel
    from ..vocab import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

    path = arch.dir / "tokenizer.model"
    if not path.is_file():
        raise ConvertError(f"{path}: file not found (Phi-3 needs its SentencePiece model)")
    sp = SentencePieceModel.load(path)
    n = int(arch.hp.get("vocab_size", len(sp)))
    tokens = [f"[PAD{i}]" for i in range(n)]
    scores, types = [-10000.0] * n, [UNUSED] * n
    for i, (piece, score, ptype) in enumerate(zip(sp.pieces, sp.scores, sp.types)):
        if i >= n:
            raise ConvertError(f"tokenizer.model has more pieces than vocab_size {n}")
        tokens[i], scores[i] = piece, score
        types[i] = ptype if ptype in (UNKNOWN, CONTROL, UNUSED, BYTE) else NORMAL

    def override(tid: int, content: str, special: bool) -> None:
        if not 0 <= tid < n:
            raise ConvertError(f"added token {content!r} has id {tid} >= vocab_size {n}")
        tokens[tid], scores[tid] = content, -1000.0
        types[tid] = CONTROL if special else USER_DEFINED

    for content, tid in (read_json_if_exists(arch.dir / "added_tokens.json") or {}).items():
        if 0 <= tid < n:
            tokens[tid], scores[tid], types[tid] = content, -1000.0, USER_DEFINED
    tc = read_json_if_exists(arch.dir / "tokenizer_config.json") or {}
    for tid, data in (tc.get("added_tokens_decoder") or {}).items():
        override(int(tid), str(data["content"]), bool(data.get("special")))
    tj = read_json_if_exists(arch.dir / "tokenizer.json") or {}
    for data in tj.get("added_tokens") or []:
        override(int(data["id"]), str(data["content"]), bool(data.get("special")))
    return tokens, scores, types
