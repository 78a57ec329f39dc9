"""The ``mamba2`` architecture (Mamba-2 state-space models: mamba2-130m ... 2.7b,
Mamba-Codestral), as llama.cpp runs it: every layer a Mamba-2 mixer, no attention, no FFN.

Each layer has a state per sequence (the engine's recurrent memory: a convolution row of
``ssm.conv_kernel - 1`` past inputs per channel and a scan row of ``ssm.state_size`` per
channel of ``ssm.inner_size``). Each block is

* ``h = rms_norm(x) * attn_norm``;
* ``z | xBC | dt = h . ssm_in``; ``xBC = silu(conv(xBC) + ssm_conv1d.bias)``, the causal
  depthwise convolution of ``ssm.conv_kernel`` taps; ``x | B | C`` apart (``B``, ``C`` of
  ``ssm.state_size`` per group of heads);
* per head (``ssm.time_step_rank`` of them, ``inner_size / heads`` channels each): the
  selective scan with ``dt = softplus(dt + ssm_dt.bias)``, ``dA = exp(dt * ssm_a)`` (``ssm_a``
  = -exp(A_log)): ``S = S * dA + B x dt``, ``y = S . C + x * ssm_d``;
* ``y = silu(z) * y``, RMS-normed per group (``ssm.group_count`` slices) times ``ssm_norm``;
  ``x += y . ssm_out``.

The numpy specification is :mod:`.reference`'s stages (the layer's steps in
:mod:`.mamba2_ref`).
"""

from __future__ import annotations

from ..errors import ModelError
from ..hparams import HParams
from .decoder import Decoder
from .spec import Param, Tensor

MAMBA2_TENSORS = (
    Tensor("blk.{i}.ssm_in.weight", ("n_embd", "ssm_d_in_proj")),
    Tensor("blk.{i}.ssm_conv1d.weight", ("ssm_d_conv", "ssm_channels"), flat=True),
    Tensor("blk.{i}.ssm_conv1d.bias", ("ssm_channels",)),
    Tensor("blk.{i}.ssm_dt.bias", ("ssm_dt_rank",)),
    Tensor("blk.{i}.ssm_a", (1, "ssm_dt_rank"), flat=True),
    Tensor("blk.{i}.ssm_d", (1, "ssm_dt_rank"), flat=True),
    Tensor("blk.{i}.ssm_norm.weight", ("ssm_group_size", "ssm_n_group"), flat=True),
    Tensor("blk.{i}.ssm_out.weight", ("ssm_d_inner", "n_embd")),
)
COMMON_TENSORS = (
    Tensor("token_embd.weight", ("n_embd", "n_vocab")),
    Tensor("output_norm.weight", ("n_embd",)),
    Tensor("output.weight", ("n_embd", "n_vocab"), optional=True),  # absent: tied
    Tensor("blk.{i}.attn_norm.weight", ("n_embd",)),
)
SSM_PARAMS = (
    Param("ssm_d_conv", "ssm.conv_kernel", kind=int, minimum=2),
    Param("ssm_d_inner", "ssm.inner_size", kind=int, minimum=1),
    Param("ssm_d_state", "ssm.state_size", kind=int, minimum=1),
    Param("ssm_dt_rank", "ssm.time_step_rank", kind=int, minimum=1),
    Param("ssm_n_group", "ssm.group_count", kind=int, minimum=1),
)
MAMBA2_STAGES = (
    "mamba2_in",  # z | xBC | dt = h . ssm_in
    "mamba2_conv",  # xBC = silu(conv(xBC) + bias) over the state row
    "mamba2_scan",  # selective scan per head, y = (S . C + x * D) * silu(z)
    "mamba2_out",  # x += group_rms_norm(y) * ssm_norm . ssm_out
)


def ssm_sizes(arch: str, hp: HParams) -> HParams:
    """The Mamba-2 sizes derived from the file's, after checking them (a ``ModelError``
    naming the key): heads and groups divide ``ssm.inner_size``, heads are groups' multiples,
    and the compiled kernels' 16-lane rows fit."""
    x = hp.extra
    inner, heads, groups, state = (
        x["ssm_d_inner"],
        x["ssm_dt_rank"],
        x["ssm_n_group"],
        (x["ssm_d_state"]),
    )
    key = f"{arch}.ssm"
    if inner % heads or heads % groups:
        raise ModelError(
            f"{key}.inner_size ({inner}) must be a multiple of {key}.time_step_rank ({heads}, "
            f"the heads), itself a multiple of {key}.group_count ({groups})"
        )
    if (inner // heads) % 16 or state % 16:
        raise ModelError(
            f"unsupported shape: the head size ({key}.inner_size / time_step_rank = "
            f"{inner // heads}) and {key}.state_size ({state}) must be multiples of 16"
        )
    channels = inner + 2 * groups * state
    return hp.with_extra(
        {
            "ssm_channels": channels,
            "ssm_d_in_proj": inner + channels + heads,
            "ssm_group_size": inner // groups,
            "q_width": inner + channels + heads,  # the workspace's Q row: z | xBC | dt
        }
    )


class Mamba2Model(Decoder):
    arch = "mamba2"
    tensors = COMMON_TENSORS + MAMBA2_TENSORS
    params = SSM_PARAMS
    has_attention = False
    block = ("attn_norm", *MAMBA2_STAGES)  # h = rms_norm(x) * attn_norm; the mixer

    @classmethod
    def derived(cls, hp: HParams) -> HParams:
        return ssm_sizes(cls.arch, super().derived(hp))

    def attention_scales(self) -> tuple[float, float]:
        return 1.0, 1.0  # (no attention)

    def layer_recurrent(self, il: int) -> bool:
        return True

    def state_sizes(self) -> tuple[int, int]:
        """Floats of a layer's convolution row and of its scan row (per sequence)."""
        x = self.hparams.extra
        return (x["ssm_d_conv"] - 1) * x["ssm_channels"], x["ssm_d_inner"] * x["ssm_d_state"]


MODEL = Mamba2Model
