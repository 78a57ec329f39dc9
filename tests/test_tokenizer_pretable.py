"""The pre-tokenizer table and unicode tables agree with llama.cpp's source.

``src/llama-vocab.cpp`` comes from the llama-cpp-python sdist (see llama_cpp_testdata): every
``tokenizer.ggml.pre`` name it accepts must map to the same pre-tokenizer type and flags
here, and every type's regex list must be the one in the source.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from llama_cpp_testdata import llama_cpp_testdata  # noqa: F401  (fixture)
from llamacpy.tokenizer import unicode as uni
from llamacpy.tokenizer._pre_regexes import RAW_UTF8, REGEXES
from llamacpy.tokenizer.pretokenize import PRE_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import make_pretokenizer_table

_FLAGS = {
    "clean_spaces = false;": ("clean_spaces", False),
    "ignore_merges = true;": ("ignore_merges", True),
    "add_bos = true;": ("add_bos", True),
    "add_sep = true;": ("add_sep", True),
    "escape_whitespaces = true;": ("escape_whitespaces", True),
    "normalizer_opts.lowercase = false;": ("lowercase", False),
}


def _name_table(src: str) -> dict[str, tuple[str, dict[str, bool], bool]]:
    start = src.index("if (type == LLAMA_VOCAB_TYPE_BPE) {")
    end = src.index("} else if (type == LLAMA_VOCAB_TYPE_SPM) {", start)
    body = src[start:end]
    table = {}
    for block in re.split(r"\}\s*else if\s*\(", body):
        names = re.findall(r'tokenizer_pre == "([^"]+)"', block)
        m = re.search(r"pre_type = LLAMA_VOCAB_PRE_TYPE_(\w+);", block)
        if not names or not m:
            continue
        flags = dict(v for k, v in _FLAGS.items() if k in block)
        bos_null = "special_bos_id = LLAMA_TOKEN_NULL;" in block
        for n in names:
            table[n] = (m.group(1), flags, bos_null)
    return table


@pytest.fixture(scope="module")
def vocab_cpp(llama_cpp_testdata: Path) -> str:  # noqa: F811
    return (llama_cpp_testdata / "src/llama-vocab.cpp").read_text()


def test_every_pre_name(vocab_cpp: str) -> None:
    table = _name_table(vocab_cpp)
    assert len(table) >= 90
    assert sorted(table) == sorted(PRE_NAMES)
    for name, (type_, flags, bos_null) in table.items():
        pre = PRE_NAMES[name]
        assert pre.type == type_, name
        assert pre.flags == flags, name
        assert pre.bos_null == bos_null, name


def test_regex_table(vocab_cpp: str) -> None:
    table, raw = make_pretokenizer_table.parse(vocab_cpp)
    assert {k: tuple(v) for k, v in table.items()} == REGEXES
    assert raw == set(RAW_UTF8)


def test_unicode_flags_sanity() -> None:
    flags = uni.cpt_flags()
    assert flags[ord("a")] & uni.LETTER and flags[ord("a")] & uni.LOWERCASE
    assert flags[ord("7")] & uni.NUMBER
    assert flags[0x3000] & uni.WHITESPACE
    assert flags[0x0301] & uni.ACCENT_MARK
    assert uni.tolower(ord("Ä")) == ord("ä")
    assert uni.decode_utf8(b"a\xffb") == "a\ufffdb"
