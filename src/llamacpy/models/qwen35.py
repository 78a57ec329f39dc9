"""The ``qwen35`` architecture (Qwen3.5 / Qwen3.6 dense), as llama.cpp runs it: a hybrid of
Gated DeltaNet linear attention and gated full attention.

Layer ``il`` is full attention when ``(il + 1) % full_attention_interval == 0`` (every
fourth layer; a file's ``attention.recurrent_layers`` flags, when present, say it layer by
layer, as llama.cpp reads them), else a Gated DeltaNet layer with a recurrent state per sequence (the
engine's hybrid memory: KV cells for the attention layers, a convolution row and a
delta-rule row per sequence for the others). Each block is

* ``h = rms_norm(x) * attn_norm``;
* a Gated DeltaNet layer: the channels ``h . attn_qkv`` (queries' keys, keys, values) through
  a short causal convolution of ``ssm.conv_kernel`` taps and SiLU; q and k L2-normed per
  key head; per value head (``ssm.time_step_rank`` of them, key heads broadcast tiled) the
  gated delta rule with ``beta = sigmoid(h . ssm_beta)`` and the decay ``g =
  softplus(h . ssm_alpha + ssm_dt) * ssm_a``; ``rms_norm(o) * ssm_norm * silu(h .
  attn_gate)``; ``x += o . ssm_out``;
* or gated attention: ``attn_q`` gives each head's query and an output gate; Q/K RMS
  norms; neox rope over the first ``rope.dimension_count`` dimensions (the multi-section
  rope of the file, with one position for every section, is that rope); attention over
  the KV cache; ``x += (att * sigmoid(gate)) . attn_output``;
* ``x += ffn_down(silu(ffn_gate(h)) * ffn_up(h))`` with ``h = rms_norm(x) *
  post_attention_norm``.

The numpy specification is :mod:`.reference`'s stages (the layer's steps in
:mod:`.delta_net_ref`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import ModelError
from ..hparams import HParams
from .decoder import Decoder
from .spec import Branch, Param, Tensor

DELTA_NET_TENSORS = (
    Tensor("blk.{i}.attn_qkv.weight", ("n_embd", "ssm_channels"), optional=True),
    Tensor("blk.{i}.attn_gate.weight", ("n_embd", "ssm_d_inner"), optional=True),
    Tensor("blk.{i}.ssm_conv1d.weight", ("ssm_d_conv", "ssm_channels"), optional=True, flat=True),
    Tensor("blk.{i}.ssm_dt.bias", ("ssm_dt_rank",), optional=True),
    Tensor("blk.{i}.ssm_a", ("ssm_dt_rank",), optional=True),
    Tensor("blk.{i}.ssm_beta.weight", ("n_embd", "ssm_dt_rank"), optional=True),
    Tensor("blk.{i}.ssm_alpha.weight", ("n_embd", "ssm_dt_rank"), optional=True),
    Tensor("blk.{i}.ssm_norm.weight", ("ssm_head_v",), optional=True),
    Tensor("blk.{i}.ssm_out.weight", ("ssm_d_inner", "n_embd"), optional=True),
)
ATTENTION_TENSORS = (
    Tensor("blk.{i}.attn_q.weight", ("n_embd", "n_embd_q*2"), optional=True),  # query | gate
    Tensor("blk.{i}.attn_k.weight", ("n_embd", "n_embd_k_gqa"), optional=True),
    Tensor("blk.{i}.attn_v.weight", ("n_embd", "n_embd_v_gqa"), optional=True),
    Tensor("blk.{i}.attn_output.weight", ("n_embd_o", "n_embd"), optional=True),
    Tensor("blk.{i}.attn_q_norm.weight", ("n_embd_head_k",), optional=True),
    Tensor("blk.{i}.attn_k_norm.weight", ("n_embd_head_k",), optional=True),
)
COMMON_TENSORS = (
    Tensor("token_embd.weight", ("n_embd", "n_vocab")),
    Tensor("output_norm.weight", ("n_embd",)),
    Tensor("output.weight", ("n_embd", "n_vocab"), optional=True),  # absent: tied
    Tensor("blk.{i}.attn_norm.weight", ("n_embd",)),
    Tensor("blk.{i}.post_attention_norm.weight", ("n_embd",), as_field="ffn_norm"),
    Tensor("blk.{i}.ffn_gate.weight", ("n_embd", "n_ff")),
    Tensor("blk.{i}.ffn_up.weight", ("n_embd", "n_ff")),
    Tensor("blk.{i}.ffn_down.weight", ("n_ff", "n_embd")),
)


class Qwen35Model(Decoder):
    arch = "qwen35"
    tensors = COMMON_TENSORS + DELTA_NET_TENSORS + ATTENTION_TENSORS
    params = (
        Param("ssm_d_conv", "ssm.conv_kernel", kind=int, minimum=2),
        Param("ssm_d_state", "ssm.state_size", kind=int, minimum=1),
        Param("ssm_n_group", "ssm.group_count", kind=int, minimum=1),
        Param("ssm_dt_rank", "ssm.time_step_rank", kind=int, minimum=1),
        Param("ssm_d_inner", "ssm.inner_size", kind=int, minimum=1),
        Param("full_attention_interval", "full_attention_interval", 4, int, 1),
        # multi-token-prediction blocks after the trunk (drafting): not loaded, as llama.cpp
        Param("n_nextn", "nextn_predict_layers", 0, int, 0),
    )
    unsupported = ("ffn_gate_inp.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias")
    block = (
        "attn_norm",  # h = rms_norm(x) * attn_norm
        Branch(
            "recurrent",
            (
                "delta_net_in",  # channels, z, beta, alpha = h . attn_qkv, attn_gate, ...
                "delta_net_conv",  # causal conv over the state row, SiLU; beta, decay g
                "delta_net_rule",  # L2 norms, gated delta rule, rms_norm(o) * silu(z)
                "delta_net_out",  # x += o . ssm_out
            ),
            (
                "qkv",  # q | gate, k, v = h . attn_q, attn_k, attn_v
                "q_gate",  # queries and gates apart
                "qk_norm",
                "rope",
                "kv_store",
                "attention",
                "attn_gate",  # att *= sigmoid(gate)
                "out_proj",  # x += att . attn_output
            ),
        ),
        "out_rows",
        "ffn_norm",  # h = rms_norm(x) * post_attention_norm
        "ffn_swiglu",
        "ffn_down",
    )
    rope_neox = True
    partial_rope = True

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        hp = super().derived(hp)
        x = hp.extra
        inner, heads, state = x["ssm_d_inner"], x["ssm_dt_rank"], x["ssm_d_state"]
        a = cls.arch
        if inner != heads * state:  # llama.cpp: key and value heads both of ssm.state_size
            raise ModelError(
                f"{a}.ssm.inner_size ({inner}) must be {a}.ssm.time_step_rank ({heads}, the "
                f"value heads) x {a}.ssm.state_size ({state}, their size)"
            )
        head_v = state
        if state % 16:
            raise ModelError(
                f"unsupported shape: the delta rule's head size ({a}.ssm.state_size = "
                f"{state}) must be a multiple of 16"
            )
        n_nextn = x["n_nextn"]
        if n_nextn >= hp.n_layer:
            raise ModelError(
                f"{a}.nextn_predict_layers ({n_nextn}) leaves no trunk of the {hp.n_layer} blocks"
            )
        hp = replace(hp, n_layer=hp.n_layer - n_nextn)  # the trunk
        channels = inner + 2 * x["ssm_n_group"] * state
        return hp.with_extra(
            {"ssm_channels": channels, "ssm_head_v": head_v, "attn_output_gate": 1}
        )

    @classmethod
    def recurrent_layers(cls, md: Mapping, hp: HParams) -> HParams:
        """``hp`` with each trunk layer's kind (``extra["recurrent_layers"]``): the file's
        ``attention.recurrent_layers`` (one flag per block, the multi-token-prediction
        blocks too) when it has one, as llama.cpp, else every ``full_attention_interval``-th
        layer full attention."""
        key = f"{cls.arch}.attention.recurrent_layers"
        flags = md.get(key)
        n_all = hp.n_layer + hp.extra["n_nextn"]
        if flags is None:
            interval = hp.extra["full_attention_interval"]
            rec = tuple((il + 1) % interval != 0 for il in range(hp.n_layer))
        elif isinstance(flags, str) or not hasattr(flags, "__len__") or len(flags) != n_all:
            raise ModelError(f"metadata key {key!r} must hold one flag per block ({n_all})")
        else:
            rec = tuple(bool(f) for f in flags[: hp.n_layer])
        return hp.with_extra({"recurrent_layers": rec})

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The declarations' checks, then each layer's own tensors by its kind."""
        hp = cls.recurrent_layers(md, super().check(md, shapes))
        for il in range(hp.n_layer):
            kind = DELTA_NET_TENSORS if hp.extra["recurrent_layers"][il] else ATTENTION_TENSORS
            for t in kind:
                name = t.name.format(i=il)
                if name not in shapes:
                    what = "Gated DeltaNet" if kind is DELTA_NET_TENSORS else "full-attention"
                    raise ModelError(
                        f"tensor {name!r} is missing (layer {il} is a {what} layer of {cls.arch})"
                    )
        return hp

    def layer_recurrent(self, il: int) -> bool:
        return self.hparams.extra["recurrent_layers"][il]

    def state_sizes(self) -> tuple[int, int]:
        """Floats of a layer's convolution row and of its delta-rule row (per sequence)."""
        x = self.hparams.extra
        return (x["ssm_d_conv"] - 1) * x["ssm_channels"], (
            x["ssm_dt_rank"] * x["ssm_head_v"] * x["ssm_d_state"]
        )


MODEL = Qwen35Model
