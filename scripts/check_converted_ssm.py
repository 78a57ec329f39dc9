#!/usr/bin/env python
"""Check mamba2, granitehybrid and qwen3next on files laid out as real ones are (dev-only):
tiny random transformers models (``Mamba2ForCausalLM``; ``GraniteMoeHybridForCausalLM``
dense, and with 4 experts and a shared expert; ``Qwen3NextForCausalLM``: 3 Gated DeltaNet
layers of 2 key / 4 value heads and a gated attention layer, 4 experts and a shared expert)
converted by llama.cpp's ``convert_hf_to_gguf.py`` (F32; qwen3next ``--no-mtp``) and
``llama-quantize`` (Q8_0), then our logits against llama.cpp's on the same files.

Run from the repository root with the project's venv::

    .venv/bin/python scripts/check_converted_ssm.py [--hf-py /tmp/hfenv/bin/python] [--models qwen3next ...]

``--hf-py``: an interpreter with transformers and torch (CPU). Prints max |diff| per file,
thread count and ubatch size (measured: Q8_0 0 everywhere; F32 2.9e-6 of max |logit| 2.35 for
mamba2, 6.3e-7 of 0.25 for granitehybrid, 3.2e-7 of 0.26 with experts, 3.5e-4 of 3.16 for
qwen3next).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from llamacpy.engine import Context, ContextParams  # noqa: E402
from llamacpy.engine.batch import Batch  # noqa: E402
from make_arch_fixtures import ORACLE_LOGITS, ORACLE_PY, TOKENS, oracle  # noqa: E402

LLAMA_CPP = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp")
MODELS = ["mamba2", "granite", "granite_moe", "qwen3next"]

_MAKE = """
import json, sys, torch
from transformers import (GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, Mamba2Config,
                          Mamba2ForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)
out = sys.argv[1]
def init(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "A_log" in n: p.copy_(torch.rand_like(p))
            elif n.endswith(".D") or "dt_bias" in n: p.copy_(torch.randn_like(p))
            elif "norm" in n: p.copy_(1 + 0.1 * torch.randn_like(p))
            elif p.dim() >= 2 and "mixer" not in n: p.copy_(0.05 * torch.randn_like(p))
torch.manual_seed(0)
m = Mamba2ForCausalLM(Mamba2Config(vocab_size=256, hidden_size=128, state_size=64,
    num_hidden_layers=2, expand=2, head_dim=64, n_groups=2, conv_kernel=4, num_heads=4,
    tie_word_embeddings=False))
init(m)
m.save_pretrained(f"{out}/mamba2")
for name, moe in (("granite", 0), ("granite_moe", 4)):
    torch.manual_seed(1)
    c = GraniteMoeHybridConfig(vocab_size=256, hidden_size=128,
        intermediate_size=64 if moe else 256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=4, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=64, mamba_d_conv=4, mamba_expand=2, position_embedding_type="nope",
        layer_types=["mamba", "mamba", "attention", "mamba"], embedding_multiplier=12.0,
        residual_multiplier=0.22, logits_scaling=8.0, attention_multiplier=0.0078125,
        num_local_experts=moe, num_experts_per_tok=2 if moe else 0,
        shared_intermediate_size=96 if moe else 256, tie_word_embeddings=False)
    m = GraniteMoeHybridForCausalLM(c)
    init(m)
    m.save_pretrained(f"{out}/{name}")
    p = f"{out}/{name}/config.json"  # (transformers 5 renames the layer types on save)
    cfg = json.load(open(p))
    cfg["layer_types"] = ["mamba", "mamba", "attention", "mamba"]
    json.dump(cfg, open(p, "w"))
torch.manual_seed(2)
m = Qwen3NextForCausalLM(Qwen3NextConfig(vocab_size=151936, hidden_size=128,
    intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25}, linear_conv_kernel_dim=4, linear_key_head_dim=32,
    linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
    moe_intermediate_size=64, shared_expert_intermediate_size=96, num_experts_per_tok=2,
    num_experts=4, full_attention_interval=4, tie_word_embeddings=False))
init(m)
with torch.no_grad():  # (zero-centred norms: the converter adds 1)
    for n, p in m.named_parameters():
        if "norm" in n and "linear_attn" not in n: p.sub_(1)
        elif p.dim() >= 2: p.copy_(0.05 * torch.randn_like(p))
m.save_pretrained(f"{out}/qwen3next")
"""


def qwen2_tokenizer(out: Path) -> None:
    """Qwen2's tokenizer (151936 tokens; the converter needs a known pre-tokenizer) from
    the converter tests' qwen2 checkpoint spec."""
    sys.path.insert(0, str(ROOT / "tests"))
    from convert_checkpoints import write_tokenizer
    from llama_cpp_testdata import ensure_testdata

    with gzip.open(ROOT / "tests" / "fixtures" / "convert" / "qwen2.json.gz", "rt") as f:
        write_tokenizer(out, json.load(f)["spec"], ensure_testdata())


def convert(hf_py: str, tmp: Path, name: str) -> list[Path]:
    """F32 (the converter) and Q8_0 (llama-quantize) files of the saved model ``name``."""
    f32, q8 = tmp / f"{name}-f32.gguf", tmp / f"{name}-q8_0.gguf"
    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    conv = [hf_py, str(LLAMA_CPP / "convert_hf_to_gguf.py"), str(tmp / name), "--outtype", "f32"]
    conv += ["--no-mtp"] if name == "qwen3next" else []  # (its checkpoint has no MTP block)
    subprocess.run([*conv, "--outfile", str(f32)], check=True, env=env, capture_output=True)
    quantize = LLAMA_CPP / "build" / "bin" / "llama-quantize"
    subprocess.run([str(quantize), str(f32), str(q8), "Q8_0"], check=True, capture_output=True)
    return [f32, q8]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-py", default="/tmp/hfenv/bin/python")
    ap.add_argument("--oracle-py", default=ORACLE_PY)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        subprocess.run([args.hf_py, "-c", _MAKE, str(tmp)], check=True, capture_output=True)
        qwen2_tokenizer(tmp / "qwen3next")
        for name in args.models:
            for path in convert(args.hf_py, tmp, name):
                code = ORACLE_LOGITS.format(path=str(path), n_ctx=64, tokens=TOKENS, n=len(TOKENS))
                code += "print(json.dumps({'logits': logits}))"
                want = np.array(oracle(args.oracle_py, code)["logits"], np.float32)
                for n_threads, n_ubatch in ((2, 512), (1, 3)):
                    params = ContextParams(n_ctx=64, n_threads=n_threads, n_ubatch=n_ubatch)
                    got = Context(path, params).decode(Batch.from_tokens(TOKENS, logits="all"))
                    print(
                        f"{path.name}: threads {n_threads}, ubatch {n_ubatch}: max |diff| "
                        f"{np.abs(got - want).max():.3g} of max |logit| {np.abs(want).max():.3g}"
                    )


if __name__ == "__main__":
    main()
