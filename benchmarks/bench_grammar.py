"""Grammar mask speed: ms per full-vocabulary mask for llama.cpp's json.gbnf (or a tool-call
grammar), llamacpy vs llama.cpp, on SmolLM2-135M's 49152-token and Gemma-3-270M's
262144-token vocabularies.

    .venv/bin/python benchmarks/bench_grammar.py [--repeat 2] [--grammar json|tools]

``--grammar tools``: the grammar the server builds for ``tool_choice: required`` with 24
tools of 2-6 typed parameters each (Hermes ``<tool_call>`` format), and one call as the
document.

A JSON document (nested objects, arrays, strings with escapes and non-ASCII, numbers) is
tokenized with the model's tokenizer; at every token position the grammar state after the
tokens before it is masked over the whole vocabulary, then the token is accepted.

* ours: ``GrammarMatcher.mask()``; pass 1 on a fresh matcher (every state met for the first
  time: its transitions are computed during the mask), later passes on the same matcher
  with a reset state (transitions memoized, as in a long generation). Also the one-token
  check (``allows``, the common sampler's fast path) and ``accept``.
* llama.cpp: ``llama_sampler_apply`` of its grammar sampler on all tokens of the vocabulary
  (the call the common sampler makes when a sampled token is rejected), then
  ``llama_sampler_accept``, in the llama-cpp-python oracle (``LLAMACPY_ORACLE_PY``, default
  /root/oracle/py) in a subprocess; without it only our numbers are printed.

Median and p99 over the positions. The vocabulary trie's build time is reported apart.

``--decode``: generation with and without the grammar, ``llamacpy run`` beside
``llama-completion -no-cnv`` (``LLAMACPY_ORACLE_BIN``), greedy, ``-t 1``, alternating rounds:
tokens per second of decode (eval + sampling per token) and the sampling time per token from
each tool's own timing lines (the same format). The grammar's cost is the sampling time it
adds per token, as a share of a token's decode time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llamacpy.grammar import GrammarMatcher, GrammarVocab, parse_grammar
from llamacpy.registry import ModelRegistry
from llamacpy.tokenizer import Tokenizer

ORACLE_PY = os.environ.get("LLAMACPY_ORACLE_PY", "/root/oracle/py")
ORACLE_BIN = Path(
    os.environ.get(
        "LLAMACPY_ORACLE_BIN", "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
    )
)
ROOT = Path(__file__).resolve().parent.parent
GRAMMAR = ROOT / "tests/fixtures/grammar/gbnf/json.gbnf"
MODELS = ("smollm2-135m", "gemma3-270m")
DOC = json.dumps(
    {
        "name": "Ada Lovelace",
        "born": 1815,
        "ratio": -0.125e3,
        "tags": ["mathematician", "writer", "Analytical Engine"],
        "quote": 'She said: "That brain of mine is something more than merely mortal."\n',
        "city": "Zürich → London",
        "works": [{"title": "Notes", "year": 1843, "pages": 65}, {"title": "Letters", "ok": True}],
        "spouse": None,
    }
)


def tool_case() -> tuple[str, str]:
    """The Hermes tool-call grammar of 24 synthetic tools, and a call of one of them."""
    from llamacpy.api.tool_calls import parse_tools, plan_chat

    kinds = [{"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "number"},
             {"type": "boolean"}, {"type": "string", "enum": ["low", "mid", "high"]},
             {"type": "array", "items": {"type": "string"}, "maxItems": 8}]  # fmt: skip
    tools = []
    for i in range(24):
        props = {f"p{j}_{i}": kinds[(i + j) % len(kinds)] for j in range(2 + i % 5)}
        tools.append({"type": "function", "function": {
            "name": f"tool_{i}", "description": f"tool number {i}", "parameters": {
                "type": "object", "properties": props, "required": list(props)[:2]}}})  # fmt: skip
    plan = plan_chat("<tool_call>", parse_tools(tools), "required", parallel=True)
    plan.build_grammar()
    call = {"name": "tool_9", "arguments": {"p0_9": True, "p1_9": "high",
            "p2_9": ["Zürich", 'a "quoted" word'], "p3_9": "Ada Lovelace, 1815",
            "p4_9": 1843, "p5_9": -0.125}}  # fmt: skip
    return plan.grammar, "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


ORACLE = r"""
import ctypes, json, sys, time
import llama_cpp as L
path, grammar, ids = sys.argv[1], open(sys.argv[2]).read(), json.loads(sys.argv[3])
L.llama_backend_init()
mp = L.llama_model_default_params(); mp.vocab_only = True
model = L.llama_model_load_from_file(path.encode(), mp)
vocab = L.llama_model_get_vocab(model)
n = L.llama_vocab_n_tokens(vocab)
smpl = L.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
data = (L.llama_token_data * n)()
arr = L.llama_token_data_array(data, n, -1, False)
apply_ms, accept_ms = [], []
for t in ids:
    for i in range(n):
        data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
    arr.size, arr.selected, arr.sorted = n, -1, False
    t0 = time.perf_counter(); L.llama_sampler_apply(smpl, ctypes.byref(arr))
    t1 = time.perf_counter(); L.llama_sampler_accept(smpl, t)
    t2 = time.perf_counter()
    apply_ms.append((t1 - t0) * 1e3); accept_ms.append((t2 - t1) * 1e3)
