"""Special tokens, add-BOS/EOS flags, merges and chat template of a Hugging Face tokenizer.

The same rules as gguf-py's ``SpecialVocab`` (which llama.cpp's converter uses), read from
``tokenizer.json`` (merges, normalizer, post-processor, added tokens),
``tokenizer_config.json`` (special token texts, ``add_*_token``, chat template),
``chat_template.jinja``/``chat_template.json`` and ``config.json`` (``*_token_id``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .common import ConvertError, read_json_if_exists
from .kv import KV, T

log = logging.getLogger("llamacpy.convert")

DEFAULT_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
# special token types that have a tokenizer.ggml.*_token_id key (others are skipped)
ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}
ADD_KEYS = {
    "bos": "tokenizer.ggml.add_bos_token",
    "eos": "tokenizer.ggml.add_eos_token",
    "sep": "tokenizer.ggml.add_sep_token",
}


def _space_escaped(part: str) -> str:
    return "".join(chr(ord(c) + 256) if c == " " else c for c in part)


def _special_id(item: dict[str, Any]) -> Any:
    return item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None


class SpecialVocab:
    def __init__(
        self,
        directory: Path,
        *,
        load_merges: bool = False,
        types: tuple[str, ...] | list[str] | None = None,
        n_vocab: int | None = None,
        tokenizer_json: Any = None,
    ) -> None:
        """``tokenizer_json``: the parsed tokenizer.json when the caller already has it."""
        self.dir = directory
        self._tj = tokenizer_json
        self.load_merges = load_merges
        self.types = tuple(types) if types is not None else DEFAULT_TYPES
        self.n_vocab = n_vocab
        self.merges: list[str] = []
        self.ids: dict[str, int] = {}
        self.add: dict[str, bool] = {}
        self.chat_template: Any = None
        self.lowercase: bool | None = None
        self.strip_accents: bool | None = None
        self._load_tokenizer_json()
        self._load_config_json()
        if self.load_merges and not self.merges:
            self._load_merges_txt()

    # ------------------------------------------------------------------ setting ids
    def set(self, typ: str, tid: Any) -> None:
        """Set a special token id unless already set (ids out of the vocabulary are skipped)."""
        if not isinstance(tid, int) or isinstance(tid, bool):
            return
        if tid < 0:
            raise ConvertError(f"invalid id {tid} for special token type {typ!r}")
        if self.n_vocab is None or tid < self.n_vocab:
            self.ids.setdefault(typ, tid)
        else:
            log.warning("special token %s id %d out of range (vocab %d): skipped", typ, tid,
                        self.n_vocab)  # fmt: skip

    # ------------------------------------------------------------------ sources
    def _load_merges_txt(self) -> None:
        path = self.dir / "merges.txt"
        if not path.is_file():
            return
        merges = []
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if lines and lines[0].strip().startswith("#"):
            lines = lines[1:]
        for line in lines:
            parts = line.strip().split(None, 3)
            if not parts:
                continue
            if len(parts) != 2:
                log.warning("merges.txt: malformed entry %r ignored", line)
                continue
            merges.append(f"{parts[0]} {parts[1]}")
        self.merges = merges

    def _parse_normalizer(self, norm: dict[str, Any]) -> None:
        kind = norm.get("type")
        if kind == "Lowercase":
            self.lowercase = True
        elif kind == "StripAccents":
            self.strip_accents = True
        elif kind == "BertNormalizer":
            if "lowercase" in norm:
                self.lowercase = norm["lowercase"]
            if "strip_accents" in norm:
                self.strip_accents = norm["strip_accents"]
        elif kind == "Sequence":
            for sub in norm.get("normalizers", []):
                if isinstance(sub, dict):
                    self._parse_normalizer(sub)

    def _read_merges(self, tok: dict[str, Any]) -> None:
        merges = (tok.get("model") or {}).get("merges")
        if not isinstance(merges, list) or not merges:
            return
        first = merges[0]
        if isinstance(first, str):
            self.merges = list(merges)
        elif isinstance(first, list) and len(first) == 2 and isinstance(first[0], str):
            # the pair format (transformers >= 4.45) allows spaces; encode them as U+0120
            self.merges = [" ".join(_space_escaped(p) for p in pair) for pair in merges]
        else:
            raise ConvertError(f"{self.dir / 'tokenizer.json'}: unknown format of model.merges")

    def _load_tokenizer_json(self) -> None:
        tok = self._tj if self._tj is not None else read_json_if_exists(self.dir / "tokenizer.json")
        added: list[dict[str, Any]] = []
        if isinstance(tok, dict):
            if self.load_merges:
                self._read_merges(tok)
            if isinstance(tok.get("normalizer"), dict):
                self._parse_normalizer(tok["normalizer"])
            added = [a for a in tok.get("added_tokens") or [] if isinstance(a, dict)]
        tc = read_json_if_exists(self.dir / "tokenizer_config.json")
        tc = tc if isinstance(tc, dict) else None
        if tok:
            self._post_processor(tok, tc)
        if not tc:
            return
        self._chat_template(tc)
        for typ in self.types:
            add = tc.get(f"add_{typ}_token")
            if isinstance(add, bool):
                if typ not in self.add:
                    self.add[typ] = add
                elif self.add[typ] != add:
                    log.warning("tokenizer_config add_%s_token=%s differs from the "
                                "post-processor; keeping %s", typ, add, self.add[typ])  # fmt: skip
            entry = tc.get(f"{typ}_token")
            if isinstance(entry, dict):
                entry = entry.get("content")
            if not isinstance(entry, str):
                continue
            tid = next((a.get("id") for a in added if a.get("content") == entry), None)
            self.set(typ, tid)

    def _post_processor(self, tok: dict[str, Any], tc: dict[str, Any] | None) -> None:
        """Which special tokens the tokenizer adds (may also fill in tc's special texts)."""
        cfg = tc or {}
        bos, cls = cfg.get("bos_token"), cfg.get("cls_token")
        eos, sep = cfg.get("eos_token"), cfg.get("sep_token")
        if not bos and cls and tc:
            tc["bos_token"] = bos = cls
        if not eos and sep and tc:
            tc["eos_token"] = eos = sep
        post = tok.get("post_processor")
        if not isinstance(post, dict):
            return
        for proc in post.get("processors", [post]):
            kind = proc.get("type") if isinstance(proc, dict) else None
            if kind == "ByteLevel":
                self.add.setdefault("bos", False)
                self.add.setdefault("eos", False)
            elif kind == "RobertaProcessing":
                self.add.update(bos=True, eos=True, sep=True)
                if not cls and tc:
                    tc["cls_token"] = cls = proc.get("cls", [bos])[0]
                if not sep and tc:
                    tc["sep_token"] = sep = proc.get("sep", [eos])[0]
            elif kind == "TemplateProcessing":
                bos, cls, eos, sep = self._template(proc, tc, bos, cls, eos, sep)

    def _template(self, proc: dict, tc: dict | None, bos, cls, eos, sep) -> tuple:
        single, pair = proc.get("single", []), proc.get("pair", [])
        first = last = None
        if len(single) > 1:
            if first := _special_id(single[0]):
                if not tc:
                    bos = first
                elif first not in (bos, cls):
                    if not bos:
                        tc["bos_token"] = bos = first
                    if not cls:
                        tc["cls_token"] = cls = first
                self.add["bos"] = first in (bos, cls)
            if last := _special_id(single[-1]):
                if not tc:
                    eos = last
                elif last != eos:
                    if "eot" not in self.types:
                        self.types = (*self.types, "eot")
                        tc["eot_token"] = eos
                    elif "eom" not in self.types:
                        self.types = (*self.types, "eom")
                        tc["eom_token"] = eos
                    tc["eos_token"] = eos = last
                self.add["eos"] = last == eos
        if pair:
            start = 1 if first and _special_id(pair[0]) == first else 0
            stop = -1 if last and _special_id(pair[-1]) == last else None
            mid = pair[slice(start, stop)]
            if mid:
                a = mid[0].get("Sequence", {}).get("id") if isinstance(mid[0], dict) else None
                b = mid[-1].get("Sequence", {}).get("id") if isinstance(mid[-1], dict) else None
                if a == "A" and b == "B" and (mid := mid[1:-1]):
                    add_sep = False
                    entry = _special_id(mid[0])
                    if entry and entry in (sep, eos) and not last:
                        add_sep = True
                    if len(mid) == 2 and (entry := _special_id(mid[1])) and entry in (sep, eos):
                        add_sep = True
                    self.add["sep"] = add_sep
                    if add_sep and not sep and tc:
                        tc["sep_token"] = eos
        return bos, cls, eos, sep

    def _chat_template(self, tc: dict[str, Any]) -> None:
        alt: Any = None
        jinja, js = self.dir / "chat_template.jinja", self.dir / "chat_template.json"
        if jinja.is_file():
            alt = jinja.read_text(encoding="utf-8")
            extra = sorted((self.dir / "additional_chat_templates").glob("*.jinja"))
            if extra:
                alt = [{"name": "default", "template": alt}]
                alt += [{"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in extra]
        elif js.is_file():
            data = read_json_if_exists(js)
            alt = data.get("chat_template") if isinstance(data, dict) else None
        template = tc.get("chat_template", alt)
        if template is None or isinstance(template, str | list):
            self.chat_template = template
        else:
            log.warning("tokenizer_config.json: chat_template has a bad type; ignored")

    def _load_config_json(self) -> None:
        cfg = read_json_if_exists(self.dir / "config.json")
        if not isinstance(cfg, dict):
            return
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
        for typ in self.types:
            tid = cfg.get(f"{typ}_token_id")
            if tid is None:
                tid = text.get(f"{typ}_token_id")
            self.set(typ, tid)

    # ------------------------------------------------------------------ output
    def write(self, kv: KV) -> None:
        """Add the merges, ids, flags, chat template and normalizer flags to ``kv``."""
        if self.merges:
            kv.add("tokenizer.ggml.merges", self.merges, T.ARRAY, T.STRING)
        elif self.load_merges:
            log.warning("no merges found: the BPE tokenizer may not work")
        for typ, tid in self.ids.items():
            if typ in ID_KEYS:
                kv.add(ID_KEYS[typ], tid, T.UINT32)
        for typ, value in self.add.items():
            if typ in ADD_KEYS:
                kv.add(ADD_KEYS[typ], bool(value), T.BOOL)
        if self.chat_template is not None:
            kv.add_chat_template(self.chat_template)
        if self.lowercase is not None:
            kv.add("tokenizer.ggml.normalizer.lowercase", bool(self.lowercase), T.BOOL)
        if self.strip_accents is not None:
            kv.add("tokenizer.ggml.normalizer.strip_accents", bool(self.strip_accents), T.BOOL)
