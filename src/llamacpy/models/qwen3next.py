"""The ``qwen3next`` architecture (Qwen3-Next-80B-A3B), as llama.cpp runs it: the hybrid of
Gated DeltaNet and gated full attention layers of :mod:`.qwen35moe` (Qwen3.5 is its
successor), with Qwen3-Next's own layout of the Gated DeltaNet's projections.

What differs from qwen35moe (llama.cpp's ``src/models/qwen3next.cpp``):

* beta and alpha come as one matrix ``ssm_ba`` ``[n_embd, 2 * H_v]`` whose rows are
  grouped by key head: for each of the ``H_k`` key heads, the betas of its ``H_v / H_k``
  value heads, then their alphas;
* the value heads of a key head are together (value head ``h`` reads key head ``h // (H_v /
  H_k)``; llama.cpp repeats each key head), where qwen35's are tiled (``h % H_k``);
* the channels and the output gate come as qwen35's ``attn_qkv`` / ``attn_gate`` (what the
  converter writes), or in files of the older layout as one ``ssm_in`` ``[n_embd, 2 * H_k *
  S_k + 2 * H_v * S_v]`` whose rows are, per key head, its q | k | v | z (a file with both
  runs ``attn_qkv``, as llama.cpp);
* the rope is plain neox over ``rope.dimension_count`` (no sections);
* every layer's FFN is the routed experts plus the sigmoid-gated shared expert (as
  qwen35moe: ``expert_count`` must be set).

Layer ``il`` is full attention when ``(il + 1) % full_attention_interval == 0`` or as the
file's ``attention.recurrent_layers`` says (what the converter writes). The stages
that differ are ``delta_net_in_grouped``, ``delta_net_conv_grouped`` and
``delta_net_rule_grouped`` (numpy twins in :mod:`.reference`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ModelError
from ..hparams import HParams
from . import stages
from .moe import with_experts
from .qwen35 import ATTENTION_TENSORS, COMMON_TENSORS, Qwen35Model
from .qwen35moe import SHARED_EXPERT_TENSORS, Qwen35MoEModel
from .spec import Branch, Tensor

DELTA_NET_TENSORS = (
    Tensor("blk.{i}.attn_qkv.weight", ("n_embd", "ssm_channels"), optional=True),
    Tensor("blk.{i}.attn_gate.weight", ("n_embd", "ssm_d_inner"), optional=True),
    Tensor("blk.{i}.ssm_in.weight", ("n_embd", "qkvz_width"), optional=True),  # older files
    Tensor("blk.{i}.ssm_conv1d.weight", ("ssm_d_conv", "ssm_channels"), optional=True, flat=True),
    Tensor("blk.{i}.ssm_dt.bias", ("ssm_dt_rank",), optional=True),
    Tensor("blk.{i}.ssm_a", ("ssm_dt_rank",), optional=True),
    # per key head: its value heads' betas, then their alphas
    Tensor(
        "blk.{i}.ssm_ba.weight",
        ("n_embd", "ssm_dt_rank*2"),
        optional=True,
        as_field="ssm_beta",
    ),
    Tensor("blk.{i}.ssm_norm.weight", ("ssm_head_v",), optional=True),
    Tensor("blk.{i}.ssm_out.weight", ("ssm_d_inner", "n_embd"), optional=True),
)
# what every Gated DeltaNet layer needs besides its channels (attn_qkv + attn_gate or ssm_in)
_NEEDED = ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a", "ssm_ba.weight",
           "ssm_norm.weight", "ssm_out.weight")  # fmt: skip
_GROUPED = {f"delta_net_{s}": f"delta_net_{s}_grouped" for s in ("in", "conv", "rule")}


def _grouped(block: tuple) -> tuple:
    """``block`` with the Gated DeltaNet stages that read qwen35's layout replaced."""
    out = []
    for el in block:
        if isinstance(el, Branch):
            el = Branch(el.flag, tuple(_GROUPED.get(n, n) for n in el.then), el.otherwise)
        out.append(el)
    return tuple(out)


class Qwen3NextModel(Qwen35MoEModel):
    arch = "qwen3next"
    tensors = (
        with_experts(COMMON_TENSORS) + SHARED_EXPERT_TENSORS + DELTA_NET_TENSORS + ATTENTION_TENSORS
    )
    unsupported = (
        "ffn_gate_up_exps.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
        ".ssm_beta.weight", ".ssm_alpha.weight",  # qwen35's split layout: not qwen3next's
    )  # fmt: skip
    block = _grouped(Qwen35MoEModel.block)

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        """qwen35moe's sizes; the value heads a whole number of times the key heads; the
        width of the older files' fused ``ssm_in``."""
        hp = super().derived(hp)
        x, a = hp.extra, cls.arch
        if x["ssm_dt_rank"] % x["ssm_n_group"]:
            raise ModelError(
                f"{a}.ssm.time_step_rank ({x['ssm_dt_rank']}, the value heads) must be a "
                f"multiple of {a}.ssm.group_count ({x['ssm_n_group']}, the key heads)"
            )
        return hp.with_extra({"qkvz_width": x["ssm_channels"] + x["ssm_d_inner"]})

    @classmethod
    def check(cls, md: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> HParams:
        """The declarations' checks, then each layer's own tensors by its kind (a Gated
        DeltaNet layer: ``attn_qkv`` and ``attn_gate``, or ``ssm_in``)."""
        hp = super(Qwen35Model, cls).check(md, shapes)  # (not qwen35's per-layer lists)
        hp = cls.recurrent_layers(md, hp)
        for il in range(hp.n_layer):
            if not hp.extra["recurrent_layers"][il]:
                want = [t.name.format(i=il) for t in ATTENTION_TENSORS]
                what = "full-attention"
            else:
                p = f"blk.{il}."
                want = [p + n for n in _NEEDED]
                if p + "attn_qkv.weight" in shapes or p + "ssm_in.weight" not in shapes:
                    want += [p + "attn_qkv.weight", p + "attn_gate.weight"]
                what = "Gated DeltaNet"
            for name in want:
                if name not in shapes:
                    raise ModelError(
                        f"tensor {name!r} is missing (layer {il} is a {what} layer of {cls.arch})"
                    )
        return hp

    def _pack(self) -> None:
        """The tables; a layer with ``attn_qkv`` runs it even when ``ssm_in`` is there."""
        super()._pack()
        lt = self.layer_table
        lt["ssm_in"][lt["attn_qkv"] != stages.NONE] = stages.NONE


MODEL = Qwen3NextModel
