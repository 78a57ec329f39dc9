"""The vocabulary as llama.cpp loads it from GGUF metadata (``llama_vocab::impl::load``).

Token texts, scores and attributes; the special ids (bos, eos, eot, ...), the
end-of-generation set, the add_bos/add_eos/add_sep flags and every per-model quirk llama.cpp
applies while loading. Nothing here tokenizes; see :mod:`llamacpy.tokenizer.tokenizer`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..gguf.constants import GGUFValueType
from ._intern import join_bytes
from .errors import TokenizerError
from .pretokenize import PreTokenizer, pre_tokenizer

log = logging.getLogger(__name__)

# llama_token_type (stored in GGUF)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL = 0, 1, 2, 3
TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 4, 5, 6

# llama_token_attr (bit flags)
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

_TYPE_TO_ATTR = np.array(
    [
        ATTR_UNDEFINED,
        ATTR_NORMAL,
        ATTR_UNKNOWN,
        ATTR_CONTROL,
        ATTR_USER_DEFINED,
        ATTR_UNUSED,
        ATTR_BYTE,
    ],
    dtype=np.int32,
)

NULL = -1  # LLAMA_TOKEN_NULL

KV = "tokenizer.ggml."

# special-token keys, in llama.cpp's order (the deprecated fim keys come last and win)
_SPECIAL_KEYS = [
    ("bos_token_id", "bos"),
    ("eos_token_id", "eos"),
    ("eot_token_id", "eot"),
    ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"),
    ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"),
    ("mask_token_id", "mask"),
    ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"),
    ("prefix_token_id", "fim_pre"),
    ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
]

# texts llama.cpp uses to find special tokens that the metadata does not name
_AUTO = {
    "eot": (
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}

_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)


@dataclass
class Vocab:
    """llama.cpp's view of a vocabulary. ``type`` is one of spm, bpe, wpm, ugm."""

    model: str
    type: str
    tokens: list[str]
    scores: np.ndarray
    attrs: np.ndarray
    token_to_id: dict[str, int]
    pre: PreTokenizer | None = None
    pre_name: str = ""
    merges: list[str] = field(default_factory=list)
    special: dict[str, int] = field(default_factory=dict)
    # llama.cpp's per-model defaults, before the metadata overrides them (the newline token
    # is determined while only these are known)
    default_special: dict[str, int] = field(default_factory=dict)
    add_space_prefix: bool = False
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    ignore_merges: bool = False
    clean_spaces: bool = False
    remove_extra_whitespaces: bool = False
    escape_whitespaces: bool = True
    treat_whitespace_as_suffix: bool = False
    lowercase: bool = False
    strip_accents: bool = False
    eog_ids: frozenset[int] = frozenset()
    special_tokens: list[int] = field(default_factory=list)  # parse order
    precompiled_charsmap: bytes = b""
    suppress_tokens: list[int] = field(default_factory=list)
    # the tokens' UTF-8 (surrogateescape) bytes as (buffer, offsets), see ``join_bytes``;
    # computed on first use when not given
    token_bytes: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def token_bytes_joined(self) -> tuple[np.ndarray, np.ndarray]:
        """(buffer, offsets): token i's bytes are ``buffer[offsets[i]:offsets[i + 1]]``."""
        if self.token_bytes is None:
            self.token_bytes = join_bytes(self.tokens)
        return self.token_bytes

    @property
    def max_token_len(self) -> int:
        """The longest token's length in bytes."""
        offsets = self.token_bytes_joined()[1]
        return int(np.diff(offsets).max()) if offsets.shape[0] > 1 else 0

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def id(self, name: str) -> int:
        """A special id by name (bos, eos, eot, eom, unk, sep, pad, mask, fim_*), -1 if none."""
        return self.special.get(name, NULL)

    def is_control(self, tid: int) -> bool:
        return bool(self.attrs[tid] & ATTR_CONTROL)

    def is_byte(self, tid: int) -> bool:
        return bool(self.attrs[tid] & ATTR_BYTE)

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> Vocab:
        return _load(md)


