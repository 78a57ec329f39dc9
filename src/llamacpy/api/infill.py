"""Fill-in-the-middle prompts, as llama-server's ``/infill`` assembles them.

The repository-level pattern (used by Qwen2.5-Coder and others)::

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n extra text 0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt

without the repository part when the vocabulary has no such tokens (extra chunks are then
separated by a plain-text marker). The prefix keeps its last ``3/4`` of a batch, the suffix
its first ``n_batch/4 - 2 - len(prompt)`` tokens, the extra chunks what is left of the
context after a batch and two generations (their last tokens). ``spm`` puts the suffix
first (``--spm-infill``). A vocabulary without FIM prefix, suffix and middle tokens cannot
infill (:func:`missing_fim_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UsageError

_CHUNK_MARK = "\n\n--- snippet ---\n\n"  # between extra chunks without a file separator


def missing_fim_tokens(tok: Any) -> list[str]:
    """The FIM roles the vocabulary lacks (prefix, suffix, middle)."""
    v = tok.vocab
    return [w for w, n in (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid"))
            if v.id(n) < 0]  # fmt: skip


def mixed_tokens(tok: Any, value: Any, what: str, n_vocab: int) -> list[int]:
    """A string, or an array of strings and token ids (llama-server's mixed prompt), as
    tokens (no BOS, special tokens not parsed)."""
    if isinstance(value, str):
        return tok.encode(value, add_special=False, parse_special=False)
    if not isinstance(value, list):
        raise UsageError(f"'{what}' must be a string or an array of strings and token ids")
    out: list[int] = []
    for part in value:
        if isinstance(part, str):
            out += tok.encode(part, add_special=False, parse_special=False)
        elif isinstance(part, int) and not isinstance(part, bool) and 0 <= part < n_vocab:
            out.append(part)
        else:
            raise UsageError(f"'{what}' holds {part!r}: not a string or a token id below {n_vocab}")
    return out


def check_extra(value: Any) -> list[dict[str, str]]:
    """``input_extra``: an array of ``{"text": str, "filename"?: str}``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise UsageError('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise UsageError('extra_context chunk\'s "filename" field must be a string')
    return value


def infill_tokens(
    tok: Any,
    prefix: list[int],
    suffix: list[int],
    extra: Sequence[dict[str, str]],
    prompt: list[int],
    *,
    n_batch: int,
    n_predict: int,
    n_ctx: int,
    spm: bool = False,
) -> list[int]:
    """The prompt of an infill request (see the module docstring)."""
    v = tok.vocab
    pre, suf, mid, rep, sep = (v.id(n) for n in ("fim_pre", "fim_suf", "fim_mid", "fim_rep",
                                                 "fim_sep"))  # fmt: skip

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special=False, parse_special=False)

    extra_tokens: list[int] = []
    if rep >= 0:
        extra_tokens += [rep, *enc("myproject\n")]
    for chunk in extra:
        if sep >= 0:
            extra_tokens += [sep, *enc(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_tokens += enc(_CHUNK_MARK)
        extra_tokens += enc(chunk["text"])
    if sep >= 0:
        extra_tokens += [sep, *enc("filename\n")]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [pre, *prefix[len(prefix) - n_prefix :], *prompt]
    tail = [suf, *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    if tok.add_bos:
        first = [tok.bos, *first]
    return [*extra_tokens[len(extra_tokens) - n_extra :], *first, *second, mid]
