"""The grammar matcher: llama.cpp's integration cases, and masks against a token-by-token
check over real vocabularies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.grammar import GrammarError
from llamacpy.grammar import kernels as K
from llamacpy.grammar.matcher import GrammarMatcher, GrammarVocab

FIX = Path(__file__).parent / "fixtures/grammar"
CASES = [c for c in json.loads((FIX / "integration_cases.json").read_text()) if "grammar" in c]
TINY = GrammarVocab([b"a", b"b"])


def matches(grammar: str, pieces: list) -> bool:
    """llama.cpp's ``match_string``: text code point by code point with token id 0, token
    ids with the piece ``<[N]>``; True when the grammar may end after all of them."""
    m = GrammarMatcher(grammar, TINY)
    for p in pieces:
        items = [(f"<[{p}]>".encode(), p)] if isinstance(p, int) else [(c.encode(), 0) for c in p]
        for piece, tok in items:
            if not m.accept_piece(piece, tok):
                return False
    return m.can_end


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_llama_cpp_integration_cases(case):
    for s in case["pass"]:
        assert matches(case["grammar"], s), s
    for s in case["fail"]:
        assert not matches(case["grammar"], s), s


def test_integration_case_count():
    assert len(CASES) == 14
    assert sum(len(c["pass"]) + len(c["fail"]) for c in CASES) == 139


def test_json_grammar_strings():
    g = (FIX / "gbnf/json.gbnf").read_text()
    assert matches(g, ['{"a": [1, 2.5e3, true, null, "x\\u00e9"], "b": {}}'])
    assert matches(g, ['{"é": "日本"}'])
    assert not matches(g, ['{"a": 01}'])
    assert not matches(g, ["[1, 2]"])  # json.gbnf's root is an object


def test_partial_utf8_pieces():
    m = GrammarMatcher('root ::= "é" "x"', TINY)
    assert m.accept_piece(b"\xc3", 0) and m.n_remain == 1
    bad = m.clone()  # as llama.cpp: an invalid continuation leaves the stacks, marks it invalid
    assert bad.accept_piece(b"a", 0) and bad.n_remain == -1 and not bad.can_end
    assert m.accept_piece(b"\xa9x", 0) and m.can_end


def _vocab(pieces, eog=()):
    return GrammarVocab([p.encode() if isinstance(p, str) else p for p in pieces], eog)


def test_mask_small_vocab():
    v = _vocab(
        ["{", "}", '"', "a", "ab", '{"', "\xe9", b"\xc3", b"\xff", "", "</s>", " "], eog=[10]
    )
    m = GrammarMatcher('root ::= "{" "\\"" [a-z\\u00e9]* "\\"" "}"', v)
    assert m.mask().nonzero()[0].tolist() == [0, 5]
    m.accept(5)
    assert m.mask().nonzero()[0].tolist() == [2, 3, 4, 6, 7]
    m.accept(7)  # half of é
    assert m.n_remain == 1
    assert m.mask().nonzero()[0].tolist() == []  # no piece continues \xc3 here
    m.reset()
    for t in (0, 2, 3, 2, 1):
        assert m.allows(t)
        m.accept(t)
    assert m.mask().nonzero()[0].tolist() == [10] and m.can_end
    with pytest.raises(GrammarError, match="does not allow token 3"):
        m.accept(3)


@pytest.fixture(scope="module")
def smollm_tokenizer(smollm2_path):
    from llamacpy.tokenizer import Tokenizer

    return Tokenizer.from_gguf(smollm2_path)


def _brute(m: GrammarMatcher) -> np.ndarray:
    """Token by token (the path ``allows`` takes), not through the trie."""
    v = m.vocab
    out = np.zeros(v.n_vocab, np.bool_)
    m._call(K.allowed_all, m.state, m.value, m.n_remain, v.data, v.off, v.excluded, out)
    out[v.is_eog] = m.can_end
    for t in np.flatnonzero(v.is_eog | v.excluded)[:50]:
        assert out[t] == m.allows(t)
    for t in range(0, v.n_vocab, 997):
        assert out[t] == m.allows(t)
    return out


@pytest.mark.parametrize("grammar", ["json.gbnf", "list.gbnf", "arithmetic.gbnf", "chess.gbnf"])
def test_mask_equals_token_checks_on_a_real_vocab(grammar, smollm_tokenizer):
    v = GrammarVocab.from_tokenizer(smollm_tokenizer)
    m = GrammarMatcher((FIX / "gbnf" / grammar).read_text(), v)
    rng = np.random.default_rng(0)
    for _ in range(12):
        mask = m.mask()
        assert (mask == _brute(m)).all()
        allowed = np.flatnonzero(mask)
        if len(allowed) == 0:
            break
        m.accept(int(rng.choice(allowed)))


def test_mask_inside_a_partial_character_allows_continuation_bytes():
    """Byte-level vocabularies spell a character as several tokens: after its first byte
    the mask must allow the next byte (a token that is not UTF-8 on its own), exactly as
    the one-token check does."""
    pieces = [bytes([b]) for b in range(256)] + [b"\xe2\x96", b"ab", b"</s>"]
    v = GrammarVocab(pieces, eog=[len(pieces) - 1])
    m = GrammarMatcher('root ::= "x\u2581y"', v)  # U+2581 is E2 96 81
    m.accept(ord("x"))
    for first in (0xE2, 256):  # one byte, or two bytes in one token
        g = m.clone()
        g.accept(first)
        mask = g.mask()
        assert list(np.flatnonzero(mask)) == [t for t in range(len(pieces)) if g.allows(t)]
        nxt = 0x96 if first == 0xE2 else 0x81
        assert mask[nxt]
        g.accept(nxt)
        if first == 0xE2:
            g.accept(0x81)
        assert list(np.flatnonzero(g.mask())) == [ord("y")]


_NO_COMPILE = """
import numpy as np
from numba.core import event
from llamacpy.grammar.matcher import GrammarMatcher, GrammarVocab

compiled = []
class Listener(event.Listener):
    def on_start(self, ev):
        compiled.append(str(ev.data["dispatcher"].py_func.__qualname__))
    def on_end(self, ev):
        pass
event.register("numba:compile", Listener())
m = GrammarMatcher('root ::= "{" [a-z]+ "}"', GrammarVocab([b"{", b"ab", b"}", b"x1"], [3]))
out = np.zeros(4, np.bool_)
for t in (0, 1, 2):
    m.mask(out)
    assert out[t] and m.allows(t)
    m.accept(t)
m.clone().reset()
print("compiled:", m.can_end, compiled)
"""


def test_a_grammar_compiles_nothing_once_cached():
    """Every kernel a grammar uses is cached on disk: a later process compiles none (numba
    compiles its typed containers' Python-side helpers in each process: ~3 s of every
    run with a grammar, before the store was built in a cached kernel)."""
    import subprocess
    import sys

    for _ in range(2):  # the first may fill the cache
        proc = subprocess.run([sys.executable, "-c", _NO_COMPILE], capture_output=True,
                              text=True, check=True)  # fmt: skip
    assert proc.stdout.strip().splitlines()[-1] == "compiled: True []", proc.stdout
