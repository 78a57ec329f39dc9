"""``llamacpy.convert`` internals and error paths (no oracle, no torch needed).

The agreement with llama.cpp's converter is tested in test_convert_oracle.py; here: the
safetensors and SentencePiece readers, clear errors for bad input, atomic output, dry runs,
split planning, streaming (peak memory) and the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llamacpy.cli import main
from llamacpy.convert import ConvertError, ConvertOptions, convert
from llamacpy.convert.metadata import model_id_components
from llamacpy.convert.plan import naming_convention, size_label
from llamacpy.convert.safetensors import Checkpoint, SafetensorsFile
from llamacpy.convert.spm_model import SentencePieceModel, decode_fields
from llamacpy.gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "convert_checkpoints", ROOT / "scripts" / "convert_checkpoints.py"
)
cc = importlib.util.module_from_spec(_spec)
sys.modules["convert_checkpoints"] = cc
_spec.loader.exec_module(cc)

# a tiny Llama with a SentencePiece vocabulary (no llama.cpp test data needed)
WORDS = ["the", "a", "cat", "dog", "sat"]
N_VOCAB = 3 + 256 + len(WORDS)


def _spm_tokenizer(d: Path) -> None:
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{i:02X}>", 0.0, 6) for i in range(256)]
    pieces += [("\u2581" + w, -float(i), 1) for i, w in enumerate(WORDS)]
    (d / "tokenizer.model").write_bytes(cc.sentencepiece_model(pieces))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


def _bpe_tokenizer(d: Path) -> None:
    """A byte-level BPE vocabulary that is no known model's (its check-text hash is new)."""
    from llamacpy.tokenizer.unicode import bytes_to_unicode

    chars = list(bytes_to_unicode())
    vocab = {c: i for i, c in enumerate(chars)}
    added = [cc._added(256, "<|begin_of_text|>", True), cc._added(257, "<|end_of_text|>", True)]
    tj = {"added_tokens": added, "normalizer": None,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
          "post_processor": None, "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": vocab, "merges": []}}  # fmt: skip
    (d / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))


def tiny_llama(d: Path, *, hidden: int = 64, layers: int = 2, dtype: str = "F32",
               config: dict | None = None, tensors: dict | None = None) -> Path:  # fmt: skip
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": layers, "vocab_size": N_VOCAB,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 256}  # fmt: skip
    cfg.update(config or {})
    (d / "config.json").write_text(json.dumps(cfg))
    _spm_tokenizer(d)
    kv = hidden // 2
    shapes = {"model.embed_tokens.weight": [N_VOCAB, hidden], "model.norm.weight": [hidden],
              "lm_head.weight": [N_VOCAB, hidden]}  # fmt: skip
    for b in range(layers):
        p = f"model.layers.{b}."
        shapes.update({
            p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden],
            p + "self_attn.q_proj.weight": [hidden, hidden], p + "self_attn.k_proj.weight": [kv, hidden],
            p + "self_attn.v_proj.weight": [kv, hidden], p + "self_attn.o_proj.weight": [hidden, hidden],
            p + "mlp.gate_proj.weight": [2 * hidden, hidden], p + "mlp.up_proj.weight": [2 * hidden, hidden],
            p + "mlp.down_proj.weight": [hidden, 2 * hidden]})  # fmt: skip
    shapes.update(tensors or {})
    values = {n: (dtype, cc.tensor_values(n, s, 1, 1.0)) for n, s in shapes.items()}
    cc.write_safetensors(d / "model.safetensors", values)
    return d


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    return tiny_llama(tmp_path / "Tiny-Llama")


