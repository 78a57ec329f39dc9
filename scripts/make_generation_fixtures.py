"""Record llama.cpp's behaviour for the generation tests (dev-only; needs the oracle).

    /root/oracle/py scripts/make_generation_fixtures.py [MODEL]

Writes into tests/fixtures/generation/:

* ``completions.json``: llama-cpp-python 0.3.36 ``Llama(...)(prompt, ...)`` at several
  temperatures and sampler settings (greedy included): prompt ids, completion ids (recorded
  from the sampler), text, finish reason; plus an echo+logprobs response and a chat
  completion.
* ``cli_completions.json``: ``llama-completion -no-cnv`` outputs for ``llamacpy run``.
* ``perplexity.json``: ``llama-perplexity`` on ``prose.txt`` (-c 128 / 256).
* ``llama_bench.json``: ``llama-bench -o json|csv|md`` outputs (for fields and layout).

Each case uses a fresh ``Llama`` (no prefix reuse), flash attention (llama.cpp's default on
a CPU; llama-cpp-python turns it off unless asked) and one thread (the machine is shared;
spinning thread pools slow to a crawl under contention).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "generation"
BIN = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
MODEL = Path.home() / ".cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX = 256

CHAT_PROMPT = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
CASES = [
    ("greedy", "The capital of France is", dict(temperature=0.0)),
    ("greedy_code", "def fibonacci(n):", dict(temperature=0.0)),
    ("greedy_story", "Once upon a time, in a small village,", dict(temperature=0.0)),
    ("default_s42", "The capital of France is", dict(temperature=0.8, seed=42)),
    ("t1_topp", "My favourite food is", dict(temperature=1.0, top_k=0, top_p=0.9, seed=1)),
    ("t15_minp", "The weather today", dict(temperature=1.5, min_p=0.1, seed=7)),
    ("penalties", "List of fruits: apple, banana,",
     dict(temperature=0.7, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1,
          seed=123)),
    ("typical", "In the beginning", dict(temperature=0.9, typical_p=0.8, seed=5)),
    ("topk5", "The quick brown fox", dict(temperature=1.2, top_k=5, seed=99)),
    ("mirostat2", "Science is", dict(temperature=0.8, mirostat_mode=2, seed=11)),
    ("chat_special", CHAT_PROMPT, dict(temperature=0.6, seed=3)),
    ("dist_only", "Hello, my name is", dict(temperature=-1.0, seed=9)),
    ("seed_none", "Tell me a joke.", dict(temperature=0.8)),
]  # fmt: skip

CLI_CASES = [
    ("cli_greedy", "The capital of France is", ["--temp", "0"]),
    ("cli_s42", "The capital of France is", ["-s", "42", "--temp", "0.8"]),
    ("cli_penalty", "List of fruits: apple, banana,",
     ["-s", "5", "--temp", "0.7", "--repeat-penalty", "1.2", "--top-k", "20"]),
    ("cli_minp", "Once upon a time", ["-s", "77", "--temp", "1.1", "--min-p", "0.1",
                                      "--top-p", "1.0"]),
]  # fmt: skip


def record_completions(model: Path) -> dict:
    from llama_cpp import Llama

    def fresh(**kw):
        # flash attention on, as llama.cpp's tools default to on a CPU (and the engine mirrors)
        return Llama(str(model), n_ctx=N_CTX, n_threads=1, n_threads_batch=1, flash_attn=True,
                     verbose=False, **kw)  # fmt: skip

    out = {"model": model.name, "n_ctx": N_CTX, "max_tokens": 32, "cases": []}
    for name, prompt, kw in CASES:
        llm = fresh()
        sampled: list[int] = []
        orig = llm.sample

        def rec(*a, _orig=orig, _s=sampled, **k):
            t = _orig(*a, **k)
            _s.append(int(t))
            return t

        llm.sample = rec
        res = llm(prompt, max_tokens=32, **kw)
        choice = res["choices"][0]
        n = res["usage"]["completion_tokens"]
        out["cases"].append(
            {
                "name": name,
                "prompt": prompt,
                "kwargs": kw,
                "prompt_ids": llm.tokenize(prompt.encode(), add_bos=True, special=True),
                "completion_ids": sampled[:n],
                "text": choice["text"],
                "finish_reason": choice["finish_reason"],
            }
        )
        print(f"{name}: {choice['text']!r}", file=sys.stderr)
    # README example (stop strings + echo) and logprobs with echo
    out["readme"] = record_readme(model)
    llm = fresh(logits_all=True)
    res = llm("The capital of France is", max_tokens=6, temperature=0.0, logprobs=3, echo=True)
    out["echo_logprobs"] = {k: res[k] for k in ("object", "choices", "usage")}
    llm = fresh()
    res = llm.create_chat_completion(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0.0, max_tokens=24,
    )  # fmt: skip
    out["chat"] = {k: res[k] for k in ("object", "choices", "usage")}
    return out


def record_readme(model: Path) -> dict:
    """The README's completion example, verbatim, on a new Llama with default arguments
    (n_ctx 512, no seed: the seed is drawn from LLAMA_DEFAULT_SEED, so it is reproducible)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), n_threads=1, n_threads_batch=1, flash_attn=True,
                verbose=False)  # fmt: skip
    output = llm(
        "Q: Name the planets in the solar system? A: ",  # Prompt
        max_tokens=32,  # Generate up to 32 tokens
        stop=["Q:", "\n"],  # Stop generating just before the model would generate a new question
        echo=True,  # Echo the prompt back in the output
    )
    return {k: output[k] for k in ("object", "choices", "usage")}


