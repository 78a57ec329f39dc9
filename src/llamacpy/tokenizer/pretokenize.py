"""BPE pre-tokenization: every ``tokenizer.ggml.pre`` name llama.cpp knows, and the splitter.

``PRE_NAMES`` maps each name to llama.cpp's pre-tokenizer type and the flags that name sets
(``clean_spaces``, ``ignore_merges``, ...). ``REGEXES`` (generated from llama.cpp's source)
maps each type to its list of regexes; :func:`regex_split` applies them one after another
the way llama.cpp's ``unicode_regex_split`` does: its hand-written splitters for the regexes
it special-cases, otherwise a regex over the "collapsed" text in which every non-ASCII code
point is replaced by one byte naming its category (llama.cpp's own trick, which decides
what ``\\p{L}`` etc. match).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import numpy as np

from . import _splitters as sp
from . import unicode as uni
from ._pre_regexes import RAW_UTF8, REGEXES
from .errors import TokenizerError, UnknownPreTokenizerError

__all__ = ["PRE_NAMES", "REGEXES", "PreTokenizer", "pre_tokenizer", "regex_split"]


@dataclass(frozen=True)
class PreTokenizer:
    """What a ``tokenizer.ggml.pre`` name selects in llama.cpp."""

    name: str
    type: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_* without the prefix
    regexes: tuple[str, ...]
    byte_encode: bool = True
    # vocab flags the name sets (None: keep the BPE default)
    flags: dict[str, bool] = field(default_factory=dict)
    bos_null: bool = False  # chatglm/glm: no BOS token


_NC = {"clean_spaces": False}
_NC_IM = {"clean_spaces": False, "ignore_merges": True}

# name -> (type, flags, bos_null); order and content follow llama_vocab::impl::load
_NAMES: list[tuple[tuple[str, ...], str, dict[str, bool], bool]] = [
    (("default",), "DEFAULT", {}, False),
    (("minicpm5",), "MINICPM5", {"ignore_merges": True}, False),
    (
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        "LLAMA3",
        {"ignore_merges": True, "add_bos": True},
        False,
    ),
    (("deepseek-llm",), "DEEPSEEK_LLM", _NC, False),
    (("deepseek-coder",), "DEEPSEEK_CODER", _NC, False),
    (("deepseek-v3",), "DEEPSEEK3_LLM", _NC, False),
    (("spark2_5",), "SPARK2_5", _NC, False),
    (("youtu",), "YOUTU", _NC_IM, False),
    (("falcon",), "FALCON", {}, False),
    (("mpt",), "MPT", {}, False),
    (("starcoder",), "STARCODER", {}, False),
    (
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
        ),
        "GPT2",
        {},
        False,
    ),
    (("jais-2",), "JAIS2", {}, False),
    (("gemma4", "granite-embed-multi-311m"), "GEMMA4", {"escape_whitespaces": True}, False),
    (("sarvam-moe",), "SARVAM_MOE", {"escape_whitespaces": True, "clean_spaces": False}, False),
    (("jina-v1-en", "jina-v2-code", "roberta-bpe"), "GPT2", {"add_sep": True}, False),
    (("whitespace",), "WHITESPACE", {"lowercase": False}, False),
    (("refact",), "REFACT", {}, False),
    (("command-r",), "COMMAND_R", _NC, False),
    (("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), "QWEN2", _NC, False),
    (("qwen35",), "QWEN35", _NC, False),
    (("stablelm2",), "STABLELM2", {}, False),
    (("olmo",), "OLMO", {}, False),
    (("dbrx",), "DBRX", {}, False),
    (("smaug-bpe",), "SMAUG", {}, False),
    (("poro-chat",), "PORO", _NC, False),
    (("chatglm-bpe",), "CHATGLM4", {}, True),
    (("glm4", "glm5"), "CHATGLM4", {"ignore_merges": True}, True),
    (("viking",), "VIKING", _NC, False),
    (("jais",), "JAIS", {}, False),
    (("tekken",), "TEKKEN", {**_NC_IM, "add_bos": True}, False),
    (("smollm",), "SMOLLM", _NC, False),
    (("codeshell",), "CODESHELL", {}, False),
    (("bloom",), "BLOOM", {}, False),
    (("gpt3-finnish",), "GPT3_FINNISH", {}, False),
    (("exaone",), "EXAONE", {}, False),
    (("exaone4",), "GPT2", {}, False),
    (("exaone-moe",), "EXAONE_MOE", {}, False),
    (("chameleon",), "CHAMELEON", {"add_bos": True, "clean_spaces": False}, False),
    (("minerva-7b",), "MINERVA", {}, False),
    (("megrez",), "QWEN2", {}, False),
    (("gpt-4o", "llama4", "kanana2", "talkie"), "GPT4O", _NC, False),
    (("granite-embed-multi-97m",), "GRANITE_EMB_MULTI", _NC_IM, False),
    (("tiny_aya", "cohere2moe"), "TINY_AYA", _NC, False),
    (("superbpe",), "SUPERBPE", _NC, False),
    (("trillion",), "TRILLION", _NC, False),
    (("granite-docling",), "GRANITE_DOCLING", _NC, False),
    (("bailingmoe", "bailingmoe2", "llada-moe"), "BAILINGMOE", _NC, False),
    (("seed-coder",), "SEED_CODER", _NC, False),
    (("hunyuan",), "HUNYUAN", _NC, False),
    (("hunyuan-dense",), "HUNYUAN_DENSE", _NC, False),
    (("hy_v4",), "HY_V4", _NC, False),
    (("joyai-llm",), "JOYAI_LLM", _NC, False),
    (("kimi-k2",), "KIMI_K2", _NC, False),
    (("ufakzeka",), "UFAKZEKA", _NC, False),
    (("grok-2",), "GROK_2", _NC, False),
    (("afmoe",), "AFMOE", _NC, False),
    (("laguna",), "LAGUNA", _NC, False),
    (("minimax-m2",), "MINIMAX_M2", _NC, False),
    (("solar-open",), "SOLAR_OPEN", _NC, False),
    (("mellum2",), "MELLUM2", {}, False),
]

PRE_NAMES: dict[str, PreTokenizer] = {
    name: PreTokenizer(
        name=name,
        type=type_,
        regexes=REGEXES[type_],
        byte_encode=type_ not in RAW_UTF8,
        flags=dict(flags),
        bos_null=bos_null,
    )
    for names, type_, flags, bos_null in _NAMES
    for name in names
}


def pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value ("" means llama.cpp's default)."""
    if name == "":
        return PRE_NAMES["default"]
    try:
        return PRE_NAMES[name]
    except KeyError:
        raise UnknownPreTokenizerError(
            f"unknown pre-tokenizer type: {name!r} (tokenizer.ggml.pre); llama.cpp knows "
            f"{len(PRE_NAMES)} names"
        ) from None