# ---------------------------------------------------------------------------- safetensors
def test_safetensors_reads_every_dtype(tmp_path: Path) -> None:
    x = np.array([[1.5, -2.25], [3.0, 1e-3]], dtype=np.float32)
    cc.write_safetensors(tmp_path / "a.safetensors",
                         {"f32": ("F32", x), "f16": ("F16", x), "bf16": ("BF16", x)})  # fmt: skip
    f = SafetensorsFile(tmp_path / "a.safetensors")
    assert f.metadata == {"format": "pt"}
    assert f.tensors["f32"].load().dtype == np.float32
    np.testing.assert_array_equal(f.tensors["f32"].load(), x)
    assert f.tensors["f16"].load().dtype == np.float16
    np.testing.assert_array_equal(f.tensors["f16"].load(), x.astype(np.float16))
    bf = f.tensors["bf16"].load()
    assert bf.dtype == np.float32  # widened exactly, as the reference converter does
    np.testing.assert_allclose(bf, x, rtol=1e-2)
    f.close()


def _raw_safetensors(path: Path, header: dict, data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "truncated"),
        (
            {"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            b"\0" * 8,
            "needs 12 bytes",
        ),
        ({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "unknown dtype"),
        ({"t": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, "quantized"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", "invalid shape"),
        ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4]}}, b"\0" * 8, "data_offsets"),
        ({"t": 7}, b"", "not an object"),
    ],
)
def test_safetensors_errors_name_file_and_tensor(tmp_path, header, data, message) -> None:
    path = _raw_safetensors(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(ConvertError, match=message) as e:
        SafetensorsFile(path)
    assert "bad.safetensors" in str(e.value)


def test_safetensors_truncated_header(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ConvertError, match="truncated or not a safetensors"):
        SafetensorsFile(tmp_path / "x.safetensors")
    (tmp_path / "y.safetensors").write_bytes(b"abc")
    with pytest.raises(ConvertError, match="shorter than 8 bytes"):
        SafetensorsFile(tmp_path / "y.safetensors")


def test_checkpoint_index_and_missing_files(tmp_path: Path) -> None:
    x = np.zeros(4, np.float32)
    cc.write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"b": ("F32", x)})
    cc.write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"a": ("F32", x)})
    index = {"weight_map": {"b": "model-00001-of-00002.safetensors",
                            "a": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with Checkpoint(tmp_path) as ck:  # file by file, then by name
        assert list(ck.tensors) == ["b", "a"]
    index["weight_map"]["c"] = "model-00002-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="missing tensors \\['c'\\]"):
        Checkpoint(tmp_path)
    index["weight_map"]["c"] = "model-00003-of-00003.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="missing model files.*00003"):
        Checkpoint(tmp_path)


def test_checkpoint_without_safetensors(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="no model weights"):
        Checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK")
    with pytest.raises(ConvertError, match="PyTorch pickles"):
        Checkpoint(tmp_path)


# ---------------------------------------------------------------------------- sentencepiece
def test_sentencepiece_model_round_trip() -> None:
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("\u2581a", -1.5, 1),
              ("<0x41>", 0.0, 6), ("x", -3.25, 4)]  # fmt: skip
    m = SentencePieceModel.parse(cc.sentencepiece_model(pieces))
    assert m.pieces == [p for p, _, _ in pieces]
    assert m.scores == [s for _, s, _ in pieces]
    assert m.types == [t for _, _, t in pieces]
    assert (m.model_type, m.byte_fallback, m.pad_id, m.add_dummy_prefix) == (2, True, -1, True)
    assert not m.remove_extra_whitespaces and m.normalizer_name == "identity"


def test_sentencepiece_matches_the_sentencepiece_library(tmp_path: Path) -> None:
    spm = pytest.importorskip("sentencepiece")
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{i:02X}>", 0.0, 6) for i in range(256)]
    pieces += [("\u2581" + w, -float(i), 1) for i, w in enumerate(["the", "a", "cat", "dog"])]
    path = tmp_path / "tokenizer.model"
    path.write_bytes(cc.sentencepiece_model(pieces))
    proc = spm.SentencePieceProcessor()
    proc.LoadFromFile(str(path))
    ours = SentencePieceModel.load(path)
    assert [proc.IdToPiece(i) for i in range(proc.vocab_size())] == ours.pieces
    assert [proc.GetScore(i) for i in range(proc.vocab_size())] == ours.scores


def test_protobuf_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="truncated"):
        decode_fields(b"\x0a\x05ab")
    with pytest.raises(ValueError, match="wire type"):
        decode_fields(b"\x0b")
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\xff")
    with pytest.raises(ConvertError, match="not a SentencePiece model"):
        SentencePieceModel.load(tmp_path / "tokenizer.model")