def _get(md: Mapping[str, Any], key: str, default: Any = None) -> Any:
    return md.get(KV + key, default)


def _as_bool(md: Mapping[str, Any], key: str) -> bool | None:
    val = _get(md, key)
    if val is None:
        return None
    if isinstance(val, bool | int | np.integer | np.bool_):
        return bool(val)
    raise TokenizerError(f"invalid type for {KV}{key}: {type(val).__name__}")


def _load(md: Mapping[str, Any]) -> Vocab:
    model = _get(md, "model")
    if model is None:
        raise TokenizerError(f"no tokenizer in model file ({KV}model is missing)")
    if not isinstance(model, str):
        raise TokenizerError(f"invalid type for {KV}model")
    pre_name = _get(md, "pre", "")
    if not isinstance(pre_name, str):
        raise TokenizerError(f"invalid type for {KV}pre")

    special: dict[str, int] = {}
    flags: dict[str, bool] = {}
    merges: list[str] = []
    pre: PreTokenizer | None = None
    precompiled = b""
    if model in ("no_vocab", "none"):
        raise TokenizerError("the model has no vocabulary (tokenizer.ggml.model = 'none')")
    if model == "llama":
        vtype = "spm"
        special.update(bos=1, eos=2, unk=0)
    elif model == "bert":
        vtype = "wpm"
        special.update(bos=101, unk=100, sep=102, pad=0, mask=103)
    elif model in ("gpt2", "gemma4"):
        vtype = "bpe"
        merges = _get(md, "merges")
        if merges is None:
            if pre_name != "kimi-k2" or model == "gemma4":
                raise TokenizerError("cannot find tokenizer merges in model file")
            merges = []
        elif not isinstance(merges, list) or not (
            getattr(merges, "elem_type", None) == GGUFValueType.STRING  # read from a file
            or all(isinstance(m, str) for m in merges)
        ):
            raise TokenizerError(f"invalid type for {KV}merges")
        if model == "gpt2":
            special.update(bos=11, eos=11)
        else:
            pre_name = "gemma4"
    elif model == "t5":
        vtype = "ugm"
        special.update(eos=1, unk=2, pad=0)
        charsmap = _get(md, "precompiled_charsmap")
        if charsmap is not None:
            arr = np.asarray(charsmap)
            if arr.dtype not in (np.int8, np.uint8):
                raise TokenizerError(f"invalid type for {KV}precompiled_charsmap")
            precompiled = arr.astype(np.uint8).tobytes()
            if len(precompiled) < 4:
                raise TokenizerError("precompiled_charsmap too small for xcda_blob_size header")
            blob = int.from_bytes(precompiled[:4], "little")
            if blob + 4 >= len(precompiled):
                raise TokenizerError("index out of array bounds in precompiled charsmap")
    else:
        raise TokenizerError(
            f"unsupported tokenizer: {model!r} (supported: llama/SPM, gpt2/BPE, gemma4/BPE, "
            "bert/WPM, t5/UGM)"
        )

    add_space_prefix = False
    add_bos = add_eos = add_sep = False
    ignore_merges = False
    clean_spaces = False
    escape_whitespaces = True
    lowercase = True  # llama.cpp's normalizer_options default
    if vtype == "bpe":
        escape_whitespaces = False
        clean_spaces = True
        if pre_name == "":
            log.warning("missing pre-tokenizer type, using: 'default' (quality will be degraded)")
        pre = pre_tokenizer(pre_name)
        flags = pre.flags
        clean_spaces = flags.get("clean_spaces", clean_spaces)
        ignore_merges = flags.get("ignore_merges", False)
        add_bos = flags.get("add_bos", False)
        add_sep = flags.get("add_sep", False)
        escape_whitespaces = flags.get("escape_whitespaces", escape_whitespaces)
        if pre.bos_null:
            special["bos"] = NULL
        lowercase = flags.get("lowercase", lowercase)
    elif vtype == "spm":
        add_space_prefix = True
        add_bos = True
    elif vtype == "wpm":
        clean_spaces = True
        add_bos = True
        add_sep = True
    elif vtype == "ugm":
        add_eos = True

    val = _as_bool(md, "add_space_prefix")
    if val is not None:
        add_space_prefix = val
    remove_extra_ws = bool(_as_bool(md, "remove_extra_whitespaces") or False)

    tokens = _get(md, "tokens")
    if tokens is None:
        raise TokenizerError("cannot find tokenizer vocab in model file")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens[:1]):
        raise TokenizerError(f"invalid type for {KV}tokens")
    n = len(tokens)
    scores_raw = _get(md, "scores")
    if scores_raw is not None:
        scores_arr = np.asarray(scores_raw)
        if scores_arr.dtype not in (np.float32, np.int32):
            raise TokenizerError(f"invalid type for {KV}scores")
        if scores_arr.shape[0] < n:
            raise TokenizerError(
                f"index out of array bounds for scores ({scores_arr.shape[0]} < {n})"
            )
        scores = scores_arr[:n].astype(np.float32)
    else:
        scores = np.zeros(n, dtype=np.float32)
    types_raw = _get(md, "token_type")
    if types_raw is not None:
        types = np.asarray(types_raw)
        if types.dtype != np.int32:
            raise TokenizerError(f"invalid type for {KV}token_type")
        if types.shape[0] < n:
            raise TokenizerError(f"index out of array bounds for toktypes ({types.shape[0]} < {n})")
        t = types[:n].astype(np.int64)
        t = np.where((t >= 0) & (t < len(_TYPE_TO_ATTR)), t, 0)
        attrs = _TYPE_TO_ATTR[t].copy()
    else:
        attrs = np.full(n, ATTR_NORMAL, dtype=np.int32)

    tokens = list(tokens)
    if not all(tokens):
        for i in (i for i, t in enumerate(tokens) if not t):
            log.warning("empty token at index %d", i)
            tokens[i] = f"[EMPTY_{i}]"
    token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(token_to_id) != n:
        raise TokenizerError(f"the vocabulary has duplicate token texts ({n - len(token_to_id)})")
    token_bytes = join_bytes(tokens)

    defaults = {k: (v if v < n else NULL) for k, v in special.items()}
    # special token ids from metadata
    for key, name in _SPECIAL_KEYS:
        cur = special.get(name, NULL)
        if cur >= n:
            cur = NULL
        val = _get(md, key)
        if val is not None:
            if not isinstance(val, int | np.integer) or val < 0:
                raise TokenizerError(f"invalid type for {KV}{key}")
            if int(val) >= n:
                log.warning("bad special token: %s = %d, using default id %d", key, val, cur)
            else:
                cur = int(val)
        special[name] = cur
    for k in ("add_bos_token", "add_eos_token", "add_sep_token"):
        val = _as_bool(md, k)
        if val is None:
            continue
        if k == "add_bos_token":
            add_bos = val
        elif k == "add_eos_token":
            add_eos = val
        else:
            add_sep = val
    if pre is not None and pre.type == "GEMMA4" and not add_bos:
        add_bos = True

    lc = _as_bool(md, "normalizer.lowercase")
    if lc is not None:
        lowercase = lc
    strip_accents = lowercase
    sa = _as_bool(md, "normalizer.strip_accents")
    if sa is not None:
        strip_accents = sa

    suppress: list[int] = []
    sup = _get(md, "suppress_tokens")
    if sup is not None:
        suppress = [int(x) for x in np.asarray(sup) if 0 <= int(x) < n]

    _autodetect(tokens, token_bytes, token_to_id, attrs, special)
    eog = _eog(tokens, token_to_id, attrs, special)

    special_tokens = [
        int(i) for i in np.nonzero(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))[0]
    ]
    blen = {i: len(tokens[i].encode("utf-8", "surrogateescape")) for i in special_tokens}
    special_tokens.sort(key=lambda i: -blen[i])

    _model_attrs(md, tokens, token_to_id, attrs, special_tokens, pre_name)

    return Vocab(
        model=model,
        type=vtype,
        tokens=tokens,
        scores=scores,
        attrs=attrs,
        token_to_id=token_to_id,
        pre=pre,
        pre_name=pre_name,
        merges=list(merges),
        special=special,
        default_special=defaults,
        add_space_prefix=add_space_prefix,
        add_bos=add_bos,
        add_eos=add_eos,
        add_sep=add_sep,
        ignore_merges=ignore_merges,
        clean_spaces=clean_spaces,
        remove_extra_whitespaces=remove_extra_ws,
        escape_whitespaces=escape_whitespaces,
        lowercase=lowercase,
        strip_accents=strip_accents,
        eog_ids=frozenset(eog),
        special_tokens=special_tokens,
        precompiled_charsmap=precompiled,
        token_bytes=token_bytes,
        suppress_tokens=suppress,
    )


