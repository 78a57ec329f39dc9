"""What every text architecture shares: hyper-parameter keys, tensor naming and planning.

An architecture converter turns the checkpoint's tensors into a list of :class:`Planned`
tensors (GGUF name, shape and a lazy loader) without reading any weights, and writes its
``{arch}.*`` metadata. Per-architecture modules override the hooks (``rename``, ``modify``,
``extra_tensors``, ``set_params``, ``set_vocab``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..common import ConvertError, find_key, read_json_if_exists
from ..hfconfig import rope_parameters
from ..kv import KV, T
from ..safetensors import SourceTensor

log = logging.getLogger("llamacpy.convert")

POOLING = {"mean": 1, "cls": 2, "lasttoken": 3}  # llama.cpp's pooling types
ROPE_SCALING = {"linear": "linear", "yarn": "yarn", "su": "longrope", "longrope": "longrope"}
# tensors llama.cpp's converter never needs
SKIP_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
# multimodal parts of a checkpoint that a text model skips
# tensors the converter generates (named in GGUF terms already)
GENERATED = ("rope_freqs", "rope_factors_long", "rope_factors_short")
_MM_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.",
                "sound_encoder.", "sound_projection.", "speech_embeddings.")  # fmt: skip
_MM_PARTS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.",
             "code2wav.", "projector.", "pre_mm_projector_norm", "image_newline",
             "view_seperator", "patch_embed", "patch_embedding", "patch_merger.",
             "patch_merge_mlp.", "model.connector.")  # fmt: skip


@dataclass(frozen=True)
class Lazy:
    """A tensor not computed yet: its shape (numpy order), float dtype and how to make it."""

    shape: tuple[int, ...]
    dtype: np.dtype  # float16 or float32, as the converter holds the data
    make: Callable[[], np.ndarray]

    def then(self, f: Callable[[np.ndarray], np.ndarray], shape: tuple[int, ...] | None = None,
             dtype: Any = None) -> Lazy:  # fmt: skip
        make = self.make
        return Lazy(
            self.shape if shape is None else shape,
            self.dtype if dtype is None else np.dtype(dtype),
            lambda: f(make()),
        )

    @classmethod
    def of(cls, st: SourceTensor) -> Lazy:
        dtype = np.dtype(np.float16) if st.dtype == "F16" else np.dtype(np.float32)
        return cls(st.shape, dtype, st.load)

    @classmethod
    def const(cls, values: np.ndarray) -> Lazy:
        return cls(values.shape, values.dtype, lambda: values)


@dataclass(frozen=True)
class Planned:
    """One output tensor: its GGUF name, where it came from, its data (lazy)."""

    name: str
    source: str  # the checkpoint tensor (or a description of a generated one)
    bid: int | None
    data: Lazy


def block_id(name: str) -> int | None:
    """The first number-like part of a tensor name (llama.cpp's block id)."""
    for part in name.split("."):
        if part.isdecimal():
            return int(part)
    return None


class TextArch:
    """A text model architecture; subclasses set ``arch`` and ``names`` at least."""

    arch: ClassVar[str]
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    # HF module name (with {bid}) -> GGUF name (with {bid}); ".weight"/".bias" are appended
    names: ClassVar[dict[str, str]] = {}
    # tensors llama.cpp keeps in F32 whatever the output type (besides 1-D ones and norms)
    f32_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, directory: Path, cfg: dict[str, Any], hp: dict[str, Any], hf_arch: str):
        self.dir = directory
        self.cfg = cfg  # config.json as written
        self.hp = hp  # with text_config merged and defaults filled in
        self.hf_arch = hf_arch
        self.rope = rope_parameters(hp)
        n = find_key(hp, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
        if not isinstance(n, int) or n < 0:
            raise ConvertError("config.json has no valid num_hidden_layers")
        self.block_count = n
        self._map = self._build_map()

    # ------------------------------------------------------------------ hyper-parameters
    def need(self, *keys: str) -> Any:
        v = find_key(self.hp, keys)
        if v is None:
            raise ConvertError(f"config.json has no {' / '.join(keys)}")
        return v

    def set_params(self, kv: KV, ftype: int) -> None:
        """The ``{arch}.*`` keys, as convert_hf_to_gguf's TextModel.set_gguf_parameters."""
        hp, a = self.hp, kv.add_arch
        a("block_count", self.block_count, T.UINT32)
        ctx_keys = ["max_position_embeddings", "n_ctx", "n_positions", "max_length",
                    "max_sequence_length", "model_max_length"]  # fmt: skip
        if (n_ctx := find_key(hp, ctx_keys)) is not None:
            a("context_length", n_ctx, T.UINT32)
        if (n_embd := find_key(hp, ["hidden_size", "n_embd", "dim"])) is not None:
            a("embedding_length", n_embd, T.UINT32)
        ff_keys = ["prefix_dense_intermediate_size", "dense_intermediate_size",
                   "intermediate_size", "n_inner", "hidden_dim"]  # fmt: skip
        if (n_ff := find_key(hp, ff_keys)) is not None:
            kv.add_count("feed_forward_length", n_ff)
        if (n_head := find_key(hp, ["num_attention_heads", "n_head", "n_heads"])) is not None:
            kv.add_count("attention.head_count", n_head)
        if (n_kv := find_key(hp, ["num_key_value_heads", "n_kv_heads"])) is not None:
            kv.add_count("attention.head_count_kv", n_kv)
        if hp.get("is_causal") is False:
            a("attention.causal", False, T.BOOL)
        self._set_rope(kv)
        if (eps := find_key(hp, ["rms_norm_eps", "norm_eps"])) is not None:
            a("attention.layer_norm_rms_epsilon", eps, T.FLOAT32)
        if (eps := find_key(hp, ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])) is not None:  # fmt: skip
            a("attention.layer_norm_epsilon", eps, T.FLOAT32)
        if find_key(hp, ["num_local_experts", "num_experts", "n_routed_experts"]) is not None:
            raise ConvertError(f"mixture-of-experts {self.hf_arch} models are not supported")
        if (head_dim := hp.get("head_dim")) is not None:
            a("attention.key_length", head_dim, T.UINT32)
            a("attention.value_length", head_dim, T.UINT32)
        kv.add("general.file_type", ftype, T.UINT32)

    def _set_rope(self, kv: KV) -> None:
        a = kv.add_arch
        rp = self.rope.get("full_attention", self.rope)
        rope_type = rp.get("rope_type")
        if rope_type is not None:
            factor = rp.get("factor")
            kind = ROPE_SCALING.get(rope_type)
            if kind == "longrope":
                a("rope.scaling.type", kind, T.STRING)
            elif kind is not None and factor is not None:
                a("rope.scaling.type", kind, T.STRING)
                a("rope.scaling.factor", factor, T.FLOAT32)
                if kind == "yarn":
                    if "original_max_position_embeddings" not in rp:
                        raise ConvertError(
                            "yarn RoPE scaling needs original_max_position_embeddings"
                        )
                    a("rope.scaling.original_context_length",
                      rp["original_max_position_embeddings"], T.UINT32)  # fmt: skip
                    for key, name in (("extrapolation_factor", "yarn_ext_factor"),
                                      ("attention_factor", "yarn_attn_factor"),
                                      ("beta_fast", "yarn_beta_fast"),
                                      ("beta_slow", "yarn_beta_slow")):  # fmt: skip
                        value = rp.get(key)
                        if key == "attention_factor" and value is None:
                            value = rp.get("attn_factor")
                        if value is not None:
                            a(f"rope.scaling.{name}", value, T.FLOAT32)
            elif rope_type not in ("dynamic", "default") and rope_type.lower() != "llama3":
                log.warning("unknown RoPE type %r: no scaling keys written", rope_type)
        if "mrope_section" in self.rope:
            sections = list(self.rope["mrope_section"]) + [0] * 4
            a("rope.dimension_sections", sections[:4], T.ARRAY, T.INT32)
        if (theta := rp.get("rope_theta")) is not None:
            a("rope.freq_base", theta, T.FLOAT32)
        if (local := (self.rope.get("sliding_attention") or {}).get("rope_theta")) is not None:
            a("rope.freq_base_swa", local, T.FLOAT32)

    def set_pooling(self, kv: KV) -> None:
        """``{arch}.pooling_type`` from a sentence-transformers ``modules.json``."""
        modules = read_json_if_exists(self.dir / "modules.json")
        path = None
        for mod in modules or []:
            if isinstance(mod, dict) and str(mod.get("type", "")).endswith("Pooling"):
                path = mod.get("path")
                break
        if path is not None:
            cfg = read_json_if_exists(self.dir / path / "config.json")
            if not isinstance(cfg, dict):
                raise ConvertError(f"{self.dir / path / 'config.json'}: pooling config not found")
            if cfg.get("pooling_mode_mean_tokens"):
                pooling = POOLING["mean"]
            elif cfg.get("pooling_mode_cls_token"):
                pooling = POOLING["cls"]
            elif cfg.get("pooling_mode_lasttoken"):
                pooling = POOLING["lasttoken"]
            elif cfg.get("pooling_mode") in POOLING:
                pooling = POOLING[cfg["pooling_mode"]]
            else:
                raise ConvertError("only mean, CLS and last-token pooling are supported")
            kv.add_arch("pooling_type", pooling, T.UINT32)
        if (cls_pool := self.hp.get("classifier_pooling")) is not None:
            if cls_pool not in ("cls", "mean"):
                raise ConvertError(f"unsupported classifier_pooling {cls_pool!r}")
            kv.add_arch("classifier.pooling_type", POOLING[cls_pool], T.UINT32)

    def set_vocab(self, kv: KV) -> None:
        from ..vocab import set_vocab_gpt2

        set_vocab_gpt2(kv, self.dir, self.hp)

    # ------------------------------------------------------------------ tensors
    def _build_map(self) -> dict[str, str]:
        out = {}
        for hf, gg in self.names.items():
            if "{bid}" in hf:
                for b in range(self.block_count):
                    out[hf.format(bid=b)] = gg.format(bid=b)
            else:
                out[hf] = gg
        for gg in [*out.values(), *GENERATED]:  # GGUF names map to themselves
            out.setdefault(gg, gg)
        return out

    def map_name(self, name: str) -> str:
        """The GGUF name of a (renamed) checkpoint tensor; unknown names are an error."""
        if name in self._map:
            return self._map[name]
        for suffix in (".weight", ".bias"):
            if name.endswith(suffix) and name[: -len(suffix)] in self._map:
                return self._map[name[: -len(suffix)]] + suffix
        bid = block_id(name)
        if bid is not None and bid >= self.block_count:
            raise ConvertError(
                f"tensor {name!r} is in block {bid} but config.json has "
                f"num_hidden_layers={self.block_count}"
            )
        raise ConvertError(f"cannot map tensor {name!r} to a GGUF name ({self.arch} architecture)")

    def rename(self, name: str) -> str | None:
        """Checkpoint name -> the name conversion uses (None: skip the tensor)."""
        if name.startswith(_MM_PREFIXES) or any(p in name for p in _MM_PARTS):
            return None
        name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        return name.replace("language_model.", "")

    def modify(self, name: str, bid: int | None, data: Lazy) -> Iterable[tuple[str, Lazy]]:
        """Checkpoint tensor -> output tensors (default: rename only)."""
        yield self.map_name(name), data

    def extra_tensors(self, kv: KV) -> Iterable[tuple[str, Lazy]]:
        """Generated tensors that come before the checkpoint's (rope factors ...)."""
        return ()

    def plan(self, sources: dict[str, SourceTensor], kv: KV) -> list[Planned]:
        """Every output tensor in llama.cpp's order; nothing is read from disk."""
        out: list[Planned] = []
        for name, data in self._inputs(sources, kv):
            if name.endswith(SKIP_SUFFIXES):
                continue
            bid = block_id(name)
            for new_name, lazy in self.modify(name, bid, data):
                out.append(Planned(new_name, name, bid, lazy))
        seen: set[str] = set()
        for p in out:
            if p.name in seen:
                raise ConvertError(f"two checkpoint tensors map to {p.name!r} (last: {p.source!r})")
            seen.add(p.name)
        self.check_shapes(out)
        return out

    def _inputs(self, sources: dict[str, SourceTensor], kv: KV) -> Iterator[tuple[str, Lazy]]:
        yield from self.extra_tensors(kv)
        for name, st in sources.items():
            new = self.rename(name)
            if new is not None:
                yield new, Lazy.of(st)

    def is_f32(self, name: str) -> bool:
        return any(name == f"{n}.weight" for n in self.f32_names)

    # ------------------------------------------------------------------ shape checks
    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """GGUF name pattern (regex) -> numpy shape that config.json implies (partial)."""
        return {}

    def check_shapes(self, planned: list[Planned]) -> None:
        expected = [(re.compile(k), v) for k, v in self.expected_shapes().items()]
        for p in planned:
            for rx, shape in expected:
                if rx.fullmatch(p.name) and tuple(p.data.shape) != shape:
                    raise ConvertError(
                        f"tensor {p.source!r} ({p.name}) has shape {tuple(p.data.shape)} but "
                        f"config.json implies {shape}"
                    )