# ---------------------------------------------------------------------------- names
def test_model_id_heuristics() -> None:
    assert model_id_components("meta-llama/Llama-3.2-1B-Instruct", 1_240_000_000) == (
        "Llama-3.2-1B-Instruct", "meta-llama", "Llama-3.2", "Instruct", None, "1B")  # fmt: skip
    assert model_id_components("Mistral-7B-Instruct-v0.3", 7_000_000_000)[3:] == (
        "Instruct", "v0.3", "7B")  # fmt: skip
    # a size far from the real parameter count is a context length, part of the finetune
    assert model_id_components("Phi-3-mini-128k-instruct", 3_800_000_000)[3] == "128k-instruct"
    assert size_label(22_565_376) == "23M" and size_label(1_235_814_400) == "1.2B"
    assert naming_convention("My Model", None, "Instruct", "v2", "7B", "q8_0") == (
        "My-Model-7B-Instruct-v2-Q8_0")  # fmt: skip


# ---------------------------------------------------------------------------- convert
def test_convert_tiny_llama(llama_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out-{ftype}.gguf"
    result = convert(ConvertOptions(llama_dir, outfile=out, outtype="q8_0"))
    assert result.paths == [tmp_path / "out-q8_0.gguf"]
    with GGUFReader(result.paths[0]) as r:
        assert r.get("general.architecture") == "llama"
        assert r.get("tokenizer.ggml.model") == "llama"
        assert r.get("tokenizer.ggml.tokens")[-1] == "\u2581sat"
        assert r.get("general.file_type") == 7
        types = {t.name: t.type.name for t in r.tensors}
        assert types["blk.0.attn_q.weight"] == "Q8_0" and types["output_norm.weight"] == "F32"
        # Q and K rows are permuted to llama.cpp's interleaved RoPE layout
        q = r.tensor("blk.0.attn_k.weight")
        assert q.shape == (64, 32)


def test_dry_run_writes_nothing(llama_dir: Path, tmp_path: Path) -> None:
    opts = ConvertOptions(llama_dir, outfile=tmp_path / "m.gguf", outtype="f32",
                          split_max_tensors=5, dry_run=True)  # fmt: skip
    result = convert(opts)
    assert result.dry_run and len(result.shards) == 5
    assert result.paths[0].name == "m-00001-of-00005.gguf"
    assert not list(tmp_path.glob("*.gguf"))


def test_split_shards_follow_the_size_limit(llama_dir: Path, tmp_path: Path) -> None:
    opts = ConvertOptions(llama_dir, outfile=tmp_path / "m.gguf", outtype="f32",
                          split_max_size=40_000)  # fmt: skip
    result = convert(opts)
    assert len(result.shards) > 2
    for s in result.shards:
        assert s.nbytes <= 40_000 or len(s.tensors) == 1
        with GGUFReader(s.path) as r:
            assert r.get("split.count") == len(result.shards)
            assert [t.name for t in r.tensors] == [t.name for t in s.tensors]
    from llamacpy.gguf import GGUFModelFile

    with GGUFModelFile(result.paths[0]) as m:
        assert len(m.tensors) == len(result.tensors)


def test_output_is_atomic(llama_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from llamacpy.convert import plan

    calls = {"n": 0}
    real = plan.OutTensor.produce

    def failing(self):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ConvertError("simulated failure")
        return real(self)

    monkeypatch.setattr(plan.OutTensor, "produce", failing)
    for split in (None, 20_000):
        calls["n"] = 0
        opts = ConvertOptions(llama_dir, outfile=tmp_path / "m.gguf", outtype="f16",
                              split_max_size=split)  # fmt: skip
        with pytest.raises(ConvertError, match="simulated"):
            convert(opts)
        assert list(tmp_path.iterdir()) == [llama_dir]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: _edit_config(d, architectures=["GPT2LMHeadModel"]), "'GPT2LMHeadModel' is not supported; supported: LlamaForCausalLM"),
        (lambda d: _edit_config(d, architectures=None), "names no model architecture"),
        (lambda d: _edit_config(d, hidden_size=128), "has shape .* but config.json implies"),
        (lambda d: _edit_config(d, num_hidden_layers=1), "is in block 1 but config.json has num_hidden_layers=1"),
        (lambda d: (d / "tokenizer.model").unlink(), "no tokenizer found"),
        (lambda d: _bpe_tokenizer(d) or (d / "tokenizer.model").unlink(), "pre-tokenizer was not recognized: .*chkhsh [0-9a-f]{64}"),
        (lambda d: (d / "model.safetensors").write_bytes(b"garbage!garbage!"), "model.safetensors"),
        (lambda d: (d / "config.json").write_text("{"), "not valid JSON"),
    ],
)  # fmt: skip
def test_clear_errors(llama_dir: Path, tmp_path: Path, mutate, message: str) -> None:
    mutate(llama_dir)
    with pytest.raises(ConvertError, match=message):
        convert(ConvertOptions(llama_dir, outfile=tmp_path / "m.gguf"))
    assert not list(tmp_path.glob("*.gguf"))


