"""Unigram (``tokenizer.ggml.model = t5``), as llama.cpp's llm_tokenizer_ugm.

The text is normalized with SentencePiece's precompiled character map (a XOR-compressed
double array of replacement rules), spaces become ``▁``, and the best segmentation under
the token log-probabilities is found with a Viterbi pass; characters no token covers
become [UNK] (consecutive ones merged).
"""

from __future__ import annotations

import numpy as np

from . import _ugm_kernels as K
from .errors import TokenizerError
from .vocab import ATTR_NORMAL, ATTR_UNUSED, ATTR_USER_DEFINED, Vocab

_UNKNOWN_PENALTY = np.float32(10.0)


class UGMModel:
    def __init__(self, vocab: Vocab, token_bytes: list[bytes]) -> None:
        self.vocab = vocab
        attrs = vocab.attrs
        normal = (attrs & ATTR_NORMAL) != 0
        user = (attrs & ATTR_USER_DEFINED) != 0
        unused = (attrs & ATTR_UNUSED) != 0
        scores = vocab.scores
        min_score = np.float32(scores[normal].min()) if normal.any() else np.float32(3.4e38)
        # float arithmetic, as llama.cpp computes it
        self.unknown_score = float(np.float32(min_score - _UNKNOWN_PENALTY))
        lens = np.fromiter(map(len, token_bytes), dtype=np.int64, count=len(token_bytes))
        offsets = np.zeros(len(token_bytes) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        buf = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)
        self.tk, self.tv, self.node_val = K.build_trie(buf, offsets, normal | user | unused)
        self.user_tk, self.user_tv, _ = K.build_trie(buf, offsets, user)
        # user-defined tokens score 0 (normal scores are log probabilities)
        self.token_score = np.where(user, 0.0, scores.astype(np.float64))
        cm = vocab.precompiled_charsmap
        if cm:
            blob = int.from_bytes(cm[:4], "little")
            self.xcda = np.frombuffer(cm[4 : 4 + blob], dtype="<u4").astype(np.int64)
            self.repl = np.frombuffer(cm[4 + blob :], dtype=np.uint8)
        else:
            self.xcda = np.zeros(0, dtype=np.int64)
            self.repl = np.zeros(0, dtype=np.uint8)
        self.unk = vocab.id("unk")

    def normalize(self, data: bytes) -> bytes:
        v = self.vocab
        out, err = K.normalize(
            np.frombuffer(data, dtype=np.uint8),
            self.user_tk,
            self.user_tv,
            self.xcda,
            self.repl,
            v.escape_whitespaces,
            not v.treat_whitespace_as_suffix and v.add_space_prefix,
            v.treat_whitespace_as_suffix and v.add_space_prefix,
            v.remove_extra_whitespaces,
        )
        if err:
            raise TokenizerError(_ERRORS[err])
        return out.tobytes()

    def encode(self, data: bytes, out: list[int], unk: int | None = None) -> None:
        norm = self.normalize(data)
        if not norm:
            return
        ids = K.viterbi(
            np.frombuffer(norm, dtype=np.uint8),
            self.tk,
            self.tv,
            self.node_val,
            self.token_score,
            self.unknown_score,
            self.unk if unk is None else unk,
        )
        out.extend(ids.tolist())


_ERRORS = {
    K.ERR_XCDA: "index out of array bounds in XCDA array (precompiled charsmap)",
    K.ERR_REPL: "index out of array bounds in precompiled charsmap",
    K.ERR_UNTERMINATED: "unterminated string in precompiled charsmap",
}
