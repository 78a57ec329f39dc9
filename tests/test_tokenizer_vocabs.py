"""llama.cpp's tokenizer test vocabularies (``models/ggml-vocab-*.gguf``).

Each vocabulary is checked against its ``.inp``/``.out`` golden pairs (llama.cpp's own
test-tokenizer-0 data, fetched from the llama-cpp-python sdist) and against what llama.cpp
returns for the same texts plus a generic corpus with special-token parsing on
(``tests/fixtures/tokenizer/vocabs.json.gz``), together with the loaded vocabulary's
properties.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_cpp_testdata import (
    attrs_sha256,
    case_bytes,
    llama_cpp_testdata,  # noqa: F401  (fixture)
    load_fixture,
    pieces_sha256,
    read_vocab_tests,
)
from llamacpy.tokenizer import Tokenizer

_FIXTURE = load_fixture("tokenizer/vocabs.json.gz")["vocabs"]
VOCABS = sorted(_FIXTURE)
_VOCAB_TYPE = {"spm": 1, "bpe": 2, "wpm": 3, "ugm": 4}


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request, llama_cpp_testdata: Path) -> tuple[str, Path, Tokenizer]:  # noqa: F811
    """(name, path, tokenizer); module-scoped so each vocabulary is loaded once."""
    path = llama_cpp_testdata / "models" / request.param
    return request.param, path, Tokenizer.from_gguf(path)


def test_golden_files(vocab) -> None:
    name, gguf, tok = vocab
    if not gguf.with_name(name + ".inp").exists():
        pytest.skip("llama.cpp ships no .inp/.out pairs for this vocabulary")
    tests = read_vocab_tests(gguf)
    bad = []
    for text, expected in tests:
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != expected:
            bad.append((text[:60], expected[:10], got[:10]))
    assert not bad, f"{len(bad)}/{len(tests)} golden tests fail: {bad[:5]}"
    assert len(tests) >= 40


def test_matches_llama_cpp(vocab) -> None:
    name, _, tok = vocab
    bad = []
    cases = _FIXTURE[name]["cases"]
    for c in cases:
        data = case_bytes(c)
        got = tok.encode(data, add_special=c["add_special"], parse_special=c["parse_special"])
        if got != c["ids"]:
            bad.append(("ids", data[:50], c["ids"][:10], got[:10]))
        if tok.decode_bytes(c["ids"]) != case_bytes(c, "detok"):
            bad.append(("detok", c["ids"][:10]))
        if tok.decode_bytes(c["ids"], special=True) != case_bytes(c, "detok_special"):
            bad.append(("detok_special", c["ids"][:10]))
        if tok.decode_bytes(c["ids"], remove_special=True) != case_bytes(c, "detok_remove"):
            bad.append(("detok_remove", c["ids"][:10]))
    assert not bad, f"{len(bad)} mismatches over {len(cases)} cases: {bad[:5]}"


def test_properties(vocab) -> None:
    name, _, tok = vocab
    props = _FIXTURE[name]["props"]
    assert tok.n_vocab == props["n_tokens"]
    assert _VOCAB_TYPE[tok.vocab.type] == props["type"]
    ids = props["ids"]
    for key in ("bos", "eos", "eot", "sep", "pad", "mask", "nl"):
        got = tok.nl if key == "nl" else tok.vocab.id(key)
        assert got == ids[key], key
    for key in ("pre", "suf", "mid", "pad", "rep", "sep"):
        assert tok.vocab.id(f"fim_{key}") == ids[f"fim_{key}"], key
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == (
        props["add_bos"],
        props["add_eos"],
        props["add_sep"],
    )
    assert sorted(tok.eog) == props["eog"]
    assert attrs_sha256(tok) == props["attrs_sha256"]
    assert pieces_sha256(tok, True) == props["pieces_sha256"]
    assert pieces_sha256(tok, False) == props["pieces_nospecial_sha256"]
