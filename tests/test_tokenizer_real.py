"""Tokenization of both real models, token for token against llama.cpp.

Expected values were produced by llama.cpp itself (scripts/make_tokenizer_fixtures.py):
varied text in many scripts, code, whitespace runs, digits, emoji/ZWJ sequences, special
token strings and look-alikes, invalid UTF-8, long inputs; with and without special-token
parsing and BOS/EOS.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_cpp_testdata import attrs_sha256, case_bytes, load_fixture, pieces_sha256
from llamacpy.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

MODELS = ["smollm2", "gemma3"]
_VOCAB_TYPE = {"spm": 1, "bpe": 2, "wpm": 3, "ugm": 4}


@pytest.fixture(scope="module")
def toks(smollm2_path: Path, gemma3_path: Path) -> dict[str, Tokenizer]:
    return {
        "smollm2": Tokenizer.from_gguf(smollm2_path),
        "gemma3": Tokenizer.from_gguf(gemma3_path),
    }


@pytest.fixture(scope="module")
def fixtures() -> dict[str, dict]:
    return {m: load_fixture(f"tokenizer/real_{m}.json.gz") for m in MODELS}


def _summary(bad: list, total: int) -> str:
    lines = [f"{len(bad)}/{total} cases differ from llama.cpp"]
    lines += [f"  {b!r}" for b in bad[:8]]
    return "\n".join(lines)


@pytest.mark.parametrize("model", MODELS)
def test_ids_match_llama_cpp(model: str, toks, fixtures) -> None:
    tok = toks[model]
    cases = fixtures[model]["cases"]
    bad = []
    for c in cases:
        data = case_bytes(c)
        got = tok.encode(data, add_special=c["add_special"], parse_special=c["parse_special"])
        if got != c["ids"]:
            bad.append((data[:80], c["add_special"], c["parse_special"], c["ids"][:12], got[:12]))
    assert not bad, _summary(bad, len(cases))
    assert len(cases) > 800


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(
    ("key", "kwargs"),
    [
        ("detok", {"special": False}),
        ("detok_special", {"special": True}),
        ("detok_remove", {"special": False, "remove_special": True}),
    ],
)
def test_detokenize_matches_llama_cpp(model: str, key: str, kwargs: dict, toks, fixtures) -> None:
    tok = toks[model]
    cases = fixtures[model]["cases"]
    bad = []
    for c in cases:
        got = tok.decode_bytes(c["ids"], **kwargs)
        want = case_bytes(c, key)
        if got != want:
            bad.append((c["ids"][:12], want[:60], got[:60]))
    assert not bad, _summary(bad, len(cases))


@pytest.mark.parametrize("model", MODELS)
def test_vocab_properties_match_llama_cpp(model: str, toks, fixtures) -> None:
    tok = toks[model]
    props = fixtures[model]["props"]
    assert tok.n_vocab == props["n_tokens"]
    assert _VOCAB_TYPE[tok.vocab.type] == props["type"]
    for name in ("bos", "eos", "eot", "sep", "pad", "mask"):
        assert tok.vocab.id(name) == props["ids"][name], name
    for name in ("pre", "suf", "mid", "pad", "rep", "sep"):
        assert tok.vocab.id(f"fim_{name}") == props["ids"][f"fim_{name}"], name
    assert tok.nl == props["ids"]["nl"]
    assert (tok.add_bos, tok.add_eos, tok.add_sep) == (
        props["add_bos"],
        props["add_eos"],
        props["add_sep"],
    )
    assert sorted(tok.eog) == props["eog"]
    assert attrs_sha256(tok) == props["attrs_sha256"]


@pytest.mark.parametrize("model", MODELS)
def test_every_piece_matches_llama_cpp(model: str, toks, fixtures) -> None:
    tok = toks[model]
    props = fixtures[model]["props"]
    assert pieces_sha256(tok, True) == props["pieces_sha256"]
    assert pieces_sha256(tok, False) == props["pieces_nospecial_sha256"]


def test_known_ids(toks) -> None:
    """A few values checked by hand against ``llama-tokenize`` output."""
    smol, gemma = toks["smollm2"], toks["gemma3"]
    assert smol.encode("Hello world") == [19556, 905]
    assert smol.encode("<|im_end|>") == [2]
    assert smol.encode("<|im_end|>", parse_special=False) != [2]
    assert gemma.encode("Hello world") == [2, 9259, 1902]
    assert gemma.encode("<start_of_turn>") == [2, 105]
    assert (smol.bos, smol.eos, gemma.bos, gemma.eos) == (1, 2, 2, 1)
