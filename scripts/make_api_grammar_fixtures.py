"""Record llama-cpp-python's ``grammar=`` completions for the Python API (dev-only; needs
the oracle's llama-cpp-python).

    /root/oracle/py/bin/python scripts/make_api_grammar_fixtures.py

Writes tests/fixtures/grammar/api_grammar.json: SmolLM2-135M, a fresh ``Llama`` per case
(flash attention on, one thread), ``Llama(prompt, grammar=LlamaGrammar.from_string(G),
seed=S, ...)`` for llama.cpp's json, list and arithmetic grammars and for the GBNF our
converter writes for tests/fixtures/grammar/schemas/person.json (schemas/person.gbnf) (llama-cpp-python's own
``from_json_schema`` is a different converter); the completion text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from llama_cpp import Llama, LlamaGrammar

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "grammar"
MODEL = Path.home() / ".cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
N_CTX, MAX_TOKENS = 256, 40

GRAMMARS = [
    ("gbnf/json.gbnf", "A JSON object describing a cat:"),
    ("gbnf/list.gbnf", "My shopping list:\n"),
    ("gbnf/arithmetic.gbnf", "Compute 12 times 7 plus 3:"),
    ("schemas/person.gbnf", "A JSON object describing a person:"),
]
SETTINGS = [
    ("s42", {"seed": 42}),
    ("hot", {"seed": 7, "temperature": 1.3, "top_k": 0, "top_p": 0.97, "min_p": 0.01}),
    ("greedy", {"temperature": 0.0}),
]


def main() -> None:
    cases = []
    for grammar, prompt in GRAMMARS:
        text = (OUT / grammar).read_text()
        for setting, kw in SETTINGS:
            llm = Llama(str(MODEL), n_ctx=N_CTX, n_threads=1, n_threads_batch=1,
                        flash_attn=True, verbose=False)  # fmt: skip
            res = llm(prompt, max_tokens=MAX_TOKENS, grammar=LlamaGrammar.from_string(text), **kw)
            out = res["choices"][0]["text"]
            cases.append({"name": f"{Path(grammar).stem}-{setting}", "grammar": grammar,
                          "prompt": prompt, "kwargs": kw, "text": out,
                          "finish_reason": res["choices"][0]["finish_reason"]})  # fmt: skip
            print(f"{cases[-1]['name']}: {out!r}", file=sys.stderr)
    data = {"n_ctx": N_CTX, "max_tokens": MAX_TOKENS, "cases": cases}
    (OUT / "api_grammar.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
