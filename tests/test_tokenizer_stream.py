"""The streaming detokenizer: its pieces concatenate to llama.cpp's detokenization, and no
piece ever carries part of a UTF-8 character."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_cpp_testdata import (
    case_bytes,
    llama_cpp_testdata,  # noqa: F401  (fixture)
    load_fixture,
)
from llamacpy.tokenizer import Tokenizer


def _stream(tok: Tokenizer, ids: list[int], **kw) -> list[str]:
    dec = tok.stream_decoder(**kw)
    chunks = [dec.feed(t) for t in ids]
    chunks.append(dec.flush())
    return chunks


def _check_cases(tok: Tokenizer, cases: list[dict]) -> None:
    bad = []
    for c in cases:
        ids = c["ids"]
        for key, kw in (
            ("detok", {}),
            ("detok_special", {"special": True}),
            ("detok_remove", {"remove_special": True}),
        ):
            want = case_bytes(c, key)
            chunks = _stream(tok, ids, **kw)
            if "".join(chunks) != want.decode("utf-8", "replace"):
                bad.append((key, ids[:10], want[:40], "".join(chunks)[:40]))
            elif "\ufffd" not in want.decode("utf-8", "replace"):
                # valid text: no chunk may hold a broken character
                assert all("\ufffd" not in ch for ch in chunks)
    assert not bad, f"{len(bad)} streams differ: {bad[:5]}"


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_stream_equals_llama_cpp_detokenize(model: str, request) -> None:
    path = request.getfixturevalue(f"{model}_path")
    tok = Tokenizer.from_gguf(path)
    _check_cases(tok, load_fixture(f"tokenizer/real_{model}.json.gz")["cases"])


@pytest.mark.parametrize(
    "name",
    [
        "ggml-vocab-llama-spm.gguf",  # SPM with a space prefix to strip
        "ggml-vocab-gpt-2.gguf",  # BPE with clean_up_tokenization_spaces
        "ggml-vocab-bert-bge.gguf",  # WPM with clean-up
        "ggml-vocab-nomic-bert-moe.gguf",  # UGM, adds EOS
        "ggml-vocab-phi-3.gguf",
    ],
)
def test_stream_on_test_vocabs(name: str, llama_cpp_testdata: Path) -> None:  # noqa: F811
    tok = Tokenizer.from_gguf(llama_cpp_testdata / "models" / name)
    _check_cases(tok, load_fixture("tokenizer/vocabs.json.gz")["vocabs"][name]["cases"])


@pytest.mark.real_model
def test_multibyte_character_split_over_tokens(smollm2_path: Path) -> None:
    tok = Tokenizer.from_gguf(smollm2_path)
    text = "emoji 😀👩🏾‍💻 ½ 你好"
    ids = tok.encode(text, add_special=False)
    # byte-level BPE splits these characters over several tokens
    assert any(not tok.token_to_piece(t).decode("utf-8", "ignore") for t in ids)
    chunks = _stream(tok, ids)
    assert "".join(chunks) == text
    assert all("\ufffd" not in ch for ch in chunks)
    # held back until complete, then released at once
    dec = tok.stream_decoder()
    out = []
    for t in ids:
        piece = dec.feed(t)
        out.append(piece)
        assert piece.encode("utf-8").decode("utf-8") == piece
    assert "".join(out) + dec.flush() == text


@pytest.mark.real_model
def test_incomplete_tail_is_flushed_as_replacement(smollm2_path: Path) -> None:
    tok = Tokenizer.from_gguf(smollm2_path)
    ids = tok.encode("😀", add_special=False)
    assert len(ids) > 1
    dec = tok.stream_decoder()
    assert dec.feed(ids[0]) == ""
    assert dec.flush() == tok.decode(ids[:1]) == "\ufffd"