def _edit_config(d: Path, **changes: Any) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    if changes.get("architectures", 1) is None:
        del cfg["architectures"]
    (d / "config.json").write_text(json.dumps(cfg))


def test_unmappable_tensor(tmp_path: Path) -> None:
    d = tiny_llama(tmp_path / "m", tensors={"model.layers.0.mystery.weight": [4]})
    with pytest.raises(ConvertError, match="cannot map tensor 'model.layers.0.mystery.weight'"):
        convert(ConvertOptions(d, outfile=tmp_path / "x.gguf"))


def test_vocab_only_needs_no_weights(llama_dir: Path, tmp_path: Path) -> None:
    (llama_dir / "model.safetensors").unlink()
    result = convert(ConvertOptions(llama_dir, outfile=tmp_path / "v.gguf", vocab_only=True))
    with GGUFReader(result.paths[0]) as r:
        assert not r.tensors and len(r.get("tokenizer.ggml.tokens")) == N_VOCAB


def test_streaming_peak_memory(tmp_path: Path) -> None:
    """Peak allocation is a few times the largest tensor, far below the model size."""
    d = tiny_llama(tmp_path / "m", hidden=256, layers=8)
    with Checkpoint(d) as ck:
        model_f32 = sum(int(np.prod(t.shape)) * 4 for t in ck.tensors.values())
        largest = max(int(np.prod(t.shape)) * 4 for t in ck.tensors.values())
    convert(ConvertOptions(d, outfile=tmp_path / "warm.gguf", outtype="f16", vocab_only=True))
    tracemalloc.start()
    try:
        convert(ConvertOptions(d, outfile=tmp_path / "x.gguf", outtype="f32"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert model_f32 > 8 * largest
    assert peak < 4 * largest + 2_000_000, (peak, largest, model_f32)


# ---------------------------------------------------------------------------- CLI
def test_cli_convert(llama_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cli.gguf"
    assert main(["convert", str(llama_dir), "--outfile", str(out), "--outtype", "f16", "-q"]) == 0
    text = capsys.readouterr().out
    assert "llama (LlamaForCausalLM)" in text and f"{out}:" in text and out.is_file()
    assert (
        main(["convert", str(llama_dir), "--outfile", str(tmp_path / "d.gguf"), "--dry-run"]) == 0
    )
    assert "dry run" in capsys.readouterr().out and not (tmp_path / "d.gguf").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["convert", "/nonexistent/model"], "no such directory"),
        (["convert", "{dir}", "--vocab-only", "--split-max-size", "1M"], "--vocab-only"),
    ],
)
def test_cli_errors_are_one_line(llama_dir: Path, capsys, args: list[str], message: str) -> None:
    args = [a.replace("{dir}", str(llama_dir)) for a in args]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("llamacpy: error:") and message in err and "\n" not in err


def test_cli_rejects_unknown_outtype(llama_dir: Path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["convert", str(llama_dir), "--outtype", "q4_0"])
    assert e.value.code == 2
