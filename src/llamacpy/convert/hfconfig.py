"""``config.json`` as llama.cpp's converter sees it.

The converter reads the config through ``transformers.AutoConfig``, which fills in the
defaults of the model's config class for keys the file leaves out (``head_dim``,
``num_key_value_heads``, ``rms_norm_eps``, ...). We read the JSON ourselves and apply the
same defaults (those of transformers 5.x) for the keys conversion uses, per ``model_type``.
RoPE settings are gathered into one ``rope_parameters`` dict the way the converter does,
whether the file uses the old (``rope_theta`` + ``rope_scaling``) or new layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import ConvertError, find_key, read_json


def _llama_head_dim(c: dict[str, Any]) -> int | None:
    try:
        return int(c["hidden_size"]) // int(c["num_attention_heads"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


# model_type -> defaults of its transformers config class (only keys conversion reads);
# a callable default is computed from the (partly filled) config
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "head_dim": _llama_head_dim,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "head_dim": _llama_head_dim,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    },
    "phi3": {
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 32000,
        "pad_token_id": 32000,
    },
    "bert": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
    },
}
# keys the new-style configs keep inside rope_parameters, not at the top level
_ROPE_KEYS = ("rope_theta", "rope_local_base_freq", "partial_rotary_factor")


def load_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory, as a dict (raw, without defaults)."""
    path = directory / "config.json"
    if not path.is_file():
        raise ConvertError(f"{directory}: no config.json (is this a Hugging Face model directory?)")
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        raise ConvertError(f"{path}: expected a JSON object")
    return cfg


def architecture(cfg: dict[str, Any]) -> str:
    """The Hugging Face architecture name that selects the converter."""
    arch = None
    if isinstance(cfg.get("architectures"), list) and cfg["architectures"]:
        arch = cfg["architectures"][0]
    text = cfg.get("text_config")
    if (
        isinstance(text, dict)
        and isinstance(text.get("architectures"), list)
        and text["architectures"]
    ):
        arch = text["architectures"][0]
    if not isinstance(arch, str):
        raise ConvertError("config.json names no model architecture ('architectures' is missing)")
    return arch


def text_hparams(cfg: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters of the text model, with the config class's defaults filled in."""
    hp = dict(cfg)
    if isinstance(cfg.get("text_config"), dict):
        hp.update(cfg["text_config"])
    model_type = hp.get("model_type")
    if model_type == "gemma3":
        model_type = "gemma3_text"
    rope_nested = isinstance(hp.get("rope_parameters"), dict)
    for key, default in _DEFAULTS.get(str(model_type), {}).items():
        if key in hp or (rope_nested and key in _ROPE_KEYS):
            continue
        value = default(hp) if callable(default) else default
        if value is not None:
            hp[key] = value
    # the decoder config classes default num_key_value_heads to num_attention_heads
    has_heads = "num_attention_heads" in hp and hp.get("num_key_value_heads") is None
    if has_heads and model_type in _DEFAULTS and model_type != "bert":
        hp["num_key_value_heads"] = hp["num_attention_heads"]
    return hp


def rope_parameters(hp: dict[str, Any]) -> dict[str, Any]:
    """One dict of RoPE settings, merged from ``rope_parameters``/``rope_scaling`` and the
    top-level keys, as convert_hf_to_gguf's TextModel builds it."""
    src = hp.get("rope_parameters", hp.get("rope_scaling")) or {}
    rp = dict(src) if isinstance(src, dict) else {}
    if "full_attention" in rp or "sliding_attention" in rp:
        return rp
    theta = find_key(
        hp,
        ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
         "rotary_emb_base"],
    )  # fmt: skip
    local = find_key(
        hp,
        ["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
         "rope_local_base_freq"],
    )  # fmt: skip
    partial = find_key(hp, ["partial_rotary_factor", "rope_pct", "rope_percent"])
    orig_ctx = hp.get("original_max_position_embeddings")
    if local is not None:
        rp["sliding_attention"] = {"rope_theta": local}
    if "rope_theta" not in rp and theta is not None:
        rp["rope_theta"] = theta
    if "rope_type" not in rp and rp.get("type") is not None:
        rp["rope_type"] = rp["type"]
    if "partial_rotary_factor" not in rp and partial is not None:
        rp["partial_rotary_factor"] = partial
    if "original_max_position_embeddings" not in rp and orig_ctx is not None:
        rp["original_max_position_embeddings"] = orig_ctx
    return rp
