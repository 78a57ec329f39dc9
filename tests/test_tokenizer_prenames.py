"""Every ``tokenizer.ggml.pre`` name llama.cpp knows, on one BPE vocabulary.

llama.cpp's GPT-2 test vocabulary was re-labelled with each pre-tokenizer name
(scripts/make_pre_vocabs.py) and llama.cpp tokenized and detokenized a corpus with each
(scripts/make_tokenizer_fixtures.py --pre-dir). The same vocabulary with the same name must
give the same ids and text here: this exercises every regex set (hand-written splitters and
the collapsed-category regex path) and every per-name flag (ignore_merges, clean_spaces,
add_bos, escape_whitespaces, ...). "whitespace" is absent: llama.cpp aborts on it with a
byte-level vocabulary (a space reaches its BPE merge lookup).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_cpp_testdata import case_bytes, llama_cpp_testdata, load_fixture  # noqa: F401
from llamacpy.gguf.reader import GGUFReader
from llamacpy.tokenizer import Tokenizer
from llamacpy.tokenizer.pretokenize import PRE_NAMES

_FIX = load_fixture("tokenizer/pre_names.json.gz")
NAMES = sorted(_FIX["names"])


@pytest.fixture(scope="module")
def gpt2_metadata(llama_cpp_testdata: Path) -> dict:  # noqa: F811
    with GGUFReader(llama_cpp_testdata / "models/ggml-vocab-gpt-2.gguf") as r:
        return dict(r.metadata)


def test_all_names_covered() -> None:
    assert set(NAMES) == set(PRE_NAMES) - {"whitespace"}


@pytest.mark.parametrize("name", NAMES)
def test_pre_name(name: str, gpt2_metadata: dict) -> None:
    md = dict(gpt2_metadata)
    md["tokenizer.ggml.pre"] = name
    tok = Tokenizer.from_metadata(md)
    res = _FIX["results"][_FIX["names"][name]]
    bad = []
    for text_rec, ids, detok in zip(_FIX["texts"], res["ids"], res["detok"], strict=True):
        text = case_bytes(text_rec)
        got = tok.encode(text, add_special=True, parse_special=True)
        if got != ids:
            bad.append(("ids", text[:40], ids[:10], got[:10]))
            continue
        want = text if detok is None else case_bytes(detok)
        if tok.decode_bytes(ids) != want:
            bad.append(("detok", text[:40]))
    assert not bad, f"{len(bad)} mismatches: {bad[:5]}"
