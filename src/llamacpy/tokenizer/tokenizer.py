"""The tokenizer facade: ``Tokenizer.from_gguf(...)``, ``encode``, ``decode``.

``encode`` follows ``llama_vocab::impl::tokenize``: split at special tokens, run the
model-specific tokenizer on each text fragment, add BOS/EOS/SEP as the vocabulary asks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from . import unicode as uni
from .bpe import BPEModel
from .detok import Detokenizer, StreamDecoder
from .errors import TokenizerError
from .pretokenize import regex_split, split_offsets
from .special import SpecialTokens
from .spm import SPMModel
from .ugm import UGMModel
from .vocab import NULL, Vocab
from .wpm import WPMModel

_ESCAPED_SPACE = "\u2581".encode()


def _as_bytes(text: str | bytes | bytearray | memoryview) -> bytes:
    if isinstance(text, str):
        return uni.encode_utf8(text)
    if isinstance(text, bytes | bytearray | memoryview):
        return bytes(text)
    raise TypeError(f"text must be str or bytes, not {type(text).__name__}")


def _special_id(name: str) -> property:
    """A :class:`Tokenizer` property: the id of the vocabulary's ``name`` token."""
    return property(lambda tok: tok.vocab.id(name), doc=f"The {name} token's id (NULL: none).")


