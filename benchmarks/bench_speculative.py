"""Speculative decoding on two tasks, side by side with llama.cpp.

    python benchmarks/bench_speculative.py [-m smollm2-135m,gemma3-270m] [-n 256] [-t 2]
        [--types ngram-simple,prompt-lookup,ngram-mod] [--rounds 2] [--llama-server PATH]

Tasks (greedy, the model's chat template):

- ``code-edit``: the prompt holds a ~300-line source file of this repository and asks for it
  back with one function renamed; a model that copies gives long accepted runs.
- ``summarise``: a long passage (the repository's architecture notes) and a request for a
  summary; proposals come only from phrases it repeats.

For each model and task: our generation tokens/s plain and with each proposer (acceptance
rate, mean accepted per round, and whether the tokens equal plain decoding's), and
llama-server's (same threads, ``-np 1``) plain and with ``--spec-type ngram-simple``; rounds
alternate between the two. Figures are ``timings.predicted_per_second`` on both sides
(generation only, prompt excluded).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _server_common import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[1]
LLAMA_SERVER = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server")


def tasks() -> dict[str, list[dict[str, str]]]:
    src = (ROOT / "src/llamacpy/api/generation.py").read_text().splitlines()[:300]
    code = "\n".join(src)
    notes = (ROOT / "docs/ARCHITECTURE.md").read_text()[:6000]
    return {
        "code-edit": [{"role": "user", "content": "Here is a Python file:\n\n```python\n"
                       f"{code}\n```\n\nRewrite the whole file with the function "
                       "`common_prefix` renamed to `shared_prefix`. Output only the code."}],
        "summarise": [{"role": "user", "content": f"{notes}\n\nSummarise the text above in "
                       "a few paragraphs, reusing its own wording."}],
    }  # fmt: skip


def ours(model: str, messages, n: int, threads: int, kind: str | None) -> dict:
    from llamacpy.api import Llama
    from llamacpy.api.speculative import Speculator, make_proposer

    llm = _LLMS.get(model)
    if llm is None:
        llm = _LLMS[model] = Llama(model, n_ctx=4096, n_threads=threads, verbose=False)
    llm._speculator = Speculator(make_proposer(kind)) if kind else None
    s = llm._session
    s.reset()
    llm.create_chat_completion(messages, max_tokens=1, temperature=0)  # the prompt, cached
    s.timings.reset()
    t0 = time.perf_counter()
    r = llm.create_chat_completion(messages, max_tokens=n, temperature=0, seed=1)
    wall = time.perf_counter() - t0
    tm = s.timings
    out = {"text": r["choices"][0]["message"]["content"], "tokens": r["usage"]["completion_tokens"]}
    out["tps"] = out["tokens"] / max(tm.t_eval + tm.t_sample, 1e-9)
    out["wall_tps"] = out["tokens"] / wall
    sp = llm._speculator
    if sp is not None:
        st = sp.stats
        out["acceptance"] = st.acceptance
        out["accepted_per_round"] = st.n_accepted / st.n_rounds if st.n_rounds else 0.0
        out["rounds"] = st.n_rounds
    return out


_LLMS: dict = {}


def theirs(server: str, path: str, messages, n: int, threads: int, spec: str | None) -> dict:
    port = free_port()
    cmd = [server, "-m", path, "-c", "4096", "-t", str(threads), "-np", "1", "--port",
           str(port), "--no-webui"] + (["--spec-type", spec] if spec else [])  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(proc, base):
            return {"error": "llama-server did not start"}
        body = {"messages": messages, "max_tokens": n, "temperature": 0, "seed": 1}
        httpx.post(base + "/v1/chat/completions", json={**body, "max_tokens": 1}, timeout=600)
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=900).json()
        t = r.get("timings", {})
        out = {"tps": t.get("predicted_per_second", 0.0), "tokens": t.get("predicted_n", 0),
               "text": r["choices"][0]["message"]["content"]}  # fmt: skip
        if "draft_n" in t:
            out["acceptance"] = t["draft_n_accepted"] / max(t["draft_n"], 1)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--types", default="ngram-simple,prompt-lookup,ngram-mod")
    ap.add_argument("--tasks", default="code-edit,summarise")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER))
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    from llamacpy.registry import resolve_model

    results = []
    have_server = Path(args.llama_server).exists()
    for model in args.models.split(","):
        path = str(resolve_model(model))
        for task in args.tasks.split(","):
            msgs = tasks()[task]
            for rnd in range(args.rounds):
                row = {"model": model, "task": task, "round": rnd}
                if have_server:
                    row["llama.cpp"] = theirs(
                        args.llama_server, path, msgs, args.n, args.threads, None
                    )
                    row["llama.cpp ngram-simple"] = theirs(
                        args.llama_server, path, msgs, args.n, args.threads, "ngram-simple"
                    )
                plain = ours(model, msgs, args.n, args.threads, None)
                row["ours"] = plain
                for kind in args.types.split(","):
                    r = ours(model, msgs, args.n, args.threads, kind)
                    r["identical"] = r["text"] == plain["text"]
                    row[f"ours {kind}"] = r
                results.append(row)
                _print(row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _print(row: dict) -> None:
    base = row["ours"]["tps"]
    lc = row.get("llama.cpp", {}).get("tps")
    print(f"\n{row['model']} {row['task']} (round {row['round']})")
    for k, v in row.items():
        if not isinstance(v, dict):
            continue
        if "error" in v:
            print(f"  {k:<24} {v['error']}")
            continue
        extra = ""
        if "acceptance" in v:
            extra += f"  acceptance {v['acceptance']:.2f}"
        if "accepted_per_round" in v:
            extra += f", {v['accepted_per_round']:.1f}/round over {v['rounds']} rounds"
        if "identical" in v:
            extra += f"  identical: {v['identical']}"
        vs = f"  x{v['tps'] / base:.2f} our plain" if base else ""
        vs += f", x{v['tps'] / lc:.2f} llama.cpp plain" if lc else ""
        print(f"  {k:<24} {v['tps']:7.1f} t/s ({v['tokens']} tokens){vs}{extra}")


if __name__ == "__main__":
    raise SystemExit(main())
