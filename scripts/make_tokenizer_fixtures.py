"""Generate tokenizer fixtures from llama.cpp itself (dev-only; tests never need llama.cpp).

Run with a Python that has llama-cpp-python (the oracle), e.g.::

    /root/oracle/py scripts/make_tokenizer_fixtures.py \\
        --smollm2 ~/.cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --gemma3 ~/.cache/llamacpy/models/gemma-3-270m-q4_k_m.gguf \\
        --vocab-dir ~/.cache/llamacpy/testdata/llama.cpp-0.3.36/models

    # every tokenizer.ggml.pre name (vocabularies from scripts/make_pre_vocabs.py):
    /root/oracle/py scripts/make_tokenizer_fixtures.py --pre-dir /tmp/pre-vocabs

Writes ``tests/fixtures/tokenizer/*.json.gz``: for each vocabulary, its properties as
llama.cpp loads them (special ids, flags, end-of-generation set, hashes of every token's
attribute and piece) and ``llama_tokenize`` / ``llama_detokenize`` results on the texts of
``scripts/tokenizer_corpus.py`` (plus each ``ggml-vocab`` file's own ``.inp`` texts).
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import hashlib
import json
import sys
from pathlib import Path

import llama_cpp as L

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tokenizer_corpus as corpus

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/tokenizer"
SEP = b"\n__ggml_vocab_test__\n"


@L.llama_log_callback
def _quiet(level, text, user_data):  # pragma: no cover - callback
    pass


def enc_text(data: bytes) -> dict:
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": data.hex()}


class Oracle:
    def __init__(self, path: Path) -> None:
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(data) + 16
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 16 * len(ids)
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = L.llama_detokenize(
                self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special
            )
            if n >= 0:
                return buf.raw[:n]
            cap = -n + 1

    def piece(self, tid: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(512)
        n = L.llama_token_to_piece(self.vocab, tid, buf, 512, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, tid, buf, -n, 0, special)
        return buf.raw[:n]

    def props(self) -> dict:
        v = self.vocab
        attrs = [L.llama_vocab_get_attr(v, i) for i in range(self.n)]
        h_attr = hashlib.sha256(",".join(map(str, attrs)).encode()).hexdigest()
        h_sp = hashlib.sha256()
        h_ns = hashlib.sha256()
        for i in range(self.n):
            for h, special in ((h_sp, True), (h_ns, False)):
                p = self.piece(i, special)
                h.update(len(p).to_bytes(4, "little") + p)
        ids = {
            name: getattr(L, f"llama_vocab_{name}")(v)
            for name in ("bos", "eos", "eot", "sep", "nl", "pad", "mask")
        }
        for name in ("pre", "suf", "mid", "pad", "rep", "sep"):
            ids[f"fim_{name}"] = getattr(L, f"llama_vocab_fim_{name}")(v)
        return {
            "n_tokens": self.n,
            "type": L.llama_vocab_type(v),
            "ids": ids,
            "add_bos": bool(L.llama_vocab_get_add_bos(v)),
            "add_eos": bool(L.llama_vocab_get_add_eos(v)),
            "add_sep": bool(L.llama_vocab_get_add_sep(v)),
            "eog": [i for i in range(self.n) if L.llama_vocab_is_eog(v, i)],
            "attrs_sha256": h_attr,
            "pieces_sha256": h_sp.hexdigest(),
            "pieces_nospecial_sha256": h_ns.hexdigest(),
            "special_attr_ids": [i for i, a in enumerate(attrs) if a & (8 | 16 | 1)][:20000],
        }

    def case(self, data: bytes, add_special: bool, parse_special: bool) -> dict:
        ids = self.tokenize(data, add_special, parse_special)
        return {
            **enc_text(data),
            "add_special": add_special,
            "parse_special": parse_special,
            "ids": ids,
            "detok": enc_text(self.detokenize(ids, False, False)),
            "detok_special": enc_text(self.detokenize(ids, False, True)),
            "detok_remove": enc_text(self.detokenize(ids, True, False)),
        }


def golden_inputs(vocab_dir: Path) -> list[bytes]:
    seen: dict[bytes, None] = {}
    for inp in sorted(vocab_dir.glob("ggml-vocab-*.gguf.inp")):
        raw = inp.read_bytes()
        parts = raw.split(SEP)
        if raw.endswith(SEP):
            parts.pop()
        for p in parts:
            seen.setdefault(p, None)
    return list(seen)


def real_model_cases(o: Oracle, vocab_dir: Path) -> list[dict]:
    texts = [t.encode() for t in corpus.CORPUS]
    texts += [t.encode() for t in corpus.fuzz_strings(250)]
    texts += golden_inputs(vocab_dir)
    texts += corpus.INVALID_UTF8
    texts += [t.encode() for t in corpus.long_texts()]
    special = [t.encode() for t in corpus.SPECIAL_LIKE]
    cases = []
    seen: set[tuple] = set()
    for data in texts:
        for a, p in ((True, True), (False, False)):
            if (data, a, p) not in seen:
                seen.add((data, a, p))
                cases.append(o.case(data, a, p))
    for data in special:
        for a in (True, False):
            for p in (True, False):
                if (data, a, p) not in seen:
                    seen.add((data, a, p))
                    cases.append(o.case(data, a, p))
    return cases


def write(name: str, payload: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json.gz"
    raw = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(raw)
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(payload.get('cases', []))} cases)")


def pre_names(pre_dir: Path) -> None:
    """Every ``tokenizer.ggml.pre`` name on one BPE vocabulary (files from make_pre_vocabs.py)."""
    short = [t for t in corpus.CORPUS if len(t) <= 120]
    texts = [t.encode() for t in short + corpus.SPECIAL_LIKE + corpus.fuzz_strings(40, 7)]
    texts = list(dict.fromkeys(texts))
    out: dict = {"texts": [enc_text(t) for t in texts], "names": {}, "results": []}
    seen: dict[str, int] = {}
    for gguf in sorted(pre_dir.glob("*.gguf")):
        o = Oracle(gguf)
        ids = [o.tokenize(t, True, True) for t in texts]
        # detokenized text, None where it equals the input
        detok = [
            None if (d := o.detokenize(i, False, False)) == t else enc_text(d)
            for i, t in zip(ids, texts, strict=True)
        ]
        key = json.dumps([ids, detok])
        if key not in seen:  # names of one pre-tokenizer type give the same results
            seen[key] = len(out["results"])
            out["results"].append({"ids": ids, "detok": detok})
        out["names"][gguf.stem] = seen[key]
        print(gguf.stem, file=sys.stderr)
    write("pre_names", out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path)
    ap.add_argument("--gemma3", type=Path)
    ap.add_argument("--vocab-dir", type=Path)
    ap.add_argument("--pre-dir", type=Path, help="only: tokenize with every pre name")
    args = ap.parse_args()
    L.llama_log_set(_quiet, None)
    L.llama_backend_init()
    if args.pre_dir:
        pre_names(args.pre_dir)
        return 0
    for name, path in (("smollm2", args.smollm2), ("gemma3", args.gemma3)):
        o = Oracle(path)
        write(
            f"real_{name}",
            {"model": name, "props": o.props(), "cases": real_model_cases(o, args.vocab_dir)},
        )
    generic = [t.encode() for t in corpus.CORPUS] + [t.encode() for t in corpus.SPECIAL_LIKE]
    vocabs = {}
    for gguf in sorted(args.vocab_dir.glob("ggml-vocab-*.gguf")):
        o = Oracle(gguf)
        inp = gguf.with_name(gguf.name + ".inp")
        texts = golden_inputs(gguf.parent) if not inp.exists() else []
        if inp.exists():
            raw = inp.read_bytes()
            texts = raw.split(SEP)
            if raw.endswith(SEP):
                texts.pop()
        cases = [o.case(t, False, False) for t in dict.fromkeys(texts)]
        cases += [o.case(t, True, True) for t in dict.fromkeys(generic + texts)]
        vocabs[gguf.name] = {"props": o.props(), "cases": cases}
        print(gguf.name, len(cases))
    write("vocabs", {"vocabs": vocabs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