# --- splitting ----------------------------------------------------------------------------

_RE_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_RE_LLAMA3 = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
)
_RE_QWEN2 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_RE_QWEN35 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?"
    "[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_RE_NEWLINES = "[^\\n]+|[\\n]+"
_RE_TINY_AYA_DIGITS = "\\d{1,3}(?=(?:\\d{3})*\\b)"

# unicode categories llama.cpp's regex fallback understands, and their collapsed bytes
_UCAT = {
    "\\p{N}": uni.NUMBER,
    "\\p{L}": uni.LETTER,
    "\\p{P}": uni.PUNCTUATION,
    "\\p{M}": uni.ACCENT_MARK,
    "\\p{S}": uni.SYMBOL,
    "\\p{Lu}": uni.LETTER,
    "\\p{Ll}": uni.LETTER,
    "\\p{Lt}": uni.LETTER,
    "\\p{Lm}": uni.LETTER,
    "\\p{Lo}": uni.LETTER,
}
_UCAT_BYTE = {
    uni.NUMBER: 0xD1,
    uni.LETTER: 0xD2,
    uni.PUNCTUATION: 0xD3,
    uni.ACCENT_MARK: 0xD4,
    uni.SYMBOL: 0xD5,
}
_UCAT_ASCII = {
    uni.NUMBER: "0-9",
    uni.LETTER: "A-Za-z",
    uni.PUNCTUATION: "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
    uni.ACCENT_MARK: "",
    uni.SYMBOL: "\\$\\+<->^`\\|\\~",
}


def _uses_categories(regex: str) -> bool:
    return any(cat in regex for cat in _UCAT)


@functools.cache
def _collapse_lut() -> np.ndarray:
    """flags -> collapsed byte, for code points >= 128."""
    lut = np.full(1 << 16, 0xD0, dtype=np.uint8)
    cats = np.arange(1 << 16) & uni.MASK_CATEGORIES
    for cat, byte in _UCAT_BYTE.items():
        lut[cats == cat] = byte
    lut[(np.arange(1 << 16) & uni.WHITESPACE) != 0] = 0x0B
    return lut


def _collapse_text(cpts: np.ndarray) -> bytes:
    flags = uni.cpt_flags()[np.minimum(cpts, uni.MAX_CODEPOINTS - 1)]
    out = _collapse_lut()[flags]
    ascii_ = cpts < 128
    out[ascii_] = cpts[ascii_]
    return out.tobytes()


def _dollar_to_end(regex: str) -> str:
    """ECMAScript ``$`` (no multiline) is Python's ``\\Z``."""
    out = []
    inside = escaped = False
    for ch in regex:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif ch == "[":
            inside = True
            out.append(ch)
        elif ch == "]":
            inside = False
            out.append(ch)
        elif ch == "$" and not inside:
            out.append("\\Z")
        else:
            out.append(ch)
    return "".join(out)