def _autodetect(
    tokens: list[str],
    token_bytes: tuple[np.ndarray, np.ndarray],
    t2i: dict[str, int],
    attrs: np.ndarray,
    sp: dict,
) -> None:
    """Find eot/eom/fim tokens by their text when the metadata does not name them.

    With several candidates llama.cpp takes the first one its token map iterates over;
    :mod:`._hashorder` replays that order.
    """
    order_of = None
    for name, texts in _AUTO.items():
        if sp.get(name, NULL) != NULL:
            continue
        found = [t2i[t] for t in texts if t in t2i]
        if not found:
            continue
        if len(found) > 1:
            if order_of is None:
                from ._hashorder import map_order_ranks

                order_of = map_order_ranks(*token_bytes)
            tid = min(found, key=order_of.__getitem__) if order_of is not None else min(found)
        else:
            tid = found[0]
        sp[name] = tid
        attrs[tid] |= ATTR_CONTROL
    for i in np.nonzero(attrs & ATTR_CONTROL)[0]:
        if not attrs[i] & ATTR_UNUSED and "unused" in tokens[i]:
            attrs[i] |= ATTR_UNUSED


def _eog(tokens: list[str], t2i: dict[str, int], attrs: np.ndarray, sp: dict) -> set[int]:
    eog: set[int] = set()
    for name in ("fim_pad", "fim_rep", "fim_sep"):
        if sp.get(name, NULL) != NULL:
            eog.add(sp[name])
    for text in _EOG_TEXTS:
        tid = t2i.get(text)
        if tid is not None:
            eog.add(tid)
            attrs[tid] |= ATTR_CONTROL
    for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        tid = t2i.get(text)
        if tid is not None:
            attrs[tid] = ATTR_USER_DEFINED
    for name in ("eos", "eot", "eom"):
        if sp.get(name, NULL) != NULL:
            eog.add(sp[name])
    n = len(tokens)
    texts = {tokens[i]: i for i in eog if 0 <= i < n}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        end = texts["<|end|>"]
        eog.discard(end)
        attrs[end] = ATTR_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        s = texts["</s>"]
        eog.discard(s)
        attrs[s] = ATTR_NORMAL
    return eog


def _model_attrs(
    md: Mapping[str, Any],
    tokens: list[str],
    t2i: dict[str, int],
    attrs: np.ndarray,
    special_tokens: list[int],
    pre_name: str,
) -> None:
    """Per-model lstrip/rstrip attributes llama.cpp sets by model name."""
    name = str(md.get("general.name", "")).lower()
    arch = str(md.get("general.architecture", ""))
    pre_raw = str(_get(md, "pre", ""))

    def set_attr(text: str, attr: int, value: bool) -> None:
        tid = t2i.get(text)
        if tid is None:
            return
        attrs[tid] = attrs[tid] | attr if value else attrs[tid] & ~attr

    if any(s in pre_raw for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for tid in special_tokens:
            attrs[tid] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, ATTR_RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", ATTR_LSTRIP, True)
