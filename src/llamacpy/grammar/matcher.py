"""Which tokens a grammar allows next, over a tokenizer's vocabulary (llama.cpp's grammar
sampler: ``llama_grammar_apply_impl`` / ``llama_grammar_accept_impl``).

A token is allowed when llama.cpp's grammar would keep it: an end-of-generation token only
where the grammar may end, a token with an empty piece never, any other when some parse
stack accepts its piece code point by code point (a trailing incomplete UTF-8 sequence
must be completable). :class:`GrammarVocab` holds the vocabulary's pieces and trie (built
once per tokenizer); :class:`GrammarMatcher` holds one generation's grammar state.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import kernels as K
from .parser import Grammar, GrammarError, parse_grammar
from .trie import PSEUDO, build_trie, decode_all, mask_walk

_VOCABS: weakref.WeakKeyDictionary[Any, GrammarVocab] = weakref.WeakKeyDictionary()


class GrammarVocab:
    """Token pieces (``token_to_piece(special=True)``, as llama.cpp's piece cache), the
    end-of-generation tokens and the code-point trie of the rest."""

    def __init__(self, pieces: Sequence[bytes], eog: Iterable[int] = ()) -> None:
        self.n_vocab = len(pieces)
        cut = [p.split(b"\0", 1)[0] for p in pieces]  # a C string ends at NUL
        self.off = np.zeros(self.n_vocab + 1, np.int64)
        np.cumsum([len(p) for p in cut], out=self.off[1:])
        self.data = np.frombuffer(b"".join(cut) + b"\0", np.uint8)
        self.is_eog = np.zeros(self.n_vocab, np.bool_)
        self.is_eog[[t for t in eog if 0 <= t < self.n_vocab]] = True
        self._build_trie()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> GrammarVocab:
        """The tokenizer's grammar vocabulary (built on first use, then shared)."""
        v = _VOCABS.get(tokenizer)
        if v is None:
            pieces = [tokenizer.token_to_piece(t, special=True) for t in range(tokenizer.n_vocab)]
            v = cls(pieces, tokenizer.eog)
            _VOCABS[tokenizer] = v
        return v

    def _build_trie(self) -> None:
        cps, cp_off, pval, prem = decode_all(self.data, self.off)
        empty = self.off[1:] == self.off[:-1]
        # never allowed: empty pieces, invalid UTF-8; EOG tokens are decided apart
        self.excluded = empty | (prem < 0) | self.is_eog
        # inside a partial UTF-8 sequence a token that is not valid UTF-8 on its own (a
        # lone continuation byte) may complete it: only empty and EOG tokens are excluded
        self.excluded_partial = empty | self.is_eog
        keys: list[tuple[int, ...]] = []
        ids = np.flatnonzero(~self.excluded)
        cpl = cps.tolist()
        for t in ids.tolist():
            k = cpl[cp_off[t] : cp_off[t + 1]]
            if prem[t] > 0:
                k.append(int(PSEUDO) + (int(prem[t]) << 32) + int(pval[t]))
            keys.append(tuple(k))
        order = sorted(range(len(ids)), key=keys.__getitem__)
        self.sorted_ids = ids[order].astype(np.int64)
        flat = [c for i in order for c in keys[i]]
        key_off = np.zeros(len(order) + 1, np.int64)
        np.cumsum([len(keys[i]) for i in order], out=key_off[1:])
        self.trie = build_trie(np.array(flat, np.int64), key_off)
        self.where = np.full(self.n_vocab, -1, np.int64)
        self.where[self.sorted_ids] = np.arange(len(self.sorted_ids))


class GrammarMatcher:
    """One grammar's state while tokens are generated.

    ``allows(token)`` checks one token (the common sampler's fast path), ``mask()`` gives
    the allowed tokens of the whole vocabulary, ``accept(token)`` advances. ``reset()``
    returns to the start; ``clone()`` copies the state (the compiled store is shared).
    """

    def __init__(self, grammar: Grammar | str, vocab: GrammarVocab) -> None:
        if isinstance(grammar, str):
            grammar = parse_grammar(grammar)
        self.grammar, self.vocab = grammar, vocab
        starts, et, ev = [], [], []
        for rule in grammar.rules:
            starts.append(len(et))
            et.extend(t for t, _ in rule)
            ev.extend(v for _, v in rule)
        start = len(et)  # a reference to the start rule: the stacks begin by expanding it
        et += [K.RULE_REF, K.END]
        ev += [grammar.root, 0]
        self._g = (np.array(et, np.int64), np.array(ev, np.int64), np.array(starts, np.int64))
        self._store = K.new_store()
        self._buf = np.empty(len(vocab.data) + 1, np.int64)
        self.start = self._call(K.initial_state, start)
        self.reset()

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*self._g, *self._store, *args)
        except ValueError as e:  # the kernels' limits
            raise GrammarError(str(e)) from None

    def reset(self) -> None:
        self.state, self.value, self.n_remain = self.start, 0, 0

    def clone(self) -> GrammarMatcher:
        out = object.__new__(GrammarMatcher)
        out.__dict__.update(self.__dict__)
        return out

    @property
    def can_end(self) -> bool:
        """The grammar may end here (an end-of-generation token is allowed)."""
        return bool(K.state_flags(self._store[0], self.state) & K.F_EMPTY)

    def _check(self, token: int) -> None:
        if not 0 <= token < self.vocab.n_vocab:
            raise GrammarError(
                f"token {token} is outside the vocabulary (0..{self.vocab.n_vocab - 1})"
            )

    def allows(self, token: int) -> bool:
        """Would the grammar keep ``token`` as the next token."""
        token = int(token)
        self._check(token)
        v = self.vocab
        if v.is_eog[token]:
            return self.can_end
        if v.off[token] == v.off[token + 1]:
            return False
        return bool(self._call(K.token_allowed, self.state, self.value, self.n_remain, v.data,
                               v.off[token], v.off[token + 1], token, self._buf))  # fmt: skip

    def mask(self, out: np.ndarray | None = None) -> np.ndarray:
        """A bool array over the vocabulary: True where the token is allowed."""
        v = self.vocab
        if out is None:
            out = np.zeros(v.n_vocab, np.bool_)
        else:
            out[:] = False
        if self.n_remain > 0:
            self._call(K.allowed_all, self.state, self.value, self.n_remain, v.data, v.off,
                       v.excluded_partial, out)  # fmt: skip
        else:
            self._call(mask_walk, self.state, v.trie, v.sorted_ids, v.where, out)
        if self.can_end:
            out[v.is_eog] = True
        return out

    def accept(self, token: int) -> None:
        """Advance past ``token``; GrammarError if the grammar does not allow it."""
        token = int(token)
        self._check(token)
        v = self.vocab
        if v.is_eog[token]:
            if not self.can_end:
                raise GrammarError("end of generation where the grammar cannot end")
            return
        state, value, n_remain = self._call(K.accept_token, self.state, self.value,
                                            self.n_remain, v.data, v.off[token],
                                            v.off[token + 1], token, self._buf)  # fmt: skip
        if state == 0:
            piece = bytes(v.data[v.off[token] : v.off[token + 1]])
            raise GrammarError(f"the grammar does not allow token {token} ({piece!r}) here")
        self.state, self.value, self.n_remain = state, value, n_remain

    def accept_piece(self, piece: bytes, token: int = 0) -> bool:
        """``llama_grammar_accept_token(token, piece)`` for a piece that need not be the
        token's own (llama.cpp's grammar tests feed text this way, with token id 0); False
        (state unchanged) when no stack survives."""
        data = np.frombuffer(bytes(piece) + b"\0", np.uint8)
        state, value, n_remain = self._call(K.accept_token, self.state, self.value,
                                            self.n_remain, data, 0, len(data) - 1, int(token),
                                            np.empty(len(data), np.int64))  # fmt: skip
        if state == 0:
            return False
        self.state, self.value, self.n_remain = state, value, n_remain
        return True
