"""A grammar that waits for a trigger before it constrains anything (llama.cpp's lazy
grammars, used for tool calls that may follow free text).

While it waits, every token is allowed and the text of the accepted tokens is kept. A
trigger is a word (found anywhere in that text), a pattern (a regular expression searched
for anywhere, or matched against the whole text when it is written ``^...$``; the grammar
starts at its first non-empty group, else at the match) or a token id. When one fires, the
grammar starts at the trigger: the kept text from there on is fed to it, token by token,
and from then on it constrains sampling as any grammar does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from .parser import GrammarError

MAX_TRIGGER_BUFFER = 1 << 20  # bytes of text kept while waiting (older text is dropped)


class LazyGrammar:
    """``matcher`` (a :class:`~llamacpy.grammar.GrammarMatcher`, at its start) behind
    triggers: ``words`` (text), ``patterns`` (regular expressions) and ``tokens`` (ids)."""

    def __init__(
        self,
        matcher: Any,
        *,
        words: Iterable[str] = (),
        patterns: Iterable[str] = (),
        tokens: Iterable[int] = (),
    ) -> None:
        self.matcher = matcher
        regs = [re.escape(w) for w in words if w] + [p for p in patterns if p]
        try:
            self._patterns = [re.compile(p, re.DOTALL) for p in regs]
        except re.error as e:
            raise GrammarError(f"invalid grammar trigger pattern: {e}") from None
        self._full = [p.startswith("^") and p.endswith("$") for p in regs]
        self._tokens = frozenset(int(t) for t in tokens)
        if not self._patterns and not self._tokens:
            raise GrammarError("a lazy grammar needs at least one trigger")
        self.reset()

    # ------------------------------------------------------------------ matcher interface
    @property
    def triggered(self) -> bool:
        return not self.awaiting

    @property
    def can_end(self) -> bool:
        return True if self.awaiting else self.matcher.can_end

    @property
    def vocab(self) -> Any:
        return self.matcher.vocab

    def allows(self, token: int) -> bool:
        return True if self.awaiting else self.matcher.allows(token)

    def mask(self, out: np.ndarray | None = None) -> np.ndarray:
        if not self.awaiting:
            return self.matcher.mask(out)
        n = self.matcher.vocab.n_vocab
        if out is None:
            return np.ones(n, np.bool_)
        out[:] = True
        return out

    def accept(self, token: int) -> None:
        token = int(token)
        if not self.awaiting:
            self.matcher.accept(token)
            return
        v = self.matcher.vocab
        if token in self._tokens:
            self.awaiting = False
            self._text, self._spans = b"", []
            self.matcher.accept(token)
            return
        if v.is_eog[token]:
            return
        piece = bytes(v.data[v.off[token] : v.off[token + 1]])
        start = len(self._text)
        self._text += piece
        self._spans.append((token, start, len(self._text)))
        if len(self._text) > MAX_TRIGGER_BUFFER:
            self._drop_old()
        at = self._find()
        if at is None:
            return
        self.awaiting = False
        for tok, s, e in self._spans:  # replay what overlaps the trigger and follows it
            if e <= at:
                continue
            if s >= at:
                self.matcher.accept(tok)
            elif not self.matcher.accept_piece(self._text[at:e], tok):
                raise GrammarError("the grammar does not allow its own trigger text")
        self._text, self._spans = b"", []

    def reset(self) -> None:
        self.matcher.reset()
        self.awaiting = True
        self._text = b""
        self._spans: list[tuple[int, int, int]] = []

    def clone(self) -> LazyGrammar:
        out = object.__new__(LazyGrammar)
        out.__dict__.update(self.__dict__)
        out.matcher = self.matcher.clone()
        out._spans = list(self._spans)
        return out

    # ------------------------------------------------------------------ triggers
    def _find(self) -> int | None:
        """Byte offset where the grammar starts, or None (no trigger in the text yet)."""
        text = self._text.decode("utf-8", "surrogateescape")
        for pat, full in zip(self._patterns, self._full):
            m = pat.fullmatch(text) if full else pat.search(text)
            if m is None:
                continue
            at = next((m.start(i) for i in range(1, (m.lastindex or 0) + 1)
                       if m.start(i) >= 0 and m.end(i) > m.start(i)), m.start())  # fmt: skip
            return len(text[:at].encode("utf-8", "surrogateescape"))
        return None

    def _drop_old(self) -> None:
        """Forget the older half of the kept text (whole tokens)."""
        cut = len(self._text) - MAX_TRIGGER_BUFFER // 2
        keep = [(t, s, e) for t, s, e in self._spans if s >= cut]
        base = keep[0][1] if keep else len(self._text)
        self._text = self._text[base:]
        self._spans = [(t, s - base, e - base) for t, s, e in keep]
