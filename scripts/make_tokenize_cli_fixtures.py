"""Record ``llama-tokenize`` runs for the ``llamacpy tokenize`` tests (dev-only).

Usage::

    python scripts/make_tokenize_cli_fixtures.py BUILD_BIN_DIR SMOLLM2.gguf GEMMA3.gguf

Writes ``tests/fixtures/tokenizer/cli.json``: for each run the model name, the arguments
(``{FILE}`` stands for a temporary file holding ``file`` bytes), standard input, and
llama-tokenize's exit code and standard output.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/tokenizer/cli.json"

RUNS: list[dict] = [
    {"args": ["-p", "Hello world"]},
    {"args": ["-p", "Hello world", "--ids"]},
    {"args": ["-p", "Hello world", "--show-count"]},
    {"args": ["-p", "Hello world", "--ids", "--show-count", "--no-bos"]},
    {"args": ["-p", "<|im_start|>user\\nHi<|im_end|>"]},
    {"args": ["-p", "<|im_start|>user\\nHi<|im_end|>", "--no-parse-special", "--ids"]},
    {"args": ["-p", "<start_of_turn>user\\nHi<end_of_turn>", "--ids"]},
    {"args": ["-p", "<start_of_turn>user<end_of_turn>", "--no-parse-special"]},
    {"args": ["-p", "tab\\there \\x41\\x4a \\q \\\\ \\' \\\" \\x4 end\\"]},
    {"args": ["-p", "tab\\there \\x41", "--no-escape", "--ids"]},
    {"args": ["-p", "emoji 😀👩🏾‍💻 and ½ café"]},
    {"args": ["-p", "bytes \\xff\\xfe\\x00 nul", "--show-count"]},
    {"args": ["-p", ""], "note": "empty prompt"},
    {"args": ["-f", "{FILE}"], "file": "line one\nline two\n\n  indented\ttab\n"},
    {"args": ["-f", "{FILE}", "--ids"], "file": "escape \\n in file\n"},
    {"args": ["-f", "{FILE}", "--ids", "--no-escape"], "file": "escape \\n in file\n"},
    {"args": ["--stdin", "--ids", "--show-count"], "stdin": "from stdin\n<|im_end|>\n"},
    {"args": ["--stdin", "-p", "ignored"], "stdin": "stdin wins"},
    {"args": ["-f", "{FILE}", "-p", "ignored", "--ids"], "file": "file wins"},
    {"args": ["--ids"], "note": "no input"},
]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    bindir, smol, gemma = (Path(a) for a in argv)
    exe = bindir / "llama-tokenize"
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, path in (("smollm2", smol), ("gemma3", gemma)):
            for run in RUNS:
                fpath = Path(tmp) / "input.txt"
                args = list(run["args"])
                if "file" in run:
                    fpath.write_bytes(run["file"].encode())
                    args = [str(fpath) if a == "{FILE}" else a for a in args]
                proc = subprocess.run(
                    [str(exe), "-m", str(path), "--log-disable", *args],
                    input=run.get("stdin", "").encode(),
                    capture_output=True,
                    timeout=120,
                )
                out = proc.stdout
                try:
                    stdout = {"text": out.decode("utf-8")}
                except UnicodeDecodeError:
                    stdout = {"hex": out.hex()}
                records.append(
                    {
                        "model": model,
                        "args": run["args"],
                        "file": run.get("file"),
                        "stdin": run.get("stdin"),
                        "rc": proc.returncode,
                        "stdout": stdout,
                    }
                )
    OUT.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT} ({len(records)} runs)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
