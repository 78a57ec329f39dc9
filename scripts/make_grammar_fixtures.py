"""Record ``llama-completion -no-cnv`` with grammars for ``llamacpy run`` (dev-only; needs the
oracle's llama.cpp build).

    python scripts/make_grammar_fixtures.py

Writes tests/fixtures/grammar/cli_grammar.json: for SmolLM2-135M and Gemma-3-270M, llama.cpp's
json, list and arithmetic grammars (tests/fixtures/grammar/gbnf/, copied from its grammars/,
given with --grammar-file) and three JSON schemas (tests/fixtures/grammar/schemas/, given
with -j SCHEMA) at two sampler settings each; the text llama.cpp printed with the same seed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "grammar"
BIN = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
MODELS = Path.home() / ".cache/llamacpy/models"
N_CTX, N_PREDICT = 256, 48

MODEL_FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
               "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}  # fmt: skip
GRAMMARS = [
    ("json.gbnf", "A JSON object describing a cat:"),
    ("list.gbnf", "My shopping list:\n"),
    ("arithmetic.gbnf", "Compute 12 times 7 plus 3:"),
]
SCHEMAS = [
    ("person.json", "A JSON object describing a person:"),
    ("colors.json", "Favourite colours as a JSON list:"),
    ("order.json", "A purchase order in JSON:"),
]
SETTINGS = [
    ("s42", ["-s", "42"]),
    ("hot", ["-s", "7", "--temp", "1.3", "--top-k", "0", "--top-p", "0.97", "--min-p", "0.01"]),
]


def _constraints() -> list[tuple[str, str, list[str], str]]:
    """(name, fixture key, llama-completion flags, prompt) for each grammar and schema."""
    out = []
    for grammar, prompt in GRAMMARS:
        out.append((grammar.removesuffix(".gbnf"), "grammar",
                    ["--grammar-file", str(OUT / "gbnf" / grammar)], prompt))  # fmt: skip
    for schema, prompt in SCHEMAS:
        text = (OUT / "schemas" / schema).read_text().strip()
        out.append(("schema-" + schema.removesuffix(".json"), "schema", ["-j", text], prompt))
    return out


def record() -> dict:
    out: dict = {"n_ctx": N_CTX, "n_predict": N_PREDICT, "cases": []}
    env = {**os.environ, "LD_LIBRARY_PATH": str(BIN)}
    for model, fname in MODEL_FILES.items():
        for what, key, constraint, prompt in _constraints():
            for setting, flags in SETTINGS:
                cmd = [str(BIN / "llama-completion"), "-m", str(MODELS / fname), "-p", prompt,
                       "-n", str(N_PREDICT), "-c", str(N_CTX), "-t", "1", "-no-cnv",
                       "--no-display-prompt", *constraint, *flags]  # fmt: skip
                proc = subprocess.run(cmd, capture_output=True, env=env, check=True)
                text = proc.stdout.decode("utf-8", "replace")
                end = re.search(r" \[end of text\]\n*\Z", text)  # an EOG token ended it
                text = text[: end.start()] if end else text.removesuffix("\n\n")
                name = f"{model}-{what}-{setting}"
                file = Path(constraint[-1]).name if key == "grammar" else what[7:] + ".json"
                out["cases"].append({"name": name, "model": model, key: file,
                                     "prompt": prompt, "flags": flags, "text": text})  # fmt: skip
                print(f"{name}: {text!r}", file=sys.stderr)
    return out


if __name__ == "__main__":
    data = record()
    (OUT / "cli_grammar.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