print(json.dumps({"n_vocab": n, "apply_ms": apply_ms, "accept_ms": accept_ms}))
"""


def stats(ms: list[float]) -> str:
    a = np.array(ms)
    return f"median {np.median(a):8.3f} ms  p99 {np.percentile(a, 99):8.3f} ms  mean {a.mean():8.3f} ms"


def ours(tok: Tokenizer, ids: list[int], repeat: int, grammar: str) -> dict:
    t0 = time.perf_counter()
    vocab = GrammarVocab([tok.token_to_piece(t, special=True) for t in range(tok.n_vocab)], tok.eog)
    build_s = time.perf_counter() - t0
    m = GrammarMatcher(parse_grammar(grammar), vocab)
    out = np.zeros(vocab.n_vocab, np.bool_)
    passes, allows_ms, accept_ms, n_allowed = [], [], [], []
    for p in range(repeat):
        m.reset()
        mask_ms = []
        for t in ids:
            t0 = time.perf_counter()
            m.mask(out)
            t1 = time.perf_counter()
            ok = m.allows(t)
            t2 = time.perf_counter()
            m.accept(t)
            t3 = time.perf_counter()
            assert ok and out[t]
            mask_ms.append((t1 - t0) * 1e3)
            if p == repeat - 1:
                allows_ms.append((t2 - t1) * 1e3)
                accept_ms.append((t3 - t2) * 1e3)
                n_allowed.append(int(out.sum()))
        passes.append(mask_ms)
    return {"build_s": build_s, "passes": passes, "allows_ms": allows_ms,
            "accept_ms": accept_ms, "n_allowed": n_allowed}  # fmt: skip


def oracle(path: Path, ids: list[int], grammar: str) -> dict | None:
    py = Path(ORACLE_PY) / "bin" / "python"
    if not py.exists():
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".gbnf", delete=False) as f:
        f.write(grammar)
    try:
        proc = subprocess.run([str(py), "-c", ORACLE, str(path), f.name, json.dumps(ids)],
                              capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        os.unlink(f.name)
    return json.loads(proc.stdout.strip().splitlines()[-1])


_SAMPLING = re.compile(r"sampling time =\s+([\d.]+) ms(?: /\s+(\d+) runs)?")
_EVAL = re.compile(r"        eval time =\s+([\d.]+) ms /\s+(\d+) runs")
DECODE_PROMPT = "Describe a person as a JSON object with name, age, city and hobbies:"


def _timings(stderr: str) -> dict[str, tuple[float, int]]:
    """Sampling and eval (ms, count) from the timing lines (llama.cpp prints the sampling
    count only in some cases: then one per generated token)."""
    e = _EVAL.search(stderr)
    sm = _SAMPLING.search(stderr)
    if e is None or sm is None:
        raise RuntimeError("no timing lines in:\n" + stderr[-2000:])
    n_eval = int(e.group(2))
    n_samp = int(sm.group(2)) if sm.group(2) else n_eval + 1
    return {"eval time": (float(e.group(1)), n_eval), "sampling time": (float(sm.group(1)), n_samp)}


def decode(path: Path, rounds: int, n: int) -> None:
    """Decode speed with and without json.gbnf, ours and llama.cpp's, alternating."""
    common = ["-m", str(path), "-c", "1024", "-n", str(n), "--temp", "0", "-t", "1",
              "-p", DECODE_PROMPT]  # fmt: skip
    sides = {"llamacpy": [sys.executable, "-m", "llamacpy", "run", *common]}
    if (ORACLE_BIN / "llama-completion").exists():
        sides["llama.cpp"] = [str(ORACLE_BIN / "llama-completion"), "-no-cnv", *common]
    runs: dict[tuple[str, bool], list[dict]] = {}
    for _ in range(rounds):
        for side, cmd in sides.items():
            for g in (False, True):
                extra = ["--grammar-file", str(GRAMMAR)] if g else []
                proc = subprocess.run(cmd + extra, capture_output=True, text=True, check=True)
                runs.setdefault((side, g), []).append(_timings(proc.stderr))
    for side in sides:
        per = {}
        for g in (False, True):
            t = runs[(side, g)]
            eval_ms = np.median([r["eval time"][0] / max(r["eval time"][1], 1) for r in t])
            samp_ms = np.median([r["sampling time"][0] / max(r["sampling time"][1], 1) for r in t])
            per[g] = (eval_ms, samp_ms, int(np.median([r["eval time"][1] for r in t])))
            label = "with json.gbnf" if g else "no grammar    "
            print(f"  {side:9s} {label}: {per[g][2]:4d} tokens, eval {eval_ms:6.2f} ms/token, "
                  f"sampling {samp_ms:6.3f} ms/token, decode {1e3 / (eval_ms + samp_ms):6.1f} "
                  f"tokens/s")  # fmt: skip
        added = per[True][1] - per[False][1]
        share = added / (per[True][0] + per[True][1])
        print(f"  {side:9s} the grammar adds {added:6.3f} ms of sampling per token: "
              f"{100 * share:.1f}% of a token's decode time")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="passes over the document (>= 2)")
    ap.add_argument("--grammar", choices=["json", "tools"], default="json")
    ap.add_argument("--decode", action="store_true", help="generation with and without it")
    ap.add_argument("--rounds", type=int, default=3, help="--decode: alternating rounds")
    ap.add_argument("-n", type=int, default=128, help="--decode: tokens to generate")
    args = ap.parse_args()
    registry = ModelRegistry.from_environment()
    if args.decode:
        for name in MODELS:
            print(f"{name}:")
            decode(registry.pull(name, quiet=True), args.rounds, args.n)
        return
    if args.grammar == "tools":
        grammar, doc = tool_case()
        print(f"document: a {len(doc)}-character tool call; grammar: 24 tools, "
              f"{len(grammar)} characters")  # fmt: skip
    else:
        grammar, doc = GRAMMAR.read_text(), DOC
        print(f"document: {len(DOC)} characters of JSON; grammar: {GRAMMAR.name}")
    for name in MODELS:
        path = registry.pull(name, quiet=True)
        tok = Tokenizer.from_gguf(path)
        ids = tok.encode(doc, add_special=False, parse_special=False)
        r = ours(tok, ids, max(2, args.repeat), grammar)
        print(f"\n{name}: vocabulary {tok.n_vocab}, {len(ids)} positions, trie built in "
              f"{r['build_s']:.2f} s, allowed tokens per position: median "
              f"{int(np.median(r['n_allowed']))}")  # fmt: skip
        print(f"  ours mask, first pass  {stats(r['passes'][0])}")
        print(f"  ours mask, memoized    {stats(r['passes'][-1])}")
        print(f"  ours allows (1 token)  {stats(r['allows_ms'])}")
        print(f"  ours accept            {stats(r['accept_ms'])}")
        o = oracle(path, ids, grammar)
        if o is None:
            continue
        print(f"  llama.cpp apply (mask) {stats(o['apply_ms'])}")
        print(f"  llama.cpp accept       {stats(o['accept_ms'])}")
        med = np.median(o["apply_ms"])
        print(f"  speed-up of the median mask: first pass {med / np.median(r['passes'][0]):.0f}x,"
              f" memoized {med / np.median(r['passes'][-1]):.0f}x")  # fmt: skip


if __name__ == "__main__":
    main()