def record_cli(model: Path) -> dict:
    out = {"model": model.name, "n_ctx": N_CTX, "n_predict": 24, "cases": []}
    for name, prompt, flags in CLI_CASES:
        cmd = [str(BIN / "llama-completion"), "-m", str(model), "-p", prompt, "-n", "24",
               "-c", str(N_CTX), "-t", "1", "-no-cnv", "--no-display-prompt", *flags]  # fmt: skip
        env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
        proc = subprocess.run(cmd, capture_output=True, env=env, check=True)
        text = proc.stdout.decode("utf-8", "replace")
        text = text.removesuffix("\n\n").removesuffix(" [end of text]")
        out["cases"].append({"name": name, "prompt": prompt, "flags": flags, "text": text})
        print(f"{name}: {text!r}", file=sys.stderr)
    return out


def record_perplexity(model: Path) -> dict:
    out = {"model": model.name, "file": "prose.txt", "runs": []}
    for c, chunks, b in ((128, 8, 2048), (128, 8, 128), (256, 4, 2048)):
        cmd = [str(BIN / "llama-perplexity"), "-m", str(model), "-f", str(OUT / "prose.txt"),
               "-c", str(c), "--chunks", str(chunks), "-b", str(b), "-t", "1"]  # fmt: skip
        env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
        proc = subprocess.run(cmd, capture_output=True, env=env, check=True)
        text = proc.stdout.decode() + proc.stderr.decode()
        m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", text)
        assert m, text[-2000:]
        chunks_ppl = [float(x) for x in re.findall(r"\[\d+\]([\d.]+),", text)]
        out["runs"].append({"n_ctx": c, "chunks": chunks, "n_batch": b, "ppl": float(m[1]),
                            "ppl_err": float(m[2]), "running": chunks_ppl})  # fmt: skip
        print(f"c={c} chunks={chunks} b={b}: {m[1]} +/- {m[2]}", file=sys.stderr)
    return out


def record_bench(model: Path) -> dict:
    """llama-bench's output formats (timings vary; the tests compare fields and layout)."""
    out: dict = {"model": model.name}
    for fmt in ("json", "csv", "md"):
        cmd = [str(BIN / "llama-bench"), "-m", str(model), "-p", "16", "-n", "4", "-r", "2",
               "-t", "1", "-o", fmt]  # fmt: skip
        env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
        out[fmt] = subprocess.run(cmd, capture_output=True, env=env, check=True).stdout.decode()
    return out


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else MODEL
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fn in (("completions.json", record_completions), ("cli_completions.json",
                     record_cli), ("perplexity.json", record_perplexity),
                     ("llama_bench.json", record_bench)):  # fmt: skip
        data = fn(model)
        (OUT / name).write_text(
            json.dumps(data, indent=1, ensure_ascii=False, default=float) + "\n"
        )


if __name__ == "__main__":
    main()
