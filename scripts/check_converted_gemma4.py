#!/usr/bin/env python
"""Check gemma4 on files laid out as real ones are (dev-only): tiny seeded random transformers
``Gemma4ForCausalLM`` models converted by llama.cpp's ``convert_hf_to_gguf.py`` (``--outtype
f32`` and ``q8_0``), then our logits against llama.cpp's on the same files, and greedy
continuations of 32 tokens. Variants (``--variants``): ``dense`` (3 layers: local, local,
global; head size 64 for both kinds), ``moe`` (4 experts of which 2 used), ``31b`` (31B's
layout: local heads of 32, the global layer's of 64 with 1 KV head and its values read from
its keys, ``attention_k_eq_v``), ``e2b`` (E2B's layout: 6 layers, the last 3 sharing the KV
of layers 1 and 2 with FFNs twice as wide, ``use_double_wide_mlp``; per-layer embeddings of
32).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/check_converted_gemma4.py [--hf-py /tmp/hfenv/bin/python]

``--hf-py``: an interpreter with transformers (5.x, which has gemma4) and torch (CPU). The
converter runs unchanged but for two things the tiny checkpoints lack: the vocabulary is 259
SentencePiece byte tokens (no tokenizer model), and ``config.json`` is read as saved, with
the keys ``Gemma4TextConfig.to_dict`` leaves out and the converter needs (``global_head_dim``,
``num_global_key_value_heads``, ``per_layer_config``) put back. Measured: Q8_0 logits
bit-identical at ubatch 512/7/1 (threads 2/1/2) for every variant; F32 within 3.0e-4
(dense), 1.3e-4 (experts: fused ``ffn_gate_up_exps``, an F32 router), 8.6e-4 (31b) and
1.2e-3 (e2b) of max |logit|; greedy continuations identical.
"""

from __future__ import annotations

import argparse
import json
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
from make_arch_fixtures import _CODE, ORACLE_PY, PROMPT, TOKENS, oracle  # noqa: E402

LLAMA_CPP = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp")
N_GREEDY = 32

# the checkpoints: name -> (config arguments beside the common ones, keys patched into the
# saved config.json, which to_dict leaves out but the converter reads)
S, F = "sliding_attention", "full_attention"
VARIANTS = {
    "dense": ({}, {"global_head_dim": 64, "per_layer_config": {"2": {"head_dim": 64}}}),
    "moe": (
        dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64),
        {"global_head_dim": 64, "per_layer_config": {"2": {"head_dim": 64}}},
    ),
    # 31B's layout: local heads of 32, global of 64 with 1 KV head, values from its keys
    "31b": (
        dict(head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
             attention_k_eq_v=True),
        {"global_head_dim": 64, "num_global_key_value_heads": 1,
         "per_layer_config": {"2": {"head_dim": 64, "num_key_value_heads": 1}}},
    ),
    # E2B's layout: 6 layers, the last 3 reading layers 1 and 2's KV with FFNs twice as
    # wide, per-layer embeddings of 32
    "e2b": (
        dict(num_hidden_layers=6, layer_types=[S, S, F, S, S, F], head_dim=32,
             global_head_dim=64, num_kv_shared_layers=3, hidden_size_per_layer_input=32,
             use_double_wide_mlp=True),
        {"global_head_dim": 64, "per_layer_config": {"2": {"head_dim": 64},
                                                     "5": {"head_dim": 64}}},
    ),
}  # fmt: skip

_MAKE = """
import json, os, sys, torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
out, extra, patch = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
torch.manual_seed(3)
kw = dict(vocab_size=259, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, global_head_dim=64,
    sliding_window=4, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    final_logit_softcapping=30.0, hidden_size_per_layer_input=0, vocab_size_per_layer_input=259,
    num_kv_shared_layers=0, max_position_embeddings=256, pad_token_id=0, eos_token_id=2,
    bos_token_id=1)
kw.update(extra)
m = Gemma4ForCausalLM(Gemma4TextConfig(**kw)).eval()
with torch.no_grad():  # weights of std 0.05, norms around 1, layer scalars not 1
    for n, p in m.named_parameters():
        p.normal_(0, 0.05) if p.ndim >= 2 else p.copy_(1.0 + 0.1 * torch.randn_like(p))
    for n, b in m.named_buffers():
        if n.endswith("layer_scalar"):
            b.copy_(0.8 + 0.4 * torch.rand_like(b))
m.save_pretrained(out)
p = os.path.join(out, "config.json")
c = json.load(open(p))
c.update(patch)
json.dump(c, open(p, "w"))
toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
json.dump({"model": {"vocab": {t: i for i, t in enumerate(toks)}}, "added_tokens": []},
          open(os.path.join(out, "tokenizer.json"), "w"))
"""

_CONVERT = """
import json, sys
from pathlib import Path
LC = Path(sys.argv[1])
sys.path.insert(0, str(LC)); sys.path.insert(1, str(LC / "gguf-py"))
import conversion.base as B
import conversion.gemma as G
def set_vocab(self):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    w = self.gguf_writer
    w.add_tokenizer_model("llama"); w.add_token_list(toks); w.add_token_scores([0.0] * 259)
    w.add_token_types([2, 3, 3] + [6] * 256)
    w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_add_bos_token(False)
G.Gemma4Model.set_vocab = set_vocab
B.ModelBase.load_hparams = staticmethod(lambda d, m: json.load(open(Path(d) / "config.json")))
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-py", default="/tmp/hfenv/bin/python")
    ap.add_argument("--oracle-py", default=ORACLE_PY)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for name in args.variants.split(","):
            src = Path(d) / name
            extra, patch = (json.dumps(x) for x in VARIANTS[name])
            subprocess.run([args.hf_py, "-c", _MAKE, str(src), extra, patch], check=True,
                           capture_output=True)  # fmt: skip
            for outtype in ("f32", "q8_0"):
                path = Path(d) / f"{name}-{outtype}.gguf"
                conv = [args.hf_py, "-c", _CONVERT, str(LLAMA_CPP), str(src), "--outtype",
                        outtype, "--outfile", str(path)]  # fmt: skip
                subprocess.run(conv, check=True, capture_output=True)
                check(args.oracle_py, path)


def check(oracle_py: str, path: Path) -> None:
    """Our logits (ubatch 512/7/1) and greedy continuation against llama.cpp's."""
    code = _CODE.format(path=str(path), n_ctx=64, tokens=TOKENS, n=len(TOKENS),
                        prompt=PROMPT, n_gen=N_GREEDY)  # fmt: skip
    res = oracle(oracle_py, code)
    want = np.array(res["logits"], np.float32)
    for n_ubatch, n_threads in ((512, 2), (7, 1), (1, 2)):
        params = ContextParams(n_ctx=64, n_batch=64, n_ubatch=n_ubatch, n_threads=n_threads,
                               n_threads_batch=n_threads)  # fmt: skip
        ctx = Context(path, params)
        got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
        print(
            f"{path.name}: ubatch {n_ubatch}, threads {n_threads}: max |diff| "
            f"{np.abs(got - want).max() / np.abs(want).max():.2e} of max |logit| "
            f"{np.abs(want).max():.3g}, identical {np.array_equal(got, want)}"
        )
    ctx.clear()
    lg, out = ctx.decode(Batch.from_tokens(PROMPT))[0], []
    for i in range(N_GREEDY):
        out.append(int(lg.argmax()))
        lg = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + i))[0]
    print(f"{path.name}: greedy continuation of {N_GREEDY} identical: {out == res['greedy']}")


if __name__ == "__main__":
    main()
