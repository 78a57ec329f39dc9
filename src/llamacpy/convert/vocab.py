"""Tokenizer files to ``tokenizer.ggml.*``: SentencePiece, byte-level BPE and WordPiece.

* ``tokenizer.model`` (SentencePiece protobuf) -> ``llama`` (SPM) vocabularies with scores;
* ``tokenizer.json`` (or ``vocab.json`` + ``merges.txt``) BPE -> ``gpt2`` vocabularies with
  merges and the ``tokenizer.ggml.pre`` identification;
* ``tokenizer.json`` WordPiece or ``vocab.txt`` -> ``bert`` vocabularies (phantom-space form).

Token types, padding of unused ids, added/special tokens and the special token ids follow
llama.cpp's converter rule for rule (see :mod:`.special` for the special tokens).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import prehash
from .common import ConvertError, read_json_if_exists
from .kv import KV, T
from .special import SpecialVocab
from .spm_model import SentencePieceModel

log = logging.getLogger("llamacpy.convert")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPIECE_SPACE = "\u2581"
_SPECIAL_TEXTS = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
_SPECIAL_KEYS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def looks_special(token: str) -> bool:
    """Added tokens that some models forget to mark special (llama.cpp's heuristic)."""
    return (
        token in _SPECIAL_TEXTS
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


@dataclass
class Added:
    content: str
    special: bool
    normalized: bool


@dataclass
class HFVocab:
    """A Hugging Face tokenizer's vocabulary as transformers exposes it."""

    base: dict[str, int]  # the model's own vocabulary
    added: dict[int, Added]  # added tokens by id
    tokenizer_json: dict[str, Any] | None
    config: dict[str, Any]  # tokenizer_config.json ({} if absent)

    @property
    def full(self) -> dict[str, int]:
        """``tokenizer.vocab``: the model vocabulary plus added tokens."""
        out = dict(self.base)
        for tid, a in sorted(self.added.items()):
            out[a.content] = tid
        return out


def _config_special_texts(cfg: dict[str, Any]) -> list[str]:
    texts = []
    for key in _SPECIAL_KEYS:
        v = cfg.get(f"{key}_token")
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            texts.append(v)
    for v in cfg.get("additional_special_tokens") or cfg.get("extra_special_tokens") or []:
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            texts.append(v)
    return texts


def load_hf_vocab(directory: Path) -> HFVocab:
    """The vocabulary of ``tokenizer.json``, else ``vocab.json``, else ``vocab.txt``."""
    tj = read_json_if_exists(directory / "tokenizer.json")
    cfg = read_json_if_exists(directory / "tokenizer_config.json")
    cfg = cfg if isinstance(cfg, dict) else {}
    added: dict[int, Added] = {}
    if isinstance(tj, dict):
        model = tj.get("model") or {}
        vocab = model.get("vocab")
        if isinstance(vocab, dict):
            base = {str(k): int(v) for k, v in vocab.items()}
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            base = {str(p[0]): i for i, p in enumerate(vocab)}
        else:
            raise ConvertError(f"{directory / 'tokenizer.json'}: no model vocabulary")
        for a in tj.get("added_tokens") or []:
            added[int(a["id"])] = Added(
                str(a["content"]), bool(a.get("special")), bool(a.get("normalized", True))
            )
    elif (directory / "vocab.json").is_file():
        data = read_json_if_exists(directory / "vocab.json")
        base = {str(k): int(v) for k, v in data.items()}
        extra = read_json_if_exists(directory / "added_tokens.json") or {}
        specials = set(_config_special_texts(cfg))
        for content, tid in extra.items():
            added[int(tid)] = Added(content, content in specials, False)
    elif (directory / "vocab.txt").is_file():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        base = {}
        for i, line in enumerate(lines):
            base.setdefault(line.rstrip("\r"), i)
        # the slow BERT tokenizer registers its special tokens as added tokens
        for text in _config_special_texts(cfg):
            tid = base.get(text)
            if tid is not None:
                added[tid] = Added(text, True, False)
    else:
        raise ConvertError(
            f"{directory}: no tokenizer found (tokenizer.model, tokenizer.json, vocab.json or "
            "vocab.txt)"
        )
    for tid_text, data in (cfg.get("added_tokens_decoder") or {}).items():
        tid = int(tid_text)
        if tid not in added and isinstance(data, dict) and "content" in data:
            added[tid] = Added(
                str(data["content"]), bool(data.get("special")), bool(data.get("normalized"))
            )
    return HFVocab(base, added, tj if isinstance(tj, dict) else None, cfg)


def vocab_base(hv: HFVocab, hp: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Token texts and types for ids ``0..vocab_size-1`` (llama.cpp's get_vocab_base)."""
    full = hv.full
    vocab_size = int(hp.get("vocab_size", len(full)))
    if full and max(full.values()) >= vocab_size:
        raise ConvertError(
            f"the tokenizer has token id {max(full.values())} but config.json's vocab_size is "
            f"{vocab_size}"
        )
    reverse = {tid: tok for tok, tid in full.items()}
    added_texts = {a.content for a in hv.added.values()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        tok = reverse.get(i)
        if tok is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if tok in added_texts:
            a = hv.added.get(i)
            if (a is not None and a.special) or looks_special(tok):
                types.append(CONTROL)
            else:
                tok = tok.replace(_SPIECE_SPACE, " ")  # user-defined tokens are pre-normalized
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(tok)
    return tokens, types


# ---------------------------------------------------------------------------- writers
def set_vocab_gpt2(kv: KV, directory: Path, hp: dict[str, Any]) -> None:
    """A byte-level BPE vocabulary (``tokenizer.ggml.model = gpt2``)."""
    hv = load_hf_vocab(directory)
    tokens, types = vocab_base(hv, hp)
    special = SpecialVocab(directory, load_merges=True, tokenizer_json=hv.tokenizer_json)
    pre, _ = prehash.identify_bpe(tokens, types, special.merges, hv.tokenizer_json)
    kv.add("tokenizer.ggml.model", "gpt2", T.STRING)
    kv.add("tokenizer.ggml.pre", pre, T.STRING)
    kv.add("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING)
    kv.add("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32)
    special.write(kv)


def set_vocab_bert(kv: KV, directory: Path, hp: dict[str, Any]) -> int:
    """A WordPiece vocabulary in llama.cpp's phantom-space form; returns its size."""
    hv = load_hf_vocab(directory)
    tokens, types = vocab_base(hv, hp)
    kv.add("tokenizer.ggml.token_type_count", int(hp.get("type_vocab_size", 1)), T.UINT32)
    phantom = [
        t if ty == CONTROL else (t[2:] if t.startswith("##") else _SPIECE_SPACE + t)
        for t, ty in zip(tokens, types)
    ]
    if hv.tokenizer_json is not None:
        before, after = prehash.added_specials(hv.tokenizer_json)
    else:  # BertTokenizer always wraps a text in [CLS] ... [SEP]
        cls_id = hv.full.get(str(hv.config.get("cls_token", "[CLS]")))
        sep_id = hv.full.get(str(hv.config.get("sep_token", "[SEP]")))
        before = [cls_id] if cls_id is not None else []
        after = [sep_id] if sep_id is not None else []
    pre, _ = prehash.identify_wpm(phantom, types, before, after)
    kv.add("tokenizer.ggml.model", "bert", T.STRING)
    kv.add("tokenizer.ggml.pre", pre, T.STRING)
    kv.add("tokenizer.ggml.tokens", phantom, T.ARRAY, T.STRING)
    kv.add("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32)
    SpecialVocab(directory, n_vocab=len(phantom), tokenizer_json=hv.tokenizer_json).write(kv)
    return len(phantom)


def spm_vocab(directory: Path, hp: dict[str, Any]) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types from ``tokenizer.model`` plus the added tokens."""
    path = directory / "tokenizer.model"
    if not path.is_file():
        raise FileNotFoundError(path)
    sp = SentencePieceModel.load(path)
    vocab_size = hp.get("vocab_size_per_layer_input") or hp.get("vocab_size") or len(sp)
    vocab_size = int(vocab_size)
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [UNUSED] * vocab_size
    for i, (piece, score, ptype) in enumerate(zip(sp.pieces, sp.scores, sp.types)):
        if i >= vocab_size:
            log.warning("tokenizer.model has more pieces than vocab_size %d", vocab_size)
            break
        tokens[i], scores[i] = piece, score
        types[i] = ptype if ptype in (UNKNOWN, CONTROL, UNUSED, BYTE) else NORMAL
    for content, tid in (read_json_if_exists(directory / "added_tokens.json") or {}).items():
        if 0 <= tid < vocab_size:
            tokens[tid], scores[tid], types[tid] = content, -1000.0, USER_DEFINED
    cfg = read_json_if_exists(directory / "tokenizer_config.json") or {}
    for tid_text, data in (cfg.get("added_tokens_decoder") or {}).items():
        tid = int(tid_text)
        if not 0 <= tid < vocab_size:
            continue
        token = str(data["content"])
        if data.get("special") or looks_special(token):
            types[tid] = CONTROL
        else:
            token = token.replace(_SPIECE_SPACE, " ")
            types[tid] = USER_DEFINED
        tokens[tid], scores[tid] = token, -1000.0
    return tokens, scores, types


def write_spm(kv: KV, directory: Path, tokens: list[str], scores: list[float],
              types: list[int]) -> None:  # fmt: skip
    kv.add("tokenizer.ggml.model", "llama", T.STRING)
    kv.add("tokenizer.ggml.pre", "default", T.STRING)
    kv.add("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING)
    kv.add("tokenizer.ggml.scores", scores, T.ARRAY, T.FLOAT32)
    kv.add("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32)
    SpecialVocab(directory, n_vocab=len(tokens)).write(kv)


def set_vocab_sentencepiece(kv: KV, directory: Path, hp: dict[str, Any]) -> None:
    """Raises FileNotFoundError when there is no tokenizer.model (callers fall back)."""
    write_spm(kv, directory, *spm_vocab(directory, hp))


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def set_vocab_llama_hf(kv: KV, directory: Path, hp: dict[str, Any]) -> None:
    """A SentencePiece-style BPE ``tokenizer.json`` (byte fallback) as an SPM vocabulary.

    Raises FileNotFoundError when tokenizer.json is absent or not of that kind, and
    TypeError for Llama 3 style byte-level BPE (callers fall back to :func:`set_vocab_gpt2`).
    """
    tj = read_json_if_exists(directory / "tokenizer.json")
    if not isinstance(tj, dict):
        raise FileNotFoundError(directory / "tokenizer.json")
    model = tj.get("model") or {}
    if (
        model.get("type") == "BPE"
        and model.get("ignore_merges", False)
        and not model.get("byte_fallback", True)
    ):
        raise TypeError("Llama 3 style BPE")
    decoder = tj.get("decoder") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback", False):
        raise FileNotFoundError("not a Llama BPE tokenizer")
    if decoder.get("type") != "Sequence":
        raise FileNotFoundError("not a Llama BPE tokenizer")
    hv = load_hf_vocab(directory)
    n_base = len(hv.base)
    extra = sorted((tid, a) for tid, a in hv.added.items() if tid >= n_base)
    specials = {hv.full[t] for t in _config_special_texts(hv.config) if t in hv.full}
    reverse = {tid: tok for tok, tid in hv.full.items()}
    extra_ids = {tid for tid, _ in extra}
    tokens, scores, types = [], [], []
    for tid in range(n_base):
        if tid in extra_ids:
            continue
        text = reverse[tid]
        tokens.append(text)
        scores.append(-1000.0)
        if _BYTE_TOKEN.fullmatch(text):
            types.append(BYTE)
        else:
            types.append(CONTROL if tid in specials else NORMAL)
    for tid, a in extra:
        tokens.append(a.content)
        scores.append(-1000.0)
        types.append(CONTROL if tid in specials else USER_DEFINED)
    write_spm(kv, directory, tokens, scores, types)
