"""``tokenizer.ggml.pre``: which pre-tokenizer a BPE or WordPiece vocabulary needs.

llama.cpp's converter tokenizes a fixed check text with the Hugging Face tokenizer, hashes
the token ids (``sha256(str(ids))``) and looks the hash up in a table of known tokenizers.
We compute the same hash without ``transformers``: llamacpy's own tokenizer (which matches
llama.cpp, and llama.cpp matches the Hugging Face tokenizers it supports) tokenizes the text
with each candidate pre-tokenizer, and a candidate is accepted when its hash is in the table.
Candidates whose regex appears in ``tokenizer.json``'s pre-tokenizer are tried first, so
usually one tokenization is enough. The special tokens Hugging Face adds around the text
(BOS, CLS/SEP) come from ``tokenizer.json``'s post-processor.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..tokenizer import Tokenizer, TokenizerError
from ..tokenizer.pretokenize import PRE_NAMES, PreTokenizer
from ._pre_hashes import CHKTXT, PRE_HASHES
from .common import ConvertError

KNOWN: dict[str, str] = dict(PRE_HASHES)  # a later duplicate wins, as in llama.cpp
_ENCODE_ONLY_FLAGS = ("clean_spaces", "add_bos", "add_sep", "add_eos")


def chkhsh(ids: Sequence[int]) -> str:
    return hashlib.sha256(str(list(ids)).encode()).hexdigest()


def added_specials(tokenizer_json: dict[str, Any] | None) -> tuple[list[int], list[int]]:
    """Token ids the Hugging Face tokenizer puts before and after a single text."""
    post = (tokenizer_json or {}).get("post_processor")
    before: list[int] = []
    after: list[int] = []
    if not isinstance(post, dict):
        return before, after
    for proc in post.get("processors", [post]):
        if not isinstance(proc, dict):
            continue
        kind = proc.get("type")
        if kind in ("RobertaProcessing", "BertProcessing"):
            before, after = [int(proc["cls"][1])], [int(proc["sep"][1])]
        elif kind == "TemplateProcessing":
            specials = proc.get("special_tokens") or {}
            seq: list[int] = []
            pre: list[int] = []
            seen_a = False
            for item in proc.get("single") or []:
                if "Sequence" in item:
                    seen_a = True
                    continue
                sid = item.get("SpecialToken", {}).get("id")
                ids = [int(i) for i in (specials.get(sid) or {}).get("ids", [])]
                (seq if seen_a else pre).extend(ids)
            before, after = pre, seq
    return before, after


def _behaviour(pre: PreTokenizer) -> tuple:
    flags = tuple(sorted((k, v) for k, v in pre.flags.items() if k not in _ENCODE_ONLY_FLAGS))
    return (pre.type, pre.regexes, pre.byte_encode, flags)


_CASE_INSENSITIVE = "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_EXPANDED = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"


def hf_regexes(pre_tokenizer: Any) -> set[str]:
    """The splitting regexes of a tokenizer.json pre-tokenizer, in llama.cpp's spelling."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n)
        elif isinstance(node, dict):
            if node.get("type") == "Split":
                pattern = node.get("pattern") or {}
                rx = pattern.get("Regex", pattern.get("String"))
                if isinstance(rx, str):
                    found.add(rx.replace(_CASE_INSENSITIVE, _EXPANDED))
            elif node.get("type") == "ByteLevel" and node.get("use_regex", True):
                found.add(_GPT2_REGEX)
            for v in node.values():
                walk(v)

    walk(pre_tokenizer)
    return found


def _candidate_groups(regexes: set[str], ignore_merges: bool | None) -> list[list[str]]:
    """Known names that llamacpy can tokenize, grouped by identical behaviour, best first:
    those whose regexes appear in tokenizer.json (and whose ignore_merges agrees) lead."""
    groups: dict[tuple, list[str]] = {}
    for name in dict.fromkeys(KNOWN.values()):
        pre = PRE_NAMES.get(name)
        if pre is not None:
            groups.setdefault(_behaviour(pre), []).append(name)

    def rank(item: tuple[tuple, list[str]]) -> int:
        pre = PRE_NAMES[item[1][0]]
        score = 0
        if regexes and set(pre.regexes) <= regexes:
            score -= 4
        elif any(r in regexes for r in pre.regexes):
            score -= 2
        if ignore_merges is not None and pre.flags.get("ignore_merges", False) == ignore_merges:
            score -= 1
        return score

    return [names for _, names in sorted(groups.items(), key=rank)]


def identify_bpe(
    tokens: list[str],
    types: list[int],
    merges: list[str],
    tokenizer_json: dict[str, Any] | None,
) -> tuple[str, str]:
    """``(tokenizer.ggml.pre, chkhsh)`` of a byte-level BPE vocabulary."""
    before, after = added_specials(tokenizer_json)
    tj = tokenizer_json or {}
    regexes = hf_regexes(tj.get("pre_tokenizer"))
    model = tj.get("model") if isinstance(tj.get("model"), dict) else {}
    ignore = model.get("ignore_merges") if isinstance(model.get("ignore_merges"), bool) else None
    md = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
        "tokenizer.ggml.merges": merges,
    }
    fallback: tuple[str, str] | None = None
    first_hash = None
    for names in _candidate_groups(regexes, ignore):
        md["tokenizer.ggml.pre"] = names[0]
        try:
            ids = Tokenizer.from_metadata(md).encode(CHKTXT, add_special=False, parse_special=False)
        except TokenizerError as e:
            raise ConvertError(f"cannot tokenize with this vocabulary: {e}") from None
        h = chkhsh(before + ids + after)
        first_hash = first_hash or h
        found = KNOWN.get(h)
        if found is None:
            continue
        if found in names:
            return found, h
        fallback = fallback or (found, h)
    if fallback is not None:
        return fallback
    raise ConvertError(
        "the BPE pre-tokenizer was not recognized: its check-text hash "
        f"(chkhsh {first_hash}) is not one llama.cpp knows (convert_hf_to_gguf_update.py)"
    )


def identify_wpm(
    tokens: list[str], types: list[int], before: list[int], after: list[int]
) -> tuple[str, str]:
    """``(tokenizer.ggml.pre, chkhsh)`` of a WordPiece vocabulary (tokens in phantom-space
    form, as stored in GGUF); ``before``/``after`` are the ids the tokenizer adds (CLS, SEP)."""
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "bert",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.asarray(types, dtype=np.int32),
    }
    try:
        ids = Tokenizer.from_metadata(md).encode(CHKTXT, add_special=False, parse_special=False)
    except TokenizerError as e:
        raise ConvertError(f"cannot tokenize with this vocabulary: {e}") from None
    h = chkhsh(before + ids + after)
    found = KNOWN.get(h)
    if found is None:
        raise ConvertError(
            f"the WordPiece tokenizer was not recognized: its check-text hash (chkhsh {h}) is "
            "not one llama.cpp knows (convert_hf_to_gguf_update.py)"
        )
    return found, h