@functools.cache
def _compile_collapsed(regex: str) -> re.Pattern[bytes]:
    """llama.cpp's collapsed form of a regex using \\p{..} categories, as a bytes pattern."""
    if any(ord(c) >= 128 for c in regex):
        raise TokenizerError(
            "regex includes both unicode categories and non-ASCII characters - not supported"
        )
    out: list[str] = []
    inside = False
    i = 0
    n = len(regex)
    while i < n:
        ch = regex[i]
        if ch == "[" and (i == 0 or regex[i - 1] != "\\"):
            out.append("[")
            inside = True
            i += 1
            continue
        if inside and ch == "]" and regex[i - 1] != "\\":
            out.append("]")
            inside = False
            i += 1
            continue
        if ch == "\\" and i + 3 < n and regex[i + 1] == "p" and regex[i + 2] == "{":
            close = regex.find("}", i + 3)
            if close != -1 and close <= i + 10:
                pat = regex[i : close + 1]
                if pat in _UCAT:
                    cat = _UCAT[pat]
                    body = chr(_UCAT_BYTE[cat]) + _UCAT_ASCII[cat]
                    out.append(body if inside else f"[{body}]")
                    i = close + 1
                    continue
        out.append(ch)
        i += 1
    collapsed = _dollar_to_end("".join(out))
    return re.compile(collapsed.encode("latin-1"))


@functools.cache
def _compile_wide(regex: str) -> re.Pattern[str]:
    return re.compile(_dollar_to_end(regex), re.ASCII)


def _split_stl(pattern: re.Pattern, text: str | bytes, offsets: list[int]) -> list[int]:
    """llama.cpp's ``unicode_regex_split_stl``: matches and the gaps between them."""
    out: list[int] = []
    start = 0
    for off in offsets:
        chunk = text[start : start + off]
        prev = 0
        for m in pattern.finditer(chunk):
            pos, end = m.span()
            if pos > prev:
                out.append(pos - prev)
            out.append(end - pos)
            prev = end
        if prev < off:
            out.append(off - prev)
        start += off
    return out


def _wide_text(text: str, cpts: np.ndarray) -> str:
    """Non-ASCII whitespace -> U+000B, as llama.cpp feeds std::wregex."""
    if cpts.size == 0 or int(cpts.max()) < 128:
        return text
    flags = uni.cpt_flags()[np.minimum(cpts, uni.MAX_CODEPOINTS - 1)]
    ws = (cpts > 0x7F) & ((flags & uni.WHITESPACE) != 0)
    if not ws.any():
        return text
    wide = cpts.copy()
    wide[ws] = 0x0B
    return wide.astype("<u4").tobytes().decode("utf-32-le", "surrogatepass")


def split_offsets(
    text: str, regexes: tuple[str, ...], initial: list[int] | None = None
) -> list[int]:
    """Segment lengths (in code points) after applying every regex in turn.

    ``initial``: lengths of independent pieces of ``text`` (nothing is matched across
    them), as llama.cpp's ``unicode_regex_split`` receives one fragment at a time.
    """
    cpts = uni.str_to_cpts(text)
    if initial is None:
        initial = [cpts.shape[0]]
    offsets = np.asarray(initial, dtype=np.int64)
    collapsed: bytes | None = None
    wide: str | None = None
    for regex in regexes:
        custom = _custom(regex, cpts, offsets)
        if custom is not None and custom.shape[0] > 0:
            offsets = custom
            continue
        if regex == "\\p{AFMoE_digits}":
            raise TokenizerError("failed to process regex '\\p{AFMoE_digits}'")
        if _uses_categories(regex):
            if collapsed is None:
                collapsed = _collapse_text(cpts)
            res = _split_stl(_compile_collapsed(regex), collapsed, offsets.tolist())
        else:
            if wide is None:
                wide = _wide_text(text, cpts)
            res = _split_stl(_compile_wide(regex), wide, offsets.tolist())
        offsets = np.asarray(res, dtype=np.int64)
    return offsets.tolist()


def _custom(regex: str, cpts: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    if regex == _RE_GPT2:
        return sp.split_gpt2(cpts, uni.cpt_flags(), offsets)
    if regex in _RE_LLAMA3:
        return sp.split_llama3(cpts, uni.cpt_flags(), uni.lowercase_table(), offsets, 3, False)
    if regex == _RE_QWEN2:
        return sp.split_llama3(cpts, uni.cpt_flags(), uni.lowercase_table(), offsets, 1, False)
    if regex == _RE_QWEN35:
        return sp.split_llama3(cpts, uni.cpt_flags(), uni.lowercase_table(), offsets, 1, True)
    if regex == "\\p{Han}+":
        return sp.split_kimi_k2(cpts, uni.cpt_flags(), uni.lowercase_table(), offsets)
    if regex in ("\\p{AFMoE_digits}", _RE_TINY_AYA_DIGITS):
        return sp.split_digit_groups(cpts, uni.cpt_flags(), offsets)
    if regex == _RE_NEWLINES:
        return sp.split_newlines(cpts, offsets)
    return None


def regex_split(text: str, regexes: tuple[str, ...]) -> list[str]:
    """Split ``text`` into llama.cpp's pre-tokens (zero-length pieces included)."""
    if not text:
        return []
    words = []
    pos = 0
    for off in split_offsets(text, regexes):
        words.append(text[pos : pos + off])
        pos += off
    return words