class Tokenizer:
    """Tokenizer built only from GGUF metadata, token-for-token identical to llama.cpp."""

    def __init__(self, vocab: Vocab, chat_templates: Mapping[str, str] | None = None) -> None:
        self.vocab = vocab
        #: chat templates stored in the model: "" for ``tokenizer.chat_template``, else the
        #: NAME of ``tokenizer.chat_template.NAME``
        self.chat_templates: dict[str, str] = dict(chat_templates or {})
        self._special = SpecialTokens(vocab)
        self._detok = Detokenizer(vocab)
        self._token_bytes: list[bytes] | None = None
        self._model: Any = None
        self._nl: int | None = None

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        prefix = "tokenizer.chat_template"
        templates = {
            k[len(prefix) + 1 :]: v
            for k, v in metadata.items()
            if (k == prefix or k.startswith(prefix + ".")) and isinstance(v, str)
        }
        return cls(Vocab.from_metadata(metadata), templates)

    @classmethod
    def from_gguf(cls, source: Any) -> Tokenizer:
        """From a :class:`~llamacpy.gguf.reader.GGUFReader`, a metadata mapping, or a path."""
        if isinstance(source, Mapping):
            return cls.from_metadata(source)
        if isinstance(source, str | os.PathLike):
            from ..gguf.reader import GGUFReader

            with GGUFReader(source) as reader:
                return cls.from_metadata(reader.metadata)
        md = getattr(source, "metadata", None)
        if isinstance(md, Mapping):
            return cls.from_metadata(md)
        raise TypeError(f"cannot build a tokenizer from {type(source).__name__}")

    def _bytes(self) -> list[bytes]:
        if self._token_bytes is None:
            self._token_bytes = [t.encode("utf-8", "surrogateescape") for t in self.vocab.tokens]
        return self._token_bytes

    @property
    def model(self) -> Any:
        """The model-specific engine (built on first use)."""
        if self._model is None:
            t = self.vocab.type
            if t == "spm":
                self._model = SPMModel(self.vocab, self._bytes())
            elif t == "bpe":
                self._model = BPEModel(self.vocab)
            elif t == "wpm":
                self._model = WPMModel(self.vocab, self._bytes())
            else:
                self._model = UGMModel(self.vocab, self._bytes())
        return self._model

    # --- properties ---------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_tokens

    bos, eos, eot, eom, sep, pad, unk = map(
        _special_id, ("bos", "eos", "eot", "eom", "sep", "pad", "unk")
    )

    @property
    def nl(self) -> int:
        """The newline token as llama.cpp determines it (``llama_vocab_nl``)."""
        if self._nl is None:
            self._nl = self._find_nl()
        return self._nl

    def _find_nl(self) -> int:
        v = self.vocab
        # llama.cpp determines it while loading, when only the model type's default special
        # ids are set and no special token is known yet
        pad = v.default_special.get("pad", NULL)
        if v.type == "spm":
            tid = int(self.model.byte_tokens[0x0A])
            return tid if tid >= 0 else pad
        if v.type == "wpm":
            return pad
        out: list[int] = []
        if v.type == "bpe":
            self._encode_bpe(b"\n", out)
        else:
            self.model.encode(b"\n", out, unk=v.default_special.get("unk", NULL))
        return out[0] if out else pad

    @property
    def eog(self) -> frozenset[int]:
        """Every id that ends generation (eos, eot, eom, ...)."""
        return self.vocab.eog_ids

    def is_eog(self, tid: int) -> bool:
        return tid != NULL and tid in self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def add_sep(self) -> bool:
        return self.vocab.add_sep

    def token_text(self, tid: int) -> str:
        self._detok._check(tid)
        return self.vocab.tokens[tid]

    def token_attr(self, tid: int) -> int:
        self._detok._check(tid)
        return int(self.vocab.attrs[tid])

    # --- encoding -----------------------------------------------------------------------

    def encode(
        self,
        text: str | bytes,
        add_special: bool = True,
        parse_special: bool = True,
    ) -> list[int]:
        """Token ids of ``text`` exactly as ``llama_tokenize`` returns them.

        ``str`` is encoded to UTF-8 (a lone surrogate as its 3-byte form); ``bytes`` are
        used as they are, invalid UTF-8 included.
        """
        data = _as_bytes(text)
        v = self.vocab
        segments = self._special.partition(data, parse_special)
        out: list[int] = []
        if v.type == "wpm":
            if add_special:
                out.append(self._need("bos"))
        elif add_special and v.add_bos:
            out.append(self._need("bos"))
        texts = [data[s:e] for s, e, tok in segments if tok < 0]
        if v.type == "spm":
            chunks = []
            prev_special = True
            for s, e, tok in segments:
                if tok >= 0:
                    prev_special = True
                    continue
                chunk = data[s:e]
                if v.add_space_prefix and prev_special:
                    chunk = b" " + chunk
                chunks.append(chunk.replace(b" ", _ESCAPED_SPACE))
                prev_special = False
            results = self.model.encode_many(chunks) if chunks else []
        elif v.type == "bpe":
            results = self._encode_bpe_many(texts)
        else:
            results = []
            for chunk in texts:
                ids: list[int] = []
                if v.type == "wpm":
                    self.model.encode(uni.decode_utf8(chunk), ids)
                else:
                    self.model.encode(chunk, ids)
                results.append(ids)
        it = iter(results)
        for _s, _e, tok in segments:
            if tok >= 0:
                out.append(tok)
            else:
                out.extend(next(it))
        if v.type == "wpm":
            if add_special:
                out.append(self._need("sep"))
        elif add_special and v.add_eos:
            out.append(self._need("eos"))
        return out

    def _need(self, name: str) -> int:
        tid = self.vocab.id(name)
        if tid == NULL:
            raise TokenizerError(f"the vocabulary needs a {name.upper()} token but has none")
        return tid

    def _encode_bpe_many(self, chunks: list[bytes]) -> list[list[int]]:
        """Each text fragment on its own (pre-tokenization never crosses fragments), with
        one splitter pass and one merge batch for all of them."""
        v = self.vocab
        if not chunks:
            return []
        if v.model in ("whitespace", "hybriddna"):
            results = []
            for chunk in chunks:
                ids: list[int] = []
                self._encode_bpe(chunk, ids)
                results.append(ids)
            return results
        assert v.pre is not None
        if v.escape_whitespaces:
            chunks = [c.replace(b" ", _ESCAPED_SPACE) for c in chunks]
        texts = [uni.decode_utf8(c) for c in chunks]
        whole = "".join(texts)
        if not whole:
            return [[] for _ in chunks]
        lens = [len(t) for t in texts]
        word_lens = split_offsets(whole, v.pre.regexes, lens)
        words = []
        pos = 0
        for n in word_lens:
            words.append(whole[pos : pos + n])
            pos += n
        cache = self.model.prepare(words)
        results = []
        wi = 0
        for n_cpts in lens:
            ids = []
            covered = 0
            while covered < n_cpts:
                w = words[wi]
                covered += len(w)
                wi += 1
                ids.extend(cache[w])
            results.append(ids)
        return results

    def _encode_bpe(self, chunk: bytes, out: list[int]) -> None:
        v = self.vocab
        if v.escape_whitespaces:
            chunk = chunk.replace(b" ", _ESCAPED_SPACE)
        text = uni.decode_utf8(chunk)
        if v.model == "whitespace":
            self._encode_whitespace(text, out)
            return
        if v.model == "hybriddna":
            self._encode_dna(chunk, out)
            return
        self._bpe_words(text, out)

    def _bpe_words(self, text: str, out: list[int]) -> None:
        if not text:
            return
        assert self.vocab.pre is not None
        self.model.encode_words(regex_split(text, self.vocab.pre.regexes), out)

    def _encode_whitespace(self, text: str, out: list[int]) -> None:
        """llama.cpp's whitespace tokenizer model: BPE on each whitespace-free segment."""
        flags = uni.cpt_flags()
        lower = uni.lowercase_table()
        seg: list[str] = []
        for ch in text:
            c = ord(ch)
            if int(flags[c]) & uni.WHITESPACE:
                self._bpe_words("".join(seg), out)
                seg.clear()
            else:
                seg.append(chr(int(lower[c])) if self.vocab.lowercase else ch)
        self._bpe_words("".join(seg), out)

    def _encode_dna(self, data: bytes, out: list[int]) -> None:
        """llama.cpp's hybriddna model: ``<dna>...</dna>`` spans as 6-mers, BPE elsewhere."""
        t2i = self.vocab.token_to_id
        begin, end_, oov = t2i.get("<dna>"), t2i.get("</dna>"), t2i.get("<oov>")
        if begin is None or end_ is None or oov is None:
            self._bpe_words(uni.decode_utf8(data), out)
            return
        pos = 0
        while pos < len(data):
            start = data.find(b"<dna>", pos)
            if start == -1:
                self._bpe_words(uni.decode_utf8(data[pos:]), out)
                break
            if start > pos:
                self._bpe_words(uni.decode_utf8(data[pos:start]), out)
            out.append(begin)
            cstart = start + 5
            stop = data.find(b"</dna>", cstart)
            seq = data[cstart : len(data) if stop == -1 else stop].upper()
            for i in range(0, len(seq), 6):
                kmer = seq[i : i + 6].ljust(6, b"A")
                key = (kmer + "\ue000".encode()).decode("utf-8", "surrogateescape")
                out.append(t2i.get(key, oov))
            if stop == -1:
                break
            out.append(end_)
            pos = stop + 6

    # --- decoding -----------------------------------------------------------------------

    def token_to_piece(self, tid: int, special: bool = True) -> bytes:
        """The bytes of one token (``llama_token_to_piece`` with lstrip 0)."""
        return self._detok.token_to_piece(tid, special)

    def decode_bytes(
        self, ids: Iterable[int], special: bool = False, remove_special: bool = False
    ) -> bytes:
        """``llama_detokenize(ids, remove_special, unparse_special=special)``."""
        return self._detok.detokenize(list(ids), remove_special, special)

    def decode(
        self,
        ids: Iterable[int],
        special: bool = False,
        remove_special: bool = False,
        errors: str = "replace",
    ) -> str:
        """Text of ``ids``; special/control tokens are rendered only with ``special=True``."""
        return self.decode_bytes(ids, special, remove_special).decode("utf-8", errors)

    def chat_template(self, name: str = "", limits: Any = None) -> Any:
        """The model's chat template as a :class:`~llamacpy.tokenizer.chat.ChatTemplate`."""
        from .chat import ChatTemplate

        return ChatTemplate.from_tokenizer(self, name, limits)

    def stream_decoder(self, special: bool = False, remove_special: bool = False) -> StreamDecoder:
        """A :class:`StreamDecoder` for incremental detokenization."""
        return StreamDecoder(self._detok, special, remove_special)
