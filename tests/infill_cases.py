"""The ``/infill`` cases shared by ``scripts/make_infill_fixtures.py`` (llama-server's
answers) and ``tests/test_server_infill.py`` (ours), and the model they run on."""

from __future__ import annotations

from pathlib import Path

# SmolLM2 control tokens given fill-in-the-middle roles (the file declares them as
# qwen2.5-coder's does): <issue_start> <issue_comment> <issue_closed> <reponame> <file_sep>
FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_rep": 4, "fim_sep": 5}
FLAGS = ["-c", "2048", "-b", "512", "-np", "1", "-t", "1"]

_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
_SUFFIX = "\n\nprint(fibonacci(10))\n"
_LONG = "".join(f"x{i} = {i} * {i}\n" for i in range(200))
CASES = [
    {"name": "plain", "body": {"input_prefix": _PREFIX, "input_suffix": _SUFFIX,
                               "n_predict": 12}},
    {"name": "with-prompt", "body": {"input_prefix": _PREFIX, "input_suffix": _SUFFIX,
                                     "prompt": "    if n < 2:", "n_predict": 12}},
    {"name": "extra-files", "body": {
        "input_prefix": "from util import square\n\ndef area(r):\n    return ",
        "input_suffix": "\n", "n_predict": 10,
        "input_extra": [{"filename": "util.py", "text": "def square(x):\n    return x * x\n"},
                        {"text": "PI = 3.14159\n"}]}},
    {"name": "long-prefix-and-suffix", "body": {"input_prefix": _LONG, "input_suffix": _LONG,
                                                "prompt": "y = ", "n_predict": 8}},
    {"name": "mixed-ids", "body": {"input_prefix": ["def add(a, b):", 198, "    return"],
                                   "input_suffix": [198], "n_predict": 8}},
    {"name": "no-suffix-text", "body": {"input_prefix": "# a list of colors\ncolors = [",
                                        "input_suffix": "", "n_predict": 10}},
    {"name": "bad-extra", "body": {"input_prefix": "a", "input_suffix": "b",
                                   "input_extra": [{"filename": "x"}]}},
    {"name": "spm", "spm": True, "body": {"input_prefix": _PREFIX, "input_suffix": _SUFFIX,
                                          "n_predict": 12}},
]  # fmt: skip
for _c in CASES:
    _c["body"]["temperature"] = 0


def fim_model(src: Path, out_dir: Path) -> Path:
    """A copy of ``src`` declaring :data:`FIM_IDS` as its fill-in-the-middle tokens."""
    from llamacpy.gguf.edit import set_metadata

    out = out_dir / "fim.gguf"
    set_metadata(src, out, [f"tokenizer.ggml.{k}_token_id=u32:{v}" for k, v in FIM_IDS.items()])
    return out
